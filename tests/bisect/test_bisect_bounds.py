"""Issue #32 item 4 on the bisect side: what a walk refuses or bounds before it probes anything.

PARALLEL= is capped by the candidates, the host and a fixed maximum (PARALLEL=1000 once made 1000
work trees for 3 candidates); COMMITS=1 checks DS_REPO before the first release probe (dry runs
too); GOOD/BAD the wrong way round on the commit axis is refused, not bisected as one commit.
Git is real (tests/fixtures/ds_git.py); the probes are fakes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from repro.bisect import driver, rounds
from repro.bisect.commits import DsRepo
from repro.bisect.probe import Observation, ProbeSpec
from repro.cli import bisect_commands as bisect_cli
from repro.core.errors import UsageError
from tests.fixtures.ds_git import FakeDeepSpeed, make_fake_deepspeed
from tests.fixtures.fake_bisect import FakeEngine, FakeEnv, FakeMatrix, parse

pytestmark = pytest.mark.usefixtures("real_subprocess")


@pytest.fixture
def ds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDeepSpeed:
    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path / "cache"))
    return make_fake_deepspeed(tmp_path)


def clean(env: FakeEnv) -> tuple[str, str]:
    return ("hung", "hang") if env.deepspeed == "0.3.0" else ("clean", "none")


class CountingRepo(DsRepo):
    """The real cached clone, counting the work-tree slots asked for."""

    slots: set[int] = set()

    def checkout(self, sha: str, slot: int = 0) -> Path:
        CountingRepo.slots.add(slot)
        return super().checkout(sha, slot)


def fake_processes(ds: FakeDeepSpeed, seen: list[int]) -> type[rounds.Processes]:
    order = [ds.shas[n] for n in ("v0.2.0", "docs", "broken", "repaired", "bad", "later", "v0.3.0")]

    class FakeProcesses(rounds.Processes):
        """Side-by-side probes without processes: a commit at or after `bad` hangs."""

        def __call__(self, specs: Sequence[ProbeSpec]) -> list[Observation]:
            seen.append(self.slots)
            out = []
            for spec in specs:
                bad = order.index(spec.deepspeed_commit or "") >= order.index(ds.bad)
                outcome = ("hung", "hang") if bad else ("clean", "none")
                out.append(Observation(spec.label, *outcome, reason="fake", seconds=0.0))
            return out

    return FakeProcesses


def run(tmp: Path, argv: list[str], **services: Any) -> tuple[int, list[str], FakeEngine]:
    lines: list[str] = []
    engine = FakeEngine(clean)
    req = parse("bisect", [*argv, "--out", str(tmp / "out"), "--results-root", str(tmp / "results")])
    made = bisect_cli.Services(matrix=FakeMatrix(), engine=engine, say=lines.append, **services)
    return bisect_cli.run_bisect(req, made), lines, engine


def test_parallel_on_the_commit_axis_is_capped_by_the_candidates(
    tmp_path: Path, ds: FakeDeepSpeed, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    monkeypatch.setattr(rounds, "Processes", fake_processes(ds, seen))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # so the candidates are the bound
    CountingRepo.slots = set()
    argv = ["--axis", "deepspeed-commit", "--good", "v0.2.0", "--bad", "v0.3.0", "--ds-repo", str(ds.path)]
    code, lines, _ = run(tmp_path, [*argv, "--bad-if", "failed", "--parallel", "50"], repo=CountingRepo)
    assert code == 0
    # 7 candidates: 7 work trees at most, never 50
    assert CountingRepo.slots == set(range(7))
    assert seen and set(seen) == {7}
    assert "PARALLEL=50: 7 probes a round (7 candidates)" in lines
    data = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert data["parallel"] == 7 and data["first_bad_commit"]["sha"] == ds.bad


def test_parallel_is_capped_by_the_cores_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def runner(req: driver.WalkRequest, **_: Any) -> rounds.RoundRunner:
        asked.append(req.parallel)
        raise KeyboardInterrupt  # the count is all this test needs

    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    versions = "0.1.0,0.2.0,0.3.0,0.4.0,0.5.0,0.6.0,0.7.0,0.8.0,0.9.0,0.10.0"
    argv = ["--axis", "deepspeed", "--versions", versions, "--from", "0.1.0", "--to", "0.10.0"]
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, [*argv, "--parallel", "1000"], runner=runner)
    assert asked == [3]


def test_parallel_bounds_say_which_limit_holds() -> None:
    req = parse("bisect", ["--axis", "torch", "--good", "2.0.0", "--parallel", "1000"])
    said: list[str] = []
    assert driver.bounded_parallel(req, 3, said.append, cores=16).parallel == 3
    assert driver.bounded_parallel(req, 500, said.append, cores=128).parallel == driver.MAX_PARALLEL
    assert driver.bounded_parallel(req, 500, said.append, cores=4).parallel == 4
    assert said == [
        "PARALLEL=1000: 3 probes a round (3 candidates)",
        f"PARALLEL=1000: {driver.MAX_PARALLEL} probes a round (at most {driver.MAX_PARALLEL})",
        "PARALLEL=1000: 4 probes a round (4 cores here)",
    ]
    small = parse("bisect", ["--axis", "torch", "--good", "2.0.0", "--parallel", "2"])
    assert driver.bounded_parallel(small, 9, said.append, cores=16) is small  # nothing to say
    assert len(said) == 3


@pytest.mark.parametrize("dry_run", [False, True])
def test_commits_with_a_folder_that_is_no_repository_stops_before_any_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dry_run: bool
) -> None:
    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path / "cache"))
    plain = tmp_path / "not-a-checkout"
    plain.mkdir()
    argv = ["--axis", "deepspeed", "--versions", "0.1.0,0.2.0,0.3.0", "--from", "0.1.0", "--to", "0.3.0"]
    argv += ["--bad-if", "failed", "--commits", "--ds-repo", str(plain)] + (["--dry-run"] if dry_run else [])
    lines: list[str] = []
    engine = FakeEngine(clean)
    req = parse("bisect", [*argv, "--out", str(tmp_path / "out"), "--results-root", str(tmp_path / "r")])
    services = bisect_cli.Services(matrix=FakeMatrix(), engine=engine, say=lines.append)
    with pytest.raises(UsageError, match="not a git repository") as err:
        bisect_cli.run_bisect(req, services)
    assert err.value.exit_code == 2
    assert engine.prepares == 0  # not one release was probed
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("good", "bad", "what"), [("v0.3.0", "v0.2.0", "not in order"), ("v0.2.0", "v0.2.0", "same")]
)
def test_good_and_bad_the_wrong_way_round_are_refused(
    tmp_path: Path, ds: FakeDeepSpeed, good: str, bad: str, what: str
) -> None:
    argv = ["--axis", "deepspeed-commit", "--good", good, "--bad", bad, "--ds-repo", str(ds.path)]
    with pytest.raises(UsageError, match=what) as err:
        run(tmp_path, [*argv, "--bad-if", "failed"])
    assert err.value.exit_code == 2
    assert "swap" in err.value.fix or "different" in err.value.fix
    assert not (tmp_path / "out").exists()


def test_a_ref_that_looks_like_an_option_never_reaches_git(tmp_path: Path, ds: FakeDeepSpeed) -> None:
    argv = ["--axis", "deepspeed-commit", "--good=--output=/tmp/x", "--bad", "v0.3.0"]
    with pytest.raises(UsageError, match="not a git ref"):
        run(tmp_path, [*argv, "--ds-repo", str(ds.path)])
