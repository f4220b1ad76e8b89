"""Text from someone else (a bundle's member names, its manifest, a container's records) shown
on a terminal with its control and bidi characters escaped.

An ANSI escape in a tar member name can clear the screen or rewrite the line above; a bidi
override (U+202E) in a command makes `rm -rf ~ #` read as something harmless. Both are shown as
Python-style escapes (`\\x1b`, `\\u202e`), so what is printed is what the text holds.
"""

from __future__ import annotations

import re
import unicodedata

# C0 and C1 controls and DEL; the bidi embeddings, overrides, isolates and marks; other invisible
# format characters (zero-width joiners, BOM) are Unicode category Cf and caught below.
_SUSPECT = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every control, bidi and invisible format character escaped (newlines and tabs
    kept when `keep_newlines`, for multi-line messages the tool itself composed)."""

    def sub(match: re.Match[str]) -> str:
        char = match.group(0)
        if keep_newlines and char in "\n\t":
            return char
        return _escape(char)

    text = _SUSPECT.sub(sub, text)
    if any(unicodedata.category(c) == "Cf" for c in text):
        text = "".join(_escape(c) if unicodedata.category(c) == "Cf" else c for c in text)
    return text
