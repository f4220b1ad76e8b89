"""Issue #30 (first slice): `make pr` makes the fix a branch of a local DeepSpeed checkout.

Real git on a small DeepSpeed-shaped repository the test makes (tests/fixtures/ds_pr_git.py): the
branch holds the fix as `repro.workload.fix` splices it and the regression test under tests/unit/,
the format-patch file and PR_DESCRIPTION.md are written, and the checkout's own work tree, HEAD,
refs and work-tree list are as they were. Every refusal is checked for its error and exit code,
and for leaving no branch behind.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from repro.cli import main as cli
from repro.core.errors import UsageError
from repro.upstream.pr import fix as pr_fix
from repro.upstream.pr.branch import PrRequest, make_pr
from repro.workload import fix
from tests.fixtures.ds_git import git, other_repository
from tests.fixtures.ds_pr_git import MICS, TORCH, FakeDeepSpeedPr, make_fake_deepspeed_pr

BRANCH = "mics-coalesced-wait"


@pytest.fixture
def global_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user-wide git identity that `make pr` must never take silently."""
    config = tmp_path / "global.gitconfig"
    config.write_text("[user]\n\tname = Global Person\n\temail = global@example.invalid\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(var, raising=False)
    return config


@pytest.fixture
def ds(tmp_path: Path, real_subprocess: None, global_identity: Path) -> FakeDeepSpeedPr:
    return make_fake_deepspeed_pr(tmp_path / "src")


def state(repo: Path) -> dict[str, str]:
    """What the user sees of their checkout: files, index, HEAD, refs, work trees, stashes."""
    return {
        "status": git(repo, "status", "--porcelain", "--untracked-files=all"),
        "head": git(repo, "rev-parse", "HEAD") + " " + git(repo, "symbolic-ref", "-q", "HEAD"),
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
        "torch.py": (repo / "deepspeed/comm/torch.py").read_text(),
    }


def test_branch_patch_and_description_made_and_checkout_untouched(
    ds: FakeDeepSpeedPr, tmp_path: Path
) -> None:
    notes = ds.path / "my-notes.txt"  # the user's untracked file: must survive as it is
    notes.write_text("mine\n")
    before = state(ds.path)
    out = tmp_path / "out"

    assert cli.main(["pr", "--ds-repo", str(ds.path), "--out", str(out)]) == 0

    after = state(ds.path)
    new_ref = f"refs/heads/{BRANCH} "
    added = set(after.pop("refs").splitlines()) - set(before.pop("refs").splitlines())
    assert [r.split()[0] for r in added] == [new_ref.strip()]
    assert after == before and notes.read_text() == "mine\n"

    commit = git(ds.path, "rev-parse", BRANCH)
    assert git(ds.path, "rev-parse", f"{BRANCH}^") == ds.master
    for path, source in (("deepspeed/comm/torch.py", TORCH), ("deepspeed/runtime/zero/mics.py", MICS)):
        targets = tuple(t for t in fix.TARGETS if t.path == path)
        assert git(ds.path, "show", f"{commit}:{path}") + "\n" == fix.patched_source(source, targets)
    assert git(ds.path, "show", f"{commit}:{pr_fix.TEST_REL}") + "\n" == pr_fix.TEST_SOURCE.read_text()
    # DeepSpeed's comm/torch.py is executable: the branch keeps its mode.
    assert git(ds.path, "ls-tree", commit, "--", "deepspeed/comm/torch.py").startswith("100755 ")
    assert git(ds.path, "log", "-1", "--format=%an <%ae>|%cn <%ce>", commit) == (
        "Pat Contributor <pat@example.invalid>|Pat Contributor <pat@example.invalid>"
    )
    message = git(ds.path, "log", "-1", "--format=%B", commit)
    subject = message.splitlines()[0]
    assert len(subject) <= 72 and not subject.endswith(".")
    assert "Fixes #5080" in message and "Signed-off-by: Pat Contributor <pat@example.invalid>" in message
    assert not (out / "worktree").exists()

    record = json.loads((out / "pr.json").read_text())
    assert record["commit"] == commit and record["ref_sha"] == ds.master and record["checkout_untouched"]
    patch = out / record["patch_file"]
    assert patch.is_file() and patch.name.startswith("0001-")
    # The patch is what the branch holds: it applies to REF in a fresh clone of it.
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(ds.path), str(clone))
    git(clone, "checkout", "-q", ds.master)
    git(clone, "apply", "--check", str(patch))

    calls = [(c["path"], c["line"]) for c in record["callers"] if c["kind"] == "call"]
    expected = [n for n, line in enumerate(MICS.splitlines(), 1) if "dist.all_gather_coalesced(" in line]
    assert calls == [("deepspeed/runtime/zero/mics.py", n) for n in expected] and len(expected) == 3
    assert record["swallowed_before"] is True
    text = (out / "PR_DESCRIPTION.md").read_text()
    assert ds.master[:10] in text and "pytest tests/unit/runtime/zero/test_mics_coalesced_wait.py" in text


def test_keep_leaves_the_work_tree_on_the_branch(ds: FakeDeepSpeedPr, tmp_path: Path) -> None:
    out = tmp_path / "out"
    record = make_pr(PrRequest(ds_repo=str(ds.path), out=out, keep=True))
    tree = out / "worktree"
    assert record.worktree == str(tree)
    assert git(tree, "symbolic-ref", "HEAD") == f"refs/heads/{BRANCH}"
    assert git(tree, "status", "--porcelain") == ""
    assert (tree / pr_fix.TEST_REL).is_file()
    assert git(ds.path, "status", "--porcelain") == ""


def test_author_from_options_wins_and_global_identity_is_never_taken(
    tmp_path: Path, real_subprocess: None, global_identity: Path
) -> None:
    ds = make_fake_deepspeed_pr(tmp_path / "src", identity=False)
    with pytest.raises(UsageError, match="no author for the commit"):
        make_pr(PrRequest(ds_repo=str(ds.path), out=tmp_path / "a"))
    assert git(ds.path, "branch", "--list", BRANCH) == ""
    make_pr(
        PrRequest(
            ds_repo=str(ds.path),
            out=tmp_path / "b",
            author_name="Ann Opt",
            author_email="ann@example.invalid",
        )
    )
    assert git(ds.path, "log", "-1", "--format=%an <%ae>", BRANCH) == "Ann Opt <ann@example.invalid>"


# -- refusals: each with its exit code, and no branch, work tree or OUT left behind ---------------------
def _refused(
    ds: FakeDeepSpeedPr, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str]:
    out = tmp_path / "refused-out"
    refs = git(ds.path, "for-each-ref")
    code = cli.main(["pr", "--ds-repo", str(ds.path), "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert git(ds.path, "for-each-ref") == refs
    assert git(ds.path, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert not out.exists() or not any(out.iterdir())
    return code, err


def test_refuses_a_dirty_checkout(
    ds: FakeDeepSpeedPr, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (ds.path / "deepspeed/comm/comm.py").write_text("# my local edit\n")
    code, err = _refused(ds, tmp_path, capsys)
    assert code == UsageError.exit_code and "uncommitted changes" in err
    assert (ds.path / "deepspeed/comm/comm.py").read_text() == "# my local edit\n"


def test_refuses_a_shallow_checkout(
    ds: FakeDeepSpeedPr, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{ds.path}", str(shallow))
    git(shallow, "config", "user.name", "Pat")
    git(shallow, "config", "user.email", "pat@example.invalid")
    code, err = _refused(FakeDeepSpeedPr(shallow, ds.early, ds.master), tmp_path, capsys)
    assert code == UsageError.exit_code and "shallow clone" in err and "fetch --unshallow" in err


def assert_refused_untouched(ds: FakeDeepSpeedPr, tmp_path: Path, match: str, **request: str) -> None:
    """make-pr with `request` is a usage error naming `match`, before any ref or folder is made."""
    refs = git(ds.path, "for-each-ref")
    with pytest.raises(UsageError, match=match):
        make_pr(PrRequest(ds_repo=str(ds.path), out=tmp_path / "out", **request))
    assert git(ds.path, "for-each-ref") == refs and not (tmp_path / "out").exists()


@pytest.mark.parametrize("ref", ["no-such-branch", "0" * 40, "--upload-pack=touch /tmp/x", "master\nx"])
def test_refuses_a_missing_or_hostile_ref(ds: FakeDeepSpeedPr, tmp_path: Path, ref: str) -> None:
    assert_refused_untouched(ds, tmp_path, "REF=", ref=ref)


def test_a_missing_ref_exits_2_at_the_front_door(
    ds: FakeDeepSpeedPr, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _refused(ds, tmp_path, capsys, "--ref", "v9.9.9")
    assert code == UsageError.exit_code and "REF=v9.9.9 is not a commit" in err


def test_refuses_an_existing_branch(
    ds: FakeDeepSpeedPr, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    git(ds.path, "branch", BRANCH, ds.early)
    code, err = _refused(ds, tmp_path, capsys)
    assert code == UsageError.exit_code and f"already has a branch {BRANCH}" in err
    assert git(ds.path, "rev-parse", BRANCH) == ds.early  # not moved


@pytest.mark.parametrize("branch", ["-D", "has space", "a..b", "x\x1b[2J", ""])
def test_refuses_a_bad_branch_name(ds: FakeDeepSpeedPr, tmp_path: Path, branch: str) -> None:
    assert_refused_untouched(ds, tmp_path, "BRANCH=", branch=branch)


def test_a_fix_that_does_not_apply_is_named_with_file_and_line(
    ds: FakeDeepSpeedPr, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _refused(ds, tmp_path, capsys, "--ref", ds.early)
    assert code == pr_fix.FixDoesNotApplyError.exit_code == 23
    assert "deepspeed/runtime/zero/mics.py" in err and "MiCS_AllGatherCoalescedHandle" in err


def test_a_ref_that_already_holds_the_fix_is_refused(ds: FakeDeepSpeedPr, tmp_path: Path) -> None:
    make_pr(PrRequest(ds_repo=str(ds.path), out=tmp_path / "first"))
    with pytest.raises(pr_fix.FixDoesNotApplyError, match="already holds the fix"):
        make_pr(PrRequest(ds_repo=str(ds.path), out=tmp_path / "second", ref=BRANCH, branch="again"))


def test_refuses_out_inside_the_checkout(ds: FakeDeepSpeedPr, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="inside DS_REPO"):
        make_pr(PrRequest(ds_repo=str(ds.path), out=ds.path / "pr-out"))
    assert not (ds.path / "pr-out").exists()


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("https://github.com/deepspeedai/DeepSpeed", "is not a folder on this machine"),
        ("--upload-pack=sh", "starts with '-'"),
        ("ext::sh -c touch% /tmp/pwned", "transport helper"),
        ("git@github.com:deepspeedai/DeepSpeed", "is not a folder on this machine"),
    ],
)
def test_refuses_a_ds_repo_that_is_not_a_local_checkout(
    spec: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the front door: DS_REPO passes the one checker (repro.bisect.commits.check_source),
    then make pr's own rule (a folder on this machine); git is never asked."""
    code = cli.main(["pr", f"--ds-repo={spec}", "--out", str(tmp_path / "out")])
    assert code == UsageError.exit_code and words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_refuses_a_folder_that_is_not_a_repository(
    tmp_path: Path, real_subprocess: None, global_identity: Path
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(UsageError, match="not a git repository"):
        make_pr(PrRequest(ds_repo=str(plain), out=tmp_path / "out"))


@pytest.mark.parametrize(
    ("name", "email"),
    [("Eve <x@y>", "e@example.invalid"), ("Eve\nX", "e@example.invalid"), ("Eve", "not-an-address")],
)
def test_refuses_an_author_that_cannot_go_into_a_commit(
    ds: FakeDeepSpeedPr, tmp_path: Path, name: str, email: str
) -> None:
    with pytest.raises(UsageError, match="author"):
        make_pr(PrRequest(ds_repo=str(ds.path), out=tmp_path / "o", author_name=name, author_email=email))
    assert git(ds.path, "branch", "--list", BRANCH) == ""


def test_hooks_of_the_checkout_do_not_run(ds: FakeDeepSpeedPr, tmp_path: Path) -> None:
    marker = tmp_path / "hook-ran"
    hooks = ds.path / ".git" / "hooks"
    for name in ("pre-commit", "commit-msg", "post-commit", "post-checkout"):
        (hooks / name).write_text(f"#!/bin/sh\necho {name} >> {marker}\n")
        (hooks / name).chmod(0o755)
    make_pr(PrRequest(ds_repo=str(ds.path), out=tmp_path / "out", keep=True))
    assert not marker.exists()


def test_git_is_only_run_through_the_one_door(
    ds: FakeDeepSpeedPr, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every git call of `make pr` goes through repro.core.cmd.run (the seam the tests fake)."""
    real_popen = subprocess.Popen
    seen: list[list[str]] = []

    def spy(argv: list[str], *args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        seen.append([str(a) for a in argv])
        return real_popen(argv, *args, **kwargs)  # type: ignore[call-overload,no-any-return]

    from repro.core import cmd

    calls: list[tuple[str, ...]] = []
    real_run = cmd.run

    def counted(argv: list[str], **kwargs: object) -> cmd.CmdResult:
        calls.append(tuple(str(a) for a in argv))
        return real_run(argv, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(subprocess, "Popen", spy)
    monkeypatch.setattr(cmd, "run", counted)
    make_pr(PrRequest(ds_repo=str(ds.path), out=tmp_path / "out"))
    assert len(seen) == len(calls) > 5


@pytest.mark.parametrize("stop", [UsageError("update-ref refused"), KeyboardInterrupt()])
def test_a_failure_after_the_work_tree_was_added_leaves_no_branch_and_no_work_tree(
    ds: FakeDeepSpeedPr, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: BaseException
) -> None:
    """Ctrl-C or an error between `worktree add` and the branch: the work tree is removed again
    and no branch exists, so the next `make pr` starts from the same place."""
    from repro.upstream.pr.git import Checkout

    def fail(self: Checkout, branch: str, sha: str) -> None:
        raise stop

    before = state(ds.path)
    monkeypatch.setattr(Checkout, "create_branch", fail)
    with pytest.raises(type(stop)):
        make_pr(PrRequest(ds_repo=str(ds.path), out=tmp_path / "out", keep=True))
    assert state(ds.path) == before
    assert not (tmp_path / "out" / "worktree").exists()


def test_a_target_file_that_is_a_link_at_ref_is_refused(ds: FakeDeepSpeedPr, tmp_path: Path) -> None:
    """A checkout whose comm/torch.py is a symbolic link (to a file outside it): nothing is read
    through the link or written through it; the refusal names the file."""
    secret = tmp_path / "outside.py"
    secret.write_text(TORCH)
    torch_py = ds.path / "deepspeed/comm/torch.py"
    torch_py.unlink()
    torch_py.symlink_to(secret)
    git(ds.path, "commit", "-qam", "Link the backend")
    with pytest.raises(pr_fix.FixDoesNotApplyError, match="deepspeed/comm/torch.py is a symbolic link"):
        make_pr(PrRequest(ds_repo=str(ds.path), out=tmp_path / "out"))
    assert secret.read_text() == TORCH and git(ds.path, "branch", "--list", BRANCH) == ""


def test_git_location_variables_in_the_users_shell_are_ignored(
    ds: FakeDeepSpeedPr, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GIT_DIR or GIT_INDEX_FILE left exported would point git at another repository or index."""
    other = other_repository(tmp_path)
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "stray-index"))
    make_pr(PrRequest(ds_repo=str(ds.path), out=tmp_path / "out"))
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_INDEX_FILE")
    assert git(ds.path, "rev-parse", f"{BRANCH}^") == ds.master
    assert git(other, "for-each-ref") == "" and not (tmp_path / "stray-index").exists()
