"""Release lists from pip's output: parsing, ordering, ranges and the cache (pip is faked)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from repro.core.cmd import CmdResult
from repro.core.errors import UsageError
from repro.matrix.versions import (
    VersionIndex,
    VersionQuery,
    order_versions,
    parse_pip_download_error,
    parse_pip_index,
    select_range,
)

PIP_INDEX = """WARNING: pip index is currently an experimental command.
deepspeed (0.19.8)
Available versions: 0.19.8, 0.19.7, 0.13.1, 0.13.0, 0.12.6, 0.3.1.dev1
  INSTALLED: 0.13.1
"""
PIP_DOWNLOAD = (
    "ERROR: Could not find a version that satisfies the requirement torch==0+x "
    "(from versions: 2.0.1, 2.1.0, 2.1.0+cpu, 2.2.0rc1, 2.2.0)\n"
    "ERROR: No matching distribution found for torch==0+x\n"
)


def test_parse_pip_index() -> None:
    assert parse_pip_index(PIP_INDEX) == ["0.19.8", "0.19.7", "0.13.1", "0.13.0", "0.12.6", "0.3.1.dev1"]
    assert parse_pip_index("nothing here") == []


def test_parse_pip_download_error() -> None:
    assert parse_pip_download_error(PIP_DOWNLOAD) == ["2.0.1", "2.1.0", "2.1.0+cpu", "2.2.0rc1", "2.2.0"]
    assert parse_pip_download_error("(from versions: none)") == []


def test_order_versions_sorts_numerically_and_drops_prereleases() -> None:
    raw = ["2.10.0", "2.9.1", "2.1.0+cpu", "2.1.0", "2.2.0rc1", "2.0.1", "nonsense", "0.3.1.dev1"]
    assert order_versions(raw) == ("2.0.1", "2.1.0", "2.9.1", "2.10.0")
    assert order_versions(raw, prereleases=True) == (
        "0.3.1.dev1",
        "2.0.1",
        "2.1.0",
        "2.2.0rc1",
        "2.9.1",
        "2.10.0",
    )


def test_select_range_inclusive_and_ordered_from_start() -> None:
    versions = ("2.0.1", "2.1.0", "2.1.1", "2.2.0", "2.3.0")
    assert select_range(versions, "2.1.0", "2.2.0") == ("2.1.0", "2.1.1", "2.2.0")
    assert select_range(versions, "2.2.0", "2.1.0") == ("2.2.0", "2.1.1", "2.1.0")


def test_select_range_keeps_named_ends_the_index_lacks() -> None:
    assert select_range(("2.1.0", "2.2.0"), "2.0.0", "2.1.5") == ("2.0.0", "2.1.0", "2.1.5")


@pytest.mark.parametrize("start,end", [("2.1.0", "2.1.0"), ("two", "2.1.0")])
def test_select_range_rejects_bad_ranges(start: str, end: str) -> None:
    with pytest.raises(UsageError):
        select_range(("2.1.0",), start, end)


class FakePip:
    def __init__(self, outputs: Sequence[tuple[int, str, str]]) -> None:
        self.outputs = list(outputs)
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], **kwargs: Any) -> CmdResult:
        assert kwargs.get("capture") is True
        self.calls.append(list(argv))
        code, out, err = self.outputs.pop(0)
        return CmdResult(tuple(argv), code, out, err)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def index(tmp_path: Path, pip: FakePip, clock: Clock | None = None) -> VersionIndex:
    return VersionIndex(tmp_path / "cache", runner=pip, python_exe="py", clock=clock or Clock())


def test_index_asks_pip_index_with_pre_and_target(tmp_path: Path) -> None:
    pip = FakePip([(0, PIP_INDEX, "")])
    found = index(tmp_path, pip).available(VersionQuery("torch", "https://example/whl/rocm5.6", "3.8", True))
    assert found == ("0.12.6", "0.13.0", "0.13.1", "0.19.7", "0.19.8")
    argv = pip.calls[0]
    assert argv[:5] == ["py", "-m", "pip", "index", "versions"] and "--pre" in argv
    assert argv[argv.index("--python-version") + 1] == "3.8"
    assert argv[argv.index("--index-url") + 1] == "https://example/whl/rocm5.6"
    assert "--only-binary" in argv


def test_sdist_only_packages_are_not_restricted_to_wheels(tmp_path: Path) -> None:
    pip = FakePip([(0, PIP_INDEX, "")])
    index(tmp_path, pip).available(VersionQuery("deepspeed", None, "3.11"))
    assert "--only-binary" not in pip.calls[0] and "--index-url" not in pip.calls[0]


def test_falls_back_to_the_download_error_listing(tmp_path: Path) -> None:
    pip = FakePip([(1, "", 'ERROR: unknown command "index"'), (1, "", PIP_DOWNLOAD)])
    found = index(tmp_path, pip).available(VersionQuery("torch"))
    assert found == ("2.0.1", "2.1.0", "2.2.0")
    assert pip.calls[1][3] == "download" and pip.calls[1][-1].startswith("torch==")


def test_cache_is_used_until_it_expires(tmp_path: Path) -> None:
    clock = Clock()
    pip = FakePip([(0, PIP_INDEX, ""), (0, PIP_INDEX.replace("0.19.8, ", ""), "")])
    idx = index(tmp_path, pip, clock)
    query = VersionQuery("deepspeed")
    first = idx.available(query)
    assert idx.available(query, prereleases=True)[0] == "0.3.1.dev1"  # filtering happens after the cache
    assert len(pip.calls) == 1
    clock.now += 2 * 24 * 3600
    assert idx.available(query) == first[:-1]
    assert len(pip.calls) == 2


def test_refresh_bypasses_the_cache(tmp_path: Path) -> None:
    pip = FakePip([(0, PIP_INDEX, ""), (0, PIP_INDEX, "")])
    idx = index(tmp_path, pip)
    idx.available(VersionQuery("deepspeed"))
    idx.available(VersionQuery("deepspeed"), refresh=True)
    assert len(pip.calls) == 2


def test_cache_is_per_index_and_python(tmp_path: Path) -> None:
    pip = FakePip([(0, PIP_INDEX, ""), (0, PIP_INDEX, "")])
    idx = index(tmp_path, pip)
    idx.available(VersionQuery("torch", None, "3.11", True))
    idx.available(VersionQuery("torch", "https://example/rocm", "3.11", True))
    assert len(pip.calls) == 2


def test_no_versions_is_an_actionable_error(tmp_path: Path) -> None:
    pip = FakePip([(1, "", "network down"), (1, "", "network down")])
    with pytest.raises(UsageError) as info:
        index(tmp_path, pip).available(VersionQuery("torch"))
    assert "VERSIONS=" in info.value.fix
