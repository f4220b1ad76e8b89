"""AXIS=deepspeed-commit and COMMITS=1 against a small git repository made by the test
(tests/fixtures/ds_git.py): the cached clone, the first-parent candidates, a commit that does not
import stepped around, a deleted file that must not survive a reused work tree, and the release
bisect that goes on into the commits between its boundary releases in the same folder.

Git and the import of each checked-out commit are real; what stands in is the heavy part of a
probe (building the commit into a venv and running the suite): `ImportProbe` imports the work
tree's `deepspeed` in a fresh interpreter and reports the behaviour that package declares.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from repro.bisect.commits import DsRepo, pr_number
from repro.bisect.probe import Observation, ProbeSpec
from repro.cli import bisect_commands as bisect_cli
from repro.core import cmd
from repro.core.errors import BuildError, UsageError
from repro.engines.base import EngineKind, Prepared, SuiteRun
from repro.workload.record import write_json_atomic
from tests.fixtures.ds_git import FakeDeepSpeed, git, make_fake_deepspeed
from tests.fixtures.fake_bisect import FakeEngine, FakeEnv, FakeMatrix, parse
from tests.fixtures.stand_in_engine import StandInEngine

pytestmark = pytest.mark.usefixtures("real_subprocess")


@pytest.fixture
def ds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDeepSpeed:
    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path / "cache"))
    return make_fake_deepspeed(tmp_path)


class ImportProbe(StandInEngine):
    """Stands in for SourceOverlay over the env: the checked-out package is imported for real (one
    that does not import is a BuildError, as SourceOverlay's import check makes it), and the suite's
    MiCS run reports what that package's `mics_outcome()` says."""

    def __init__(self, inner: FakeEngine, tree: Path, trees: list[Path]) -> None:
        self.inner, self.tree = inner, tree
        trees.append(tree)
        self.outcome: tuple[str, str] = ("", "")

    def describe(self) -> str:
        return f"fake overlay of {self.tree}"

    def prepare(self, env: FakeEnv) -> Prepared:
        base = self.inner.prepare(env)
        result = cmd.run(
            [sys.executable, "-c", "import json, deepspeed; print(json.dumps(deepspeed.mics_outcome()))"],
            extra_env={"PYTHONPATH": str(self.tree), "PYTHONDONTWRITEBYTECODE": "1"},
            capture=True,
            echo=False,
        )
        if not result.ok:
            raise BuildError("the checkout does not import", why=result.tail(3))
        self.outcome = tuple(json.loads(result.stdout))  # type: ignore[assignment]
        return Prepared(EngineKind.VENV, env.id, str(self.tree), "overlay", base.reused)

    def run_suite(self, prepared: Prepared, args: Sequence[str], out_dir: Path, timeout_s: Any) -> SuiteRun:
        argv = list(args)
        scenario, patch = argv[argv.index("--scenarios") + 1], argv[argv.index("--patches") + 1]
        env = self.inner.envs[prepared.env_id]
        runs = [FakeEngine._record(env, scenario, patch, self.outcome)]
        write_json_atomic(str(out_dir / "suite.json"), {"runs": runs, "artifacts": {}})
        return SuiteRun(0, False, 1.0, out_dir, None)


def release_behaviour(env: FakeEnv) -> tuple[str, str]:
    return ("hung", "hang") if env.deepspeed == "0.3.0" else ("clean", "none")


def services(engine: FakeEngine, lines: list[str], trees: list[Path]) -> bisect_cli.Services:
    """The walk's services: the fake matrix, `engine` for the releases and ImportProbe over it for
    each commit (its work tree kept in `trees`), the walk's lines said into `lines`."""
    return bisect_cli.Services(
        matrix=FakeMatrix(),
        engine=engine,
        say=lines.append,
        overlay=lambda inner, tree: ImportProbe(inner, tree, trees),  # type: ignore[arg-type,return-value]
    )


def bisect(
    tmp: Path, options: str, ds_repo: Path | None = None, engine: FakeEngine | None = None
) -> tuple[dict[str, Any], list[str], list[Path]]:
    """`bisect` with `options` (split at spaces), then `--ds-repo ds_repo` where given."""
    lines: list[str] = []
    trees: list[Path] = []
    repo = ["--ds-repo", str(ds_repo)] if ds_repo is not None else []
    argv = [*options.split(), *repo, "--out", str(tmp / "out"), "--results-root", str(tmp / "results")]
    args = parse("bisect", argv)
    assert bisect_cli.run_bisect(args, services(engine or FakeEngine(release_behaviour), lines, trees)) == 0
    return json.loads((tmp / "out" / "bisect.json").read_text()), lines, trees


def test_commit_axis_names_the_first_bad_commit(tmp_path: Path, ds: FakeDeepSpeed) -> None:
    options = "--axis deepspeed-commit --good v0.2.0 --bad v0.3.0 --bad-if failed"
    data, lines, trees = bisect(tmp_path, options, ds.path)
    order = ["v0.2.0", "docs", "broken", "repaired", "bad", "later", "v0.3.0"]
    assert data["candidates"] == [ds.shas[name][:7] for name in order]
    assert data["status"] == "found"
    bad = data["first_bad_commit"]
    assert bad["sha"] == ds.bad and bad["pr"] == 60
    assert bad["subject"] == "MiCS: build replica groups once (#60)"
    assert "deepspeed/replica_guard.py" in bad["files"]
    assert data["last_good_commit"]["sha"] == ds.shas["repaired"]
    assert data["reproduce"]["make"].startswith("make probe ENV=cpu")
    assert f"DEEPSPEED_COMMIT={ds.bad}" in data["reproduce"]["make"]
    assert f"@{ds.bad}'" in data["reproduce"]["pip"]
    # The user's checkout is not where probes happen: work trees of the cached clone are.
    assert trees and all(ds.path not in t.parents for t in trees)
    assert any(line.startswith("  first bad commit: " + ds.bad[:7]) for line in lines)


def test_a_commit_that_does_not_import_is_stepped_around(tmp_path: Path, ds: FakeDeepSpeed) -> None:
    data, _, _ = bisect(
        tmp_path, f"--axis deepspeed-commit --from v0.2.0 --to {ds.bad} --bad-if failed", ds.path
    )
    by_label = {p["version"]: p for p in data["probes"]}
    broken = by_label[ds.shas["broken"][:7]]  # the midpoint of five: probed, unknown
    assert (broken["outcome"], broken["verdict"]) == ("env-error", "unknown")
    assert "does not import" in broken["reason"]
    assert data["first_bad_commit"]["sha"] == ds.bad
    assert data["last_good_commit"]["sha"] == ds.shas["repaired"]


# The release bisect over three releases that goes on into the commits of its boundary.
CHAINED = "--axis deepspeed --versions 0.1.0,0.2.0,0.3.0 --from 0.1.0 --to 0.3.0 --bad-if failed --commits"


def test_release_bisect_goes_on_into_the_commits(tmp_path: Path, ds: FakeDeepSpeed) -> None:
    data, lines, _ = bisect(tmp_path, CHAINED, ds.path)
    assert (data["last_good"], data["first_bad"]) == ("0.2.0", "0.3.0")
    commits = data["commits"]
    assert commits["axis"] == "deepspeed-commit" and commits["status"] == "found"
    assert (
        commits["candidates"][0] == ds.shas["v0.2.0"][:7]
        and commits["candidates"][-1] == ds.shas["v0.3.0"][:7]
    )
    assert commits["first_bad_commit"]["sha"] == ds.bad
    # One folder, one results.json: the release probes' runs and the commit probes' runs.
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(results["runs"]) >= data["probe_count"] + commits["probe_count"]
    assert any("first bad commit: " + ds.bad[:7] in line for line in lines)


def test_work_trees_keep_no_deleted_or_stray_files(tmp_path: Path, ds: FakeDeepSpeed) -> None:
    repo = DsRepo(str(ds.path))
    repo.sync()
    tree = repo.checkout(ds.shas["v0.1.0"])
    assert (tree / "deepspeed" / "replica_guard.py").exists()
    (tree / "deepspeed" / "build_leftover.py").write_text("stale")
    again = repo.checkout(ds.bad)
    assert again == tree  # the same slot's tree, reused
    assert not (tree / "deepspeed" / "replica_guard.py").exists()
    assert not (tree / "deepspeed" / "build_leftover.py").exists()
    assert not (tree / "docs").exists()  # sparse: only what a DeepSpeed build reads
    assert repo.checkout(ds.bad, slot=1) != tree  # parallel probes get their own trees


def test_new_commits_are_fetched_on_later_use(tmp_path: Path, ds: FakeDeepSpeed) -> None:
    repo = DsRepo(str(ds.path))
    repo.sync()
    (ds.path / "new.txt").write_text("x")
    git(ds.path, "add", "-A")
    git(ds.path, "commit", "-q", "-m", "After the release (#9)")
    head = git(ds.path, "rev-parse", "HEAD")
    with pytest.raises(UsageError):
        repo.resolve(head)
    repo.sync()
    assert repo.resolve("master") == head


def test_an_unreachable_repository_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UsageError, match="not a git repository"):
        DsRepo(str(tmp_path / "nowhere")).sync()
    with pytest.raises(UsageError, match="cannot be cloned") as err:
        DsRepo(f"file://{tmp_path}/nowhere.git").sync()
    assert "DS_REPO=" in (err.value.fix or "")


def test_commit_axis_needs_a_repository(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="DS_REPO"):
        bisect(tmp_path, "--axis deepspeed-commit --good v0.2.0 --bad v0.3.0")


@pytest.mark.parametrize(
    ("subject", "pr"),
    [
        ("MiCS: build replica groups once (#8060)", 8060),
        ("Merge pull request #77 from x/y", 77),
        ("Fix #12 in the middle", None),
    ],
)
def test_pr_number_from_the_subject(subject: str, pr: int | None) -> None:
    assert pr_number(subject) == pr


def test_probe_builds_a_named_commit(tmp_path: Path, ds: FakeDeepSpeed) -> None:
    seen: list[ProbeSpec] = []

    def evaluate(spec: ProbeSpec) -> Observation:
        seen.append(spec)
        return Observation(spec.label, "hung", "hang", "", 1.0)

    code = bisect_cli.probe_main(
        ["--deepspeed-commit", "v0.3.0", "--ds-repo", str(ds.path), "--bad-if", "failed"], evaluate
    )
    assert code == 1
    assert seen[0].deepspeed_commit == ds.shas["v0.3.0"] and seen[0].label == ds.shas["v0.3.0"][:12]


def test_issue_from_the_chained_folder_names_the_commit(tmp_path: Path, ds: FakeDeepSpeed) -> None:
    from repro.core.scrub import Scrubber
    from repro.upstream.issue import make as issue

    bisect(tmp_path, CHAINED, ds.path)
    text = issue.render(tmp_path / "out", Scrubber.from_host({}, home="/nonexistent", hostnames=[], user=""))
    (tmp_path / "ISSUE.md").write_text(text)
    assert text.splitlines()[0] == (
        f'# MiCS (mics, stock): hung since {ds.bad[:7]} "MiCS: build replica groups once (#60)"'
    )
    assert f"@{ds.bad}'" in text and str(tmp_path / "out") not in text


def test_survey_goes_on_into_the_commits_of_each_change_point(tmp_path: Path, ds: FakeDeepSpeed) -> None:
    lines: list[str] = []
    trees: list[Path] = []
    argv = ["--axis", "deepspeed", "--versions", "0.1.0,0.2.0,0.3.0", "--from", "0.1.0", "--to", "0.3.0",
            "--commits", "--ds-repo", str(ds.path), "--out", str(tmp_path / "out"),
            "--results-root", str(tmp_path / "r")]  # fmt: skip
    walk = services(FakeEngine(release_behaviour), lines, trees)
    assert bisect_cli.run_survey(parse("survey", argv), walk) == 0
    data = json.loads((tmp_path / "out" / "survey.json").read_text())
    assert [(c["before"], c["after"]) for c in data["change_points"]] == [("0.2.0", "0.3.0")]
    (stage,) = data["commits"]
    # No BAD_IF on a survey: "bad" is behaving unlike the older release.
    assert stage["bad_if"] == "differs" and stage["first_bad_commit"]["sha"] == ds.bad
