"""What a PNG can tell a reader, apart from its pixels.

The bundle's leak check reads every file as text. A PNG's pixel data is zlib-compressed bytes:
read as text, it now and then holds `key=...` or `pw:...` by chance, and a bundle was refused for
a plot (CI, stop 50). The pixels cannot spell out a secret; what can is the PNG's metadata chunks
(tEXt, zTXt, iTXt: matplotlib writes "Software" there; a job could write a path or a token). So
a PNG is checked by those chunks, and copied without its text chunks (a copy keeps every pixel).
A file that only starts like a PNG but does not parse as one is read whole, as before.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

SIGNATURE = b"\x89PNG\r\n\x1a\n"
PIXELS = b"IDAT"
# Chunks that carry words: dropped from copies, their (decompressed) text checked.
TEXT_CHUNKS = frozenset({b"tEXt", b"zTXt", b"iTXt"})
# A compressed text chunk is inflated only this far: enough for any metadata, never a bomb.
MAX_INFLATED = 1 << 20


class NotPNG(ValueError):
    """The bytes are not a well-formed PNG (the caller reads them whole instead)."""


def is_png(data: bytes) -> bool:
    return data.startswith(SIGNATURE)


def chunks(data: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
    """(type, payload, the chunk's raw bytes) of each chunk, up to IEND; NotPNG when the bytes
    do not parse (a bad length or CRC, no IEND, bytes after it)."""
    if not is_png(data):
        raise NotPNG("no PNG signature")
    pos = len(SIGNATURE)
    while pos + 12 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        end = pos + 12 + length
        if end > len(data):
            raise NotPNG("a chunk runs past the end")
        payload = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[end - 4 : end])
        if zlib.crc32(kind + payload) != crc:
            raise NotPNG(f"bad CRC in a {kind!r} chunk")
        yield kind, payload, data[pos:end]
        pos = end
        if kind == b"IEND":
            if pos != len(data):
                raise NotPNG("bytes after IEND")
            return
    raise NotPNG("no IEND chunk")


def readable_text(data: bytes) -> str:
    """Everything in the PNG but its pixel data, as text: each chunk's bytes (latin-1), and the
    inflated text of compressed text chunks. NotPNG when it is not one."""
    parts: list[str] = []
    for kind, payload, _raw in chunks(data):
        if kind == PIXELS:
            continue
        parts.append(payload.decode("latin-1"))
        inflated = _inflated_text(kind, payload)
        if inflated is not None:
            parts.append(inflated)
    return "\n".join(parts)


def without_text(data: bytes) -> bytes:
    """The PNG with its text chunks dropped, every other chunk byte for byte. NotPNG when it is
    not one."""
    kept = [raw for kind, _payload, raw in chunks(data) if kind not in TEXT_CHUNKS]
    return SIGNATURE + b"".join(kept)


def _inflated_text(kind: bytes, payload: bytes) -> str | None:
    """The text of a zTXt, or of an iTXt whose compression flag is set; else None."""
    _key, _, rest = payload.partition(b"\0")
    if kind == b"zTXt" and rest:
        return _inflate(rest[1:]).decode("latin-1")
    if kind == b"iTXt" and len(rest) >= 2 and rest[0] == 1:
        # flag, method, language\0, translated keyword\0, text
        _lang, _, tail = rest[2:].partition(b"\0")
        _translated, _, text = tail.partition(b"\0")
        return _inflate(text).decode("utf-8", errors="replace")
    return None


def _inflate(data: bytes) -> bytes:
    try:
        inflater = zlib.decompressobj()
        return inflater.decompress(data, MAX_INFLATED)
    except zlib.error as exc:
        raise NotPNG(f"a compressed text chunk does not inflate: {exc}") from exc
