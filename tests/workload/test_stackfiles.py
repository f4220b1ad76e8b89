"""A faulthandler dump read while it is still being written is waited for until it settles."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from repro.workload import stackfiles

pytestmark = pytest.mark.unit


def test_a_dump_still_being_written_is_read_once_it_stopped_growing(tmp_path: Path) -> None:
    path = tmp_path / "rank0.stack"
    path.write_text("Thread 0x00007f (most recent call first):\n")  # the first write of a dump
    frames = '  File "<string>", line 9 in blocked_in_collective\n  File "<string>", line 12 in <module>\n'

    def finish() -> None:
        with path.open("a") as fh:
            fh.write(frames)

    writer = threading.Timer(0.05, finish)  # lands between two reads a poll apart
    writer.start()
    got = stackfiles.read_settled({"0": str(path)}, wait_s=5.0, poll_s=0.2)
    writer.join()
    assert "blocked_in_collective" in got["0"], got


def test_an_empty_or_missing_dump_is_given_up_on_after_the_wait(tmp_path: Path) -> None:
    (tmp_path / "empty.stack").write_text("")
    got = stackfiles.read_settled(
        {"a": str(tmp_path / "empty.stack"), "b": str(tmp_path / "missing.stack")}, wait_s=0.3, poll_s=0.1
    )
    assert got == {"a": "", "b": ""}
