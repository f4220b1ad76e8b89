"""Issue #45 (hardening, round 4): the failed cases of `make pr`, `pr-verify` and the range.

Each test here failed before its fix: a failed `make pr` left COMMIT_MSG.txt that made the rerun
refuse OUT; an OUT inside a linked work tree's or a separate git folder was accepted; a malformed
pr.json gave a traceback; a rerun after an interrupted verification refused its own probe folder;
RANGE_TORCH took any word and duplicates; a transient install failure stayed in the probe cache.
Real git on the small DeepSpeed-shaped repository of tests/fixtures/ds_pr_git.py; the probes and
surveys are the stand-ins of tests/fixtures/pr_verify_standins.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from repro.bisect.driver import Folder
from repro.cli import main as cli
from repro.core.errors import UsageError
from repro.upstream.pr import affected_range as pr_range
from repro.upstream.pr import verify_run as pr_verify_run
from repro.upstream.pr.branch import PrRequest, make_pr
from repro.upstream.pr.verify import CellCache, ProbeCall, Verification
from tests.fixtures.ds_git import git
from tests.fixtures.ds_pr_git import FakeDeepSpeedPr
from tests.fixtures.pr_verify_standins import (
    BUG,
    CLEAN,
    STACKS,
    StandInProbe,
    StandInSurvey,
    ds,  # noqa: F401 - a fixture: a DeepSpeed-shaped repository (probe caches the test's own)
    made,  # noqa: F401 - a fixture: the branch `make pr` made in it, with its pr.json
    regression_stand_in,
)

BRANCH = "mics-coalesced-wait"


# -- 1. a failed `make pr` cleans what it wrote ------------------------------------------------------
def test_a_failed_commit_leaves_out_as_it_was_so_the_rerun_takes_it(
    ds: FakeDeepSpeedPr,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The commit step fails after COMMIT_MSG.txt was written (here: the check that the commit holds
    the fix's bytes; a clone's own signing config no longer applies, repro/core/safe_git.py). Once
    the cause is gone, the same command (same OUT) must work."""
    from repro.upstream.pr import blobs as pr_blobs

    def refuse(*args: object, **kwargs: object) -> None:
        raise UsageError("git commit failed: the commit does not hold the fix's bytes")

    out = tmp_path / "out"
    with monkeypatch.context() as patched:
        patched.setattr(pr_blobs, "check_committed", refuse)
        with pytest.raises(UsageError, match="git commit failed"):
            make_pr(PrRequest(ds_repo=str(ds.path), out=out))
    assert not out.exists() or list(out.iterdir()) == []

    make_pr(PrRequest(ds_repo=str(ds.path), out=out))
    assert (out / "pr.json").is_file() and (out / "COMMIT_MSG.txt").is_file()


@pytest.mark.parametrize("stop", [UsageError("update-ref refused"), KeyboardInterrupt()])
def test_a_failure_after_format_patch_removes_the_patch_and_message(
    ds: FakeDeepSpeedPr,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stop: BaseException,
) -> None:
    from repro.upstream.pr.git import Checkout

    def fail(self: Checkout, branch: str, sha: str) -> None:
        raise stop

    out = tmp_path / "given-empty"
    out.mkdir()  # given empty: stays, empty
    with monkeypatch.context() as patched:
        patched.setattr(Checkout, "create_branch", fail)
        with pytest.raises(type(stop)):
            make_pr(PrRequest(ds_repo=str(ds.path), out=out))
    assert out.is_dir() and list(out.iterdir()) == []
    make_pr(PrRequest(ds_repo=str(ds.path), out=out))
    assert git(ds.path, "rev-parse", "--verify", "--quiet", BRANCH)


# -- 2. OUT inside a git folder of the checkout ----------------------------------------------------
def test_refuses_out_inside_a_linked_work_trees_git_folder(ds: FakeDeepSpeedPr, tmp_path: Path) -> None:  # noqa: F811
    """DS_REPO is a linked work tree: its `.git` is a file naming <main>/.git/worktrees/<name>, which
    lies outside DS_REPO. OUT there, or in the shared <main>/.git, is refused like OUT in DS_REPO."""
    linked = tmp_path / "linked"
    git(ds.path, "worktree", "add", "--quiet", "--detach", str(linked), ds.master)
    assert (linked / ".git").is_file()
    gitdir = Path(git(linked, "rev-parse", "--absolute-git-dir"))
    for out in (gitdir / "pr-out", ds.path / ".git" / "pr-out"):
        with pytest.raises(UsageError, match="git folder"):
            make_pr(PrRequest(ds_repo=str(linked), out=out))
        assert not out.exists()
    assert BRANCH not in git(ds.path, "branch", "--list")


def test_refuses_out_inside_a_separate_git_folder(ds: FakeDeepSpeedPr, tmp_path: Path) -> None:  # noqa: F811
    """`git clone --separate-git-dir`: the clone's `.git` is a file pointing at a folder elsewhere."""
    store = tmp_path / "store.git"
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "--quiet", "--separate-git-dir", str(store), str(ds.path), str(clone)], check=True
    )
    git(clone, "config", "user.name", "Pat Contributor")
    git(clone, "config", "user.email", "pat@example.invalid")
    with pytest.raises(UsageError, match="git folder"):
        make_pr(PrRequest(ds_repo=str(clone), out=store / "pr-out"))
    assert not (store / "pr-out").exists()


# -- 3. a malformed pr.json is a clear error -------------------------------------------------------
def _pr_json_variants(good: dict[str, Any]) -> dict[str, str]:
    return {
        "not JSON": '{"ref": "master",',
        "not an object": json.dumps([good]),
        "a missing key": json.dumps({k: v for k, v in good.items() if k != "commit"}),
        "a wrong type": json.dumps({**good, "files": 5}),
        "a number for a text": json.dumps({**good, "ref_sha": 7}),
        "not a commit": json.dumps({**good, "commit": "--output=/tmp/x"}),
        "a bad caller": json.dumps({**good, "callers": [{"path": "x"}]}),
        "another format": json.dumps({**good, "format": 99}),
        "a flag for the format": json.dumps({**good, "format": True}),
    }


@pytest.mark.parametrize(
    "variant",
    [
        "not JSON",
        "not an object",
        "a missing key",
        "a wrong type",
        "a number for a text",
        "not a commit",
        "a bad caller",
        "another format",
        "a flag for the format",
    ],
)
def test_a_malformed_pr_json_is_a_usage_error_not_a_traceback(
    made: tuple[Path, dict[str, Any]],  # noqa: F811
    ds: FakeDeepSpeedPr,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    variant: str,
) -> None:
    out, good = made
    (out / "pr.json").write_text(_pr_json_variants(good)[variant])
    capsys.readouterr()
    code = cli.main(["pr-verify", "--pr", str(out), "--ds-repo", str(ds.path)])
    err = capsys.readouterr().err
    assert code == UsageError.exit_code
    assert "pr.json" in err and "what to do:" in err and "Traceback" not in err
    assert not (out / "verify.json").exists()


def test_the_pr_json_make_pr_writes_carries_its_format(made: tuple[Path, dict[str, Any]]) -> None:  # noqa: F811
    _, good = made
    assert good["format"] == 1


# -- 4. a rerun after an interrupted verification resumes -----------------------------------------
class FrontDoorLikeProbe(StandInProbe):
    """The stand-in probe, with the real probe command's rule for its OUT (repro.bisect.driver's
    Folder.open: refused when it holds results.json); `stop_at` interrupts that call the way a
    Ctrl-C does, after the probe began its folder."""

    def __init__(self, pr: dict[str, Any], stop_at: int | None = None) -> None:
        super().__init__(pr)
        self.stop_at, self.began = stop_at, []  # type: ignore[var-annotated]

    def __call__(self, call: ProbeCall, ds_repo: str) -> dict[str, Any]:
        Folder(call.out.parent, call.out).open("probe", "probe.json")  # UsageError like the command
        (call.out / "results.json").write_text("{}\n")
        self.began.append(call)
        if len(self.began) == self.stop_at:
            raise KeyboardInterrupt
        return super().__call__(call, ds_repo)


def test_a_rerun_after_an_interrupted_verification_resumes(
    made: tuple[Path, dict[str, Any]],  # noqa: F811
    ds: FakeDeepSpeedPr,  # noqa: F811
) -> None:
    out, pr = made
    first = FrontDoorLikeProbe(pr, stop_at=3)
    with pytest.raises(KeyboardInterrupt):
        Verification(pr, STACKS, out, str(ds.path), probe=first, regression=regression_stand_in).run()
    kept = json.loads((out / "verify.json").read_text())
    assert len(kept["checks"]) == 1 and not kept["complete"]

    again = FrontDoorLikeProbe(pr)
    data = Verification(pr, STACKS, out, str(ds.path), probe=again, regression=regression_stand_in).run()
    assert data["complete"] and data["verified"] is True
    assert len(again.calls) == 14 - 2  # the two probes of the first check came from the cache
    # the interrupted probe ran again, in a folder of its own beside the one it left
    interrupted = first.began[-1].out
    assert (interrupted / "results.json").is_file()
    assert [c.out.name for c in again.calls if c.out.name.startswith(interrupted.name)] == [
        f"{interrupted.name}-2"
    ]


# -- 5. RANGE_TORCH is checked and de-duplicated ---------------------------------------------------
@pytest.mark.parametrize("given", ["abc", "2.1.0,abc", "2.1.0+cpu", "9.9.9", "2.1.0rc1", ","])
def test_range_torch_that_no_env_can_use_is_refused(given: str) -> None:
    from repro.matrix.schema import load_matrix

    with pytest.raises(UsageError, match="RANGE_TORCH"):
        pr_verify_run.columns(load_matrix(), given)


def test_range_torch_duplicates_become_one_column_with_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    from repro.matrix.schema import load_matrix

    matrix = load_matrix()
    newest = matrix.get(pr_verify_run.NEWEST_ENV).torch
    got = pr_verify_run.columns(matrix, f"2.1.0, 2.1.0,2.1,{newest}")
    assert got == [pr_range.Column("2.1.0", "cpu"), pr_range.Column(newest, "cpu-latest")]
    assert "2.1.0" in capsys.readouterr().err


# -- 6. only results are cached: an install failure is tried again ---------------------------------
NETWORK = {
    "outcome": "env-error",
    "signature": "none",
    "reason": "BuildError: venv for cpu+ds0.9.2: pip step deepspeed failed (exit 1) (ERROR: Could not "
    "install packages due to an OSError: HTTPSConnectionPool(host='pypi.org', port=443): Max retries "
    "exceeded)",
    "seconds": 3.0,
}


class FlakySurvey(StandInSurvey):
    """The first survey of release 0.9.2 fails to install it (the network); then it runs."""

    failed = False

    def row(self, torch: str, patch: str, version: str) -> dict[str, Any]:
        if version == "0.9.2" and not self.failed:
            self.failed = True
            return NETWORK
        return super().row(torch, patch, version)


def test_an_install_failure_is_not_cached_and_is_retried(
    made: tuple[Path, dict[str, Any]],  # noqa: F811
    ds: FakeDeepSpeedPr,  # noqa: F811
    tmp_path: Path,
) -> None:
    out, pr = made
    read, _ = pr_verify_run.tag_reader(str(ds.path))
    columns = [pr_range.Column("2.1.0", "cpu")]
    cache = CellCache("pr-range", tmp_path / "range-cache")
    survey, probe = FlakySurvey(), StandInProbe(pr)

    def affected() -> dict[str, Any]:
        return pr_range.AffectedRange(
            pr, columns, ["0.9.1", "0.9.2"], out, str(ds.path), read, None,
            cache=cache, survey=survey, probe=probe,
        ).run()  # fmt: skip

    first = affected()
    assert first["rows"][1]["cells"]["2.1.0"]["stock"]["outcome"] == "env-error"
    before = len(probe.calls)
    second = affected()
    cell = second["rows"][1]["cells"]["2.1.0"]
    assert cell["stock"]["outcome"] == "clean" and cell["fixed"]["outcome"] == "clean"
    # only 0.9.2 ran again (one release: a probe, not a survey), stock, then fixed as stock ran
    assert [(c.deepspeed, c.patch) for c in probe.calls[before:]] == [
        ("0.9.2", "stock"),
        ("0.9.2", "fixed"),
    ]
    assert affected()["probes_run"] == 0  # results are cached


def test_a_failure_cached_by_an_earlier_version_is_retried(tmp_path: Path) -> None:
    cache = CellCache("pr-range", tmp_path / "cache")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "k.json").write_text(json.dumps(NETWORK))
    assert cache.get("k") is None
    cache.put("k", NETWORK)
    assert cache.get("k") is None


@pytest.mark.parametrize(
    ("probe", "kept"),
    [
        (BUG, True),
        (CLEAN, True),
        ({"outcome": "crashed", "signature": "crash", "reason": "RuntimeError: x"}, True),
        ({"outcome": "unsupported", "signature": "none", "reason": "no MiCS"}, True),
        # DeepSpeed installed and was imported: a result about this release and torch
        ({"outcome": "env-error", "signature": "none", "reason": "the commit does not import: X"}, True),
        ({"outcome": "env-error", "signature": "none", "reason": "environment: ImportError: no log"}, True),
        (NETWORK, False),
        ({"outcome": "env-error", "signature": "none", "reason": "the suite produced no record"}, False),
        ({"outcome": "interrupted", "signature": "none", "reason": "Ctrl-C"}, False),
        ({"outcome": "", "signature": "", "reason": ""}, False),
    ],
)
def test_which_probes_are_cached(tmp_path: Path, probe: dict[str, Any], kept: bool) -> None:
    cache = CellCache("pr-range", tmp_path / "cache")
    cache.put("k", probe)
    assert (cache.get("k") is not None) is kept
