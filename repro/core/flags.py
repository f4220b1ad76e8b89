"""Yes/no values given as text (`make repro RESUME=1`: make hands its variables to the recipe's
environment). Parsed strictly: `RESUME=false` once meant "resume", since any text but "" and "0"
did; a value that is neither a yes nor a no is refused, not guessed."""

from __future__ import annotations

from collections.abc import Mapping

from repro.core.errors import UsageError

YES = ("1", "true", "yes", "on")
NO = ("0", "false", "no", "off", "")


def parse_bool(name: str, text: str) -> bool:
    """`text` as yes (1/true/yes/on) or no (0/false/no/off/empty), any case; UsageError else."""
    word = text.strip().lower()
    if word in YES:
        return True
    if word in NO:
        return False
    raise UsageError(
        f"{name}= is neither yes nor no",
        why=f"{name} takes {'/'.join(YES)} for yes, {'/'.join(w for w in NO if w)} or empty for no",
        fix=f"give {name}=1 or {name}=0",
    )


def env_bool(name: str, environ: Mapping[str, str]) -> bool:
    return parse_bool(name, environ.get(name, ""))
