"""Issue #32 item 9: DS_REPO is a repository, never a git option or a command.

`DS_REPO='--upload-pack=...'` once reached `git clone` as an option (no `--`), and a value git
could not use was reported as a network failure. Now the value is checked first (a folder here,
or an https/ssh/git/file URL, or user@host:path) and the error says what is wrong with it; git
gets `--` before the repository.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from repro.bisect import commits
from repro.bisect.commits import DsRepo
from repro.core import cmd
from repro.core.errors import UsageError
from tests.fixtures.ds_git import make_fake_deepspeed


class Recorder:
    """Stands in for repro.core.cmd.run: records each argv, answers as git would fail."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[Any], **_: Any) -> cmd.CmdResult:
        self.calls.append([str(a) for a in argv])
        return cmd.CmdResult(tuple(map(str, argv)), 128, "", "fatal: could not read from remote repository")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ("--upload-pack=touch /tmp/pwned-by-ds-repo;://x", "starts with '-'"),
        ("-u touch /tmp/pwned;://x", "starts with '-'"),
        ("ext::sh -c touch% /tmp/pwned", "transport helper"),
        ("http://example.invalid/DeepSpeed.git", "http:// URL"),
        ("ftp://example.invalid/DeepSpeed.git", "ftp:// URL"),
        ("ssh://-oProxyCommand=touch%20/tmp/pwned/x", "no valid host"),
        ("https:///DeepSpeed", "no valid host"),
        ("git@-oProxyCommand=x:DeepSpeed", "not a valid ssh address"),
        ("", "empty"),
    ],
)
def test_values_git_would_misread_are_refused_before_git_runs(value: str, what: str) -> None:
    runner = Recorder()
    with pytest.raises(UsageError, match=what) as err:
        DsRepo(value, runner=runner).sync()
    assert err.value.exit_code == 2
    assert runner.calls == []  # git never saw it
    assert "network" not in err.value.render()


def test_a_missing_folder_says_so(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such folder") as err:
        DsRepo(str(tmp_path / "DeepSpeed")).sync()
    assert "network" not in err.value.render()


@pytest.mark.parametrize(
    "value",
    [
        "https://github.com/deepspeedai/DeepSpeed",
        "ssh://git@github.com/deepspeedai/DeepSpeed.git",
        "git://example.invalid/DeepSpeed.git",
        "file:///srv/mirrors/DeepSpeed.git",
        "git@github.com:deepspeedai/DeepSpeed.git",
        "github.com:deepspeedai/DeepSpeed.git",
    ],
)
def test_urls_reach_git_clone_after_a_double_dash(value: str) -> None:
    assert commits.check_source(value) == value
    runner = Recorder()
    with pytest.raises(UsageError, match="cannot be cloned") as err:
        DsRepo(value, runner=runner).sync()
    clone = runner.calls[0]
    assert clone[:2] == ["git", "clone"]
    assert clone.index("--") == clone.index(value) - 1  # the repository comes after `--`
    # git's own words, not a guess about the network
    assert "could not read from remote repository" in err.value.why


def test_a_local_checkout_is_cloned_after_a_double_dash(tmp_path: Path, real_subprocess: None) -> None:
    ds = make_fake_deepspeed(tmp_path)
    calls: list[list[str]] = []

    def spy(argv: Sequence[Any], **kw: Any) -> cmd.CmdResult:
        calls.append([str(a) for a in argv])
        return cmd.run(argv, **kw)

    repo = DsRepo(str(ds.path), runner=spy)
    repo.sync()
    assert calls[0][:6] == ["git", "clone", "--mirror", "--quiet", "--", str(ds.path)]
    assert repo.resolve("v0.3.0") == ds.shas["v0.3.0"]


def test_a_folder_named_like_an_option_is_taken_by_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_subprocess: None
) -> None:
    # ./--mirror-of-ds is a folder; written with ./ it is a path, and git gets it as one
    ds = make_fake_deepspeed(tmp_path)
    odd = tmp_path / "--mirror-of-ds"
    ds.path.rename(odd)
    monkeypatch.chdir(tmp_path)
    repo = DsRepo("./--mirror-of-ds")
    repo.sync()
    assert repo.resolve("v0.2.0") == ds.shas["v0.2.0"]
