"""Issue #45 (hardening, round 4): git on a user's DeepSpeed clone runs none of the clone's code
and goes nowhere else than the clone (repro/core/safe_git.py).

Real git on a small DeepSpeed-shaped clone (tests/fixtures/ds_pr_git.py), through the real code
paths: `make pr` (make_pr), a probe's commit layer checkout (DsRepo.sync + checkout) and
pr-verify's export (export_tree). The attacks: a clone whose `core.fsmonitor` is a script; a
committed `.gitattributes` naming a filter (and diff) driver that the clone's config defines,
whose commands write a marker and alter the content; variables exported in the caller's shell
(GIT_DIR pointing to another repository, GIT_CONFIG_PARAMETERS). Each test asserts the marker
never appears, the other repository is unchanged, and what is committed or exported is exactly
the intended bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from repro.bisect.commits import DsRepo
from repro.core.errors import UsageError
from repro.upstream.pr import fix as pr_fix
from repro.upstream.pr.branch import PrRequest, make_pr
from repro.upstream.pr.verify import export_tree
from repro.workload import fix
from tests.fixtures.ds_git import git, other_repository
from tests.fixtures.ds_pr_git import MICS, TORCH, FakeDeepSpeedPr, make_fake_deepspeed_pr

BRANCH = "mics-coalesced-wait"
# Rewrites only a line the fix adds (REF's files stay as they are, so the clone's status stays
# clean and `make pr` goes on): what the branch holds would silently differ from the fix.
SED = "sed 's/cm\\.wait()/pass  # EVIL/'"
FIXED = {
    "deepspeed/comm/torch.py": TORCH,
    "deepspeed/runtime/zero/mics.py": MICS,
}


@pytest.fixture
def ds(tmp_path: Path, real_subprocess: None, monkeypatch: pytest.MonkeyPatch) -> FakeDeepSpeedPr:
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path / "cache"))
    return make_fake_deepspeed_pr(tmp_path / "src")


def marker_script(tmp_path: Path, name: str, body: str = "") -> tuple[Path, Path]:
    """An executable that appends its name and arguments to a marker file, then runs `body`."""
    marker = tmp_path / "marker"
    script = tmp_path / f"{name}.sh"
    script.write_text(f'#!/bin/sh\necho "{name} $*" >> {marker}\n{body}\n')
    script.chmod(0o755)
    return script, marker


def commit_attributes(ds: FakeDeepSpeedPr, line: str) -> None:
    """A commit of the clone that adds a .gitattributes holding `line`."""
    (ds.path / ".gitattributes").write_text(line + "\n")
    git(ds.path, "add", ".gitattributes")
    git(ds.path, "commit", "-q", "-m", "Attributes (#4)")


def arm_filter(ds: FakeDeepSpeedPr, tmp_path: Path) -> Path:
    """A committed .gitattributes naming driver `evil` for every .py file, and the clone's config
    defining it: clean/smudge write the marker and rewrite the fix's `cm.wait()`; a diff command
    and textconv that write the marker too. Returns the marker."""
    commit_attributes(ds, "*.py filter=evil diff=evil")
    script, marker = marker_script(tmp_path, "evil", SED)
    for key in ("filter.evil.clean", "filter.evil.smudge", "diff.evil.textconv", "diff.evil.command"):
        git(ds.path, "config", key, str(script))
    git(ds.path, "config", "filter.evil.required", "true")
    return marker


def committed(repo: Path, commit: str, path: str) -> bytes:
    import subprocess

    done = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "blob", f"{commit}:{path}"], capture_output=True, check=True
    )
    return done.stdout


def assert_branch_holds_the_fix(ds: FakeDeepSpeedPr, out: Path) -> None:
    commit = git(ds.path, "rev-parse", BRANCH)
    for path, source in FIXED.items():
        targets = tuple(t for t in fix.TARGETS if t.path == path)
        assert committed(ds.path, commit, path) == fix.patched_source(source, targets).encode()
    assert committed(ds.path, commit, str(pr_fix.TEST_REL)) == pr_fix.TEST_SOURCE.read_bytes()
    record = json.loads((out / "pr.json").read_text())
    patch = (out / record["patch_file"]).read_text()
    assert "EVIL" not in patch
    assert record["checkout_untouched"] is True


# -- make pr ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("keep", [False, True])
def test_make_pr_runs_no_fsmonitor_of_the_clone(ds: FakeDeepSpeedPr, tmp_path: Path, keep: bool) -> None:
    script, marker = marker_script(tmp_path, "fsmonitor", "exit 1")
    git(ds.path, "config", "core.fsmonitor", str(script))
    out = tmp_path / "out"
    make_pr(PrRequest(ds_repo=str(ds.path), out=out, keep=keep))
    assert not marker.exists(), marker.read_text()
    assert_branch_holds_the_fix(ds, out)


@pytest.mark.parametrize("keep", [False, True])
def test_make_pr_runs_no_filter_or_diff_driver_and_commits_the_fix_bytes(
    ds: FakeDeepSpeedPr, tmp_path: Path, keep: bool
) -> None:
    marker = arm_filter(ds, tmp_path)
    out = tmp_path / "out"
    make_pr(PrRequest(ds_repo=str(ds.path), out=out, keep=keep))
    assert not marker.exists(), marker.read_text()
    assert_branch_holds_the_fix(ds, out)
    if keep:  # the kept work tree holds the branch's bytes, not a smudged copy
        tree = out / "worktree"
        assert (tree / pr_fix.TEST_REL).read_bytes() == pr_fix.TEST_SOURCE.read_bytes()


def test_make_pr_commits_the_bytes_whatever_the_attributes_convert(
    ds: FakeDeepSpeedPr, tmp_path: Path
) -> None:
    """An attribute that converts content without a command (working-tree-encoding) cannot
    change what is committed either."""
    commit_attributes(ds, "tests/unit/runtime/zero/*.py working-tree-encoding=UTF-16LE")
    out = tmp_path / "out"
    make_pr(PrRequest(ds_repo=str(ds.path), out=out))
    assert_branch_holds_the_fix(ds, out)


def test_make_pr_ignores_config_exported_in_the_callers_shell(
    ds: FakeDeepSpeedPr, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit_attributes(ds, "*.py filter=evil")
    script, marker = marker_script(tmp_path, "evil", SED)
    params = f"'filter.evil.clean'='{script}' 'filter.evil.smudge'='{script}' 'core.fsmonitor'='{script}'"
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", params)
    out = tmp_path / "out"
    make_pr(PrRequest(ds_repo=str(ds.path), out=out, keep=True))
    monkeypatch.delenv("GIT_CONFIG_PARAMETERS")
    assert not marker.exists(), marker.read_text()
    assert_branch_holds_the_fix(ds, out)


def test_a_commit_that_does_not_hold_the_fix_bytes_is_refused_and_no_branch_is_made(
    ds: FakeDeepSpeedPr, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever made git store other bytes (here: a stand-in that stages a changed file and a
    stray one), the check after the commit refuses it before the branch exists."""
    from repro.upstream.pr import blobs as pr_blobs

    real_stage = pr_blobs.stage

    def tampered(checkout: object, worktree: Path, wanted: dict[str, Any]) -> None:
        changed = dict(wanted)
        first = next(iter(changed))
        changed[first] = pr_blobs.Wanted(b"# not the fix\n", changed[first].executable)
        (worktree / first).write_bytes(b"# not the fix\n")
        (worktree / "stray.txt").write_text("stray\n")
        real_stage(checkout, worktree, {**changed, "stray.txt": pr_blobs.Wanted(b"stray\n", False)})  # type: ignore[arg-type]

    monkeypatch.setattr(pr_blobs, "stage", tampered)
    out = tmp_path / "out"
    with pytest.raises(UsageError, match="does not hold the fix's bytes") as err:
        make_pr(PrRequest(ds_repo=str(ds.path), out=out))
    assert "deepspeed/comm/torch.py" in err.value.what and "stray.txt" in err.value.what
    assert git(ds.path, "branch", "--list", BRANCH) == ""
    assert not (out / "worktree").exists()


# -- a probe's commit layer checkout ------------------------------------------------------------------
def test_probe_checkout_with_git_dir_exported_writes_nothing_into_that_repository(
    ds: FakeDeepSpeedPr, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = other_repository(tmp_path)
    (other / "file.txt").write_text("mine\n")
    git(other, "add", "file.txt")
    git(other, "commit", "-q", "-m", "mine")
    config_before = (other / ".git/config").read_bytes()
    listing_before = sorted(
        p.relative_to(other) for p in (other / ".git").rglob("*") if "objects" not in p.parts
    )
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    repo = DsRepo(str(ds.path))
    try:
        repo.sync()
        tree = repo.checkout(ds.master)
    finally:  # whether or not the probe got through, the other repository is as it was
        monkeypatch.delenv("GIT_DIR")
        monkeypatch.delenv("GIT_WORK_TREE")
        assert (other / ".git/config").read_text() == config_before.decode()
        assert not (other / ".git/info/sparse-checkout").exists()
        listing = sorted(
            p.relative_to(other) for p in (other / ".git").rglob("*") if "objects" not in p.parts
        )
        assert listing == listing_before
    assert (tree / "deepspeed/runtime/zero/mics.py").read_text() == MICS


def test_probe_checkout_runs_no_driver_or_fsmonitor_from_the_callers_shell(
    ds: FakeDeepSpeedPr, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit_attributes(ds, "*.py filter=evil")
    sha = git(ds.path, "rev-parse", "HEAD")
    script, marker = marker_script(tmp_path, "evil", SED)
    params = f"'filter.evil.smudge'='{script}' 'filter.evil.clean'='{script}' 'core.fsmonitor'='{script}'"
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", params)
    repo = DsRepo(str(ds.path))
    repo.sync()
    tree = repo.checkout(sha)
    monkeypatch.delenv("GIT_CONFIG_PARAMETERS")
    assert not marker.exists(), marker.read_text()
    assert (tree / "deepspeed/runtime/zero/mics.py").read_text() == MICS


# -- pr-verify's export -------------------------------------------------------------------------------
def exported(dest: Path, path: str) -> bytes:
    return (dest / path).read_bytes()


def test_export_runs_no_smudge_filter_of_the_clone(ds: FakeDeepSpeedPr, tmp_path: Path) -> None:
    marker = arm_filter(ds, tmp_path)
    sha = git(ds.path, "rev-parse", "HEAD")
    dest = export_tree(str(ds.path), sha, tmp_path / "tree", ["deepspeed"])
    assert not marker.exists(), marker.read_text()
    assert exported(dest, "deepspeed/runtime/zero/mics.py") == committed(
        ds.path, sha, "deepspeed/runtime/zero/mics.py"
    )


def test_export_with_git_dir_exported_reads_the_clone(
    ds: FakeDeepSpeedPr, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = other_repository(tmp_path)
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    dest = export_tree(str(ds.path), ds.master, tmp_path / "tree", ["deepspeed"])
    monkeypatch.delenv("GIT_DIR")
    assert exported(dest, "deepspeed/runtime/zero/mics.py") == MICS.encode()


# -- the door itself (no git) ---------------------------------------------------------------------------
def test_no_git_variable_of_the_caller_passes() -> None:
    from repro.core import safe_git

    env = safe_git.git_env(
        [("core.fsmonitor", "false"), ("filter.it's!.clean", "")],
        {"PATH": "/bin", "GIT_DIR": "/x", "GIT_CONFIG_PARAMETERS": "'a.b=c'", "GIT_SSH_COMMAND": "x"},
    )
    assert env["PATH"] == "/bin"
    assert {k for k in env if k.startswith("GIT_")} == {*safe_git.FIXED_ENV, "GIT_CONFIG_PARAMETERS"}
    assert env["GIT_CONFIG_PARAMETERS"] == "'core.fsmonitor=false' 'filter.it'\\''s'\\!'.clean='"


def test_every_driver_named_in_config_is_emptied() -> None:
    from repro.core import safe_git

    names = "\0".join(
        [
            "core.bare", "filter.lfs.process", "filter.a.b.clean", "diff.img.textconv",
            "merge.ours.driver", "filter.x.required", "diff.color", "remote.origin.url", "",
        ]
    )  # fmt: skip
    settings = dict(safe_git.driver_settings(names))
    assert settings == {
        "filter.lfs.clean": "", "filter.lfs.smudge": "", "filter.lfs.process": "",
        "filter.lfs.required": "false",
        "filter.a.b.clean": "", "filter.a.b.smudge": "", "filter.a.b.process": "",
        "filter.a.b.required": "false",
        "diff.img.command": "", "diff.img.textconv": "",
        "merge.ours.driver": "",
    }  # fmt: skip


def test_no_module_runs_git_but_the_door() -> None:
    """Every git argv in repro/ is built in repro/core/safe_git.py."""
    import ast

    from repro.core import safe_git

    root = Path(safe_git.__file__).parents[1]
    found = []
    for source in root.rglob("*.py"):
        if source.name == "safe_git.py":
            continue
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
                first = node.elts[0]
                if isinstance(first, ast.Constant) and first.value == "git":
                    found.append(f"{source.relative_to(root)}:{node.lineno}")
    assert found == []


def test_a_driver_name_git_would_split_is_refused() -> None:
    from repro.core import safe_git

    with pytest.raises(UsageError, match="filter driver named 'a=b'"):
        safe_git.driver_settings("core.bare\0filter.a=b.smudge\0")


def test_safe_directory_comes_from_the_users_own_config_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """git refuses a clone another user owns unless the user's global or system config names it;
    a `safe.directory` in a repository's own config is not the user's word (git ignores it too)."""
    from repro.core import cmd, safe_git

    seen: list[tuple[list[str], dict[str, str]]] = []

    def runner(argv: list[str], **kw: Any) -> cmd.CmdResult:
        seen.append((argv, dict(kw["env"])))
        if argv[1:3] == ["config", "--show-scope"]:
            out = "global\0/srv/ds\0local\0*\0system\0/shared\0"
            return cmd.CmdResult(tuple(argv), 0, out)
        return cmd.CmdResult(tuple(argv), 0, "")

    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/home/me/.gitconfig")
    monkeypatch.setenv("GIT_DIR", "/elsewhere")
    git = safe_git.SafeGit(runner)
    git.run("rev-parse", "HEAD", where=["-C", "/srv/ds"])
    git.run("rev-parse", "HEAD", where=["-C", "/srv/ds"])
    lookups = [env for argv, env in seen if argv[1:3] == ["config", "--show-scope"]]
    assert len(lookups) == 1  # once per door
    assert lookups[0]["GIT_CONFIG_GLOBAL"] == "/home/me/.gitconfig" and "GIT_DIR" not in lookups[0]
    params = seen[-1][1]["GIT_CONFIG_PARAMETERS"]
    assert "'safe.directory=/srv/ds'" in params and "'safe.directory=/shared'" in params
    assert "'safe.directory=*'" not in params
    assert seen[-1][1]["GIT_CONFIG_GLOBAL"] == "/dev/null"
