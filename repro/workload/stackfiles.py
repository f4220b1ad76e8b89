"""Reading the stacks faulthandler writes on SIGUSR1 (our ranks, a user's hooked processes).

faulthandler writes a dump in many small writes, so a file read while the process is still
writing holds only its first lines (a thread header, no frames). A dump is taken as complete once
it is non-empty and unchanged between two reads a poll apart, or when the wait runs out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

POLL_S = 0.25


def read_settled(paths: Mapping[str, str], wait_s: float, poll_s: float = POLL_S) -> dict[str, str]:
    """name -> the text of its file, once every file is non-empty and stopped growing (or after
    `wait_s`, what there is then; "" for a file that cannot be read)."""
    deadline = time.monotonic() + wait_s
    previous: dict[str, str] | None = None
    while True:
        texts = {name: read_text(path) for name, path in paths.items()}
        settled = texts == previous and all(texts.values())
        if settled or time.monotonic() >= deadline:
            return texts
        previous = texts
        time.sleep(poll_s)


def read_text(path: str) -> str:
    """The file's text, or "" when it cannot be read (not yet written, removed)."""
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""
