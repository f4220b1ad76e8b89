"""PARALLEL=k: rounds of k probes, each a child `probe` process (the real front door with the
heavy part replaced, tests/fixtures/probe_entry.py) on its own devices and work tree, locally and
as a Slurm array job (its script; sbatch faked); a probe that leaves no probe.json is unknown. With
a real Slurm controller (slurm tier): tests/bisect/test_bisect_runners_slurm.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from repro.bisect import rounds
from repro.bisect.probe import ProbeSpec
from repro.cli import bisect_commands as bisect_cli
from repro.core.cmd import CmdResult
from repro.core.errors import MissingToolError, RunError
from tests.fixtures.bisect_rounds import (
    ENTRY,
    cores,  # noqa: F401 - a fixture (autouse)
    ds,  # noqa: F401 - a fixture
    run_parallel,
)
from tests.fixtures.ds_git import FakeDeepSpeed
from tests.fixtures.fake_bisect import FakeEngine, FakeMatrix, parse


def test_device_groups_are_disjoint_subsets() -> None:
    assert rounds.device_groups(["0", "1", "2", "3"], 2) == ["0,1", "2,3"]
    assert rounds.device_groups(["0", "1", "2"], 3) == ["0", "1", "2"]
    assert rounds.device_groups([], 4) == []
    with pytest.raises(RunError):
        rounds.device_groups(["0"], 2)


def test_local_rounds_run_two_probes_side_by_side(
    tmp_path: Path,
    ds: FakeDeepSpeed,  # noqa: F811
    real_subprocess: None,
) -> None:
    def make(**kw: Any) -> rounds.RoundRunner:
        command = rounds.ProbeCommand(module=ENTRY)
        return rounds.Processes(kw["invocation"].folder, command, 2, ["0", "1", "2", "3"])

    data, _ = run_parallel(tmp_path, ds, make, [])
    assert data["first_bad_commit"]["sha"] == ds.bad
    assert (data["runner"], data["parallel"]) == ("local", 2)
    assert data["rounds"] < data["probe_count"]  # two a round
    # Each probe ran on its own half of the devices and in its own folder under probes/.
    devices = {p["reason"] for p in data["probes"] if p["outcome"] != "env-error"}
    assert devices <= {"devices=0,1", "devices=2,3"} and len(devices) == 2
    assert all((tmp_path / "out" / "probes").glob("*/probe.json"))


def test_a_probe_that_leaves_nothing_is_unknown(tmp_path: Path, ds: FakeDeepSpeed) -> None:  # noqa: F811
    def launch(argv: list[str], **kw: Any) -> CmdResult:
        return CmdResult(tuple(argv), 9)  # died before writing probe.json

    def make(**kw: Any) -> rounds.RoundRunner:
        return rounds.Processes(kw["invocation"].folder, rounds.ProbeCommand(), 2, launch=launch)

    data, _ = run_parallel(tmp_path, ds, make, [])
    assert data["status"] == "no-verdict"
    assert {p["verdict"] for p in data["probes"]} == {"unknown"}
    assert "exited 9" in data["probes"][0]["reason"]


def test_slurm_array_script_runs_one_probe_per_task(tmp_path: Path) -> None:
    runner = rounds.Slurm(
        tmp_path,
        rounds.ProbeCommand(python="py"),
        2,
        rounds.SlurmOptions(partition="gpu", gpus_per_task=4, image="ds.sif"),
    )
    specs = [
        ProbeSpec("cpu", label="abc1234", deepspeed_commit="a" * 40, deepspeed_repo="/r"),
        ProbeSpec("cpu", label="def5678", deepspeed_commit="d" * 40, deepspeed_repo="/r"),
    ]
    text = runner.script(specs, [tmp_path / "p1", tmp_path / "p2"])
    assert "#SBATCH --array=0-1" in text and "#SBATCH --partition=gpu" in text
    assert "#SBATCH --gpus-per-task=4" in text
    assert "0) exec apptainer exec --nv --cleanenv ds.sif py -m repro probe --env cpu" in text
    assert "--deepspeed-commit " + "d" * 40 + " --ds-repo /r --slot 1" in text


def test_sbatch_refusing_the_job_is_an_error(tmp_path: Path) -> None:
    def launch(argv: list[str], **kw: Any) -> CmdResult:
        return CmdResult(tuple(argv), 1, "", "sbatch: error: invalid partition specified")

    runner = rounds.Slurm(tmp_path, rounds.ProbeCommand(), 2, launch=launch, say=lambda _: None)
    with pytest.raises(MissingToolError, match="sbatch did not accept"):
        runner([ProbeSpec("cpu", label="a")])


def test_a_survey_probes_k_candidates_a_round(tmp_path: Path) -> None:
    from tests.fixtures.fake_bisect import TORCHES, torch_behaviour

    batches: list[list[str]] = []

    class Recorder:
        slots = 3

        def __init__(self, inner: rounds.RoundRunner) -> None:
            self.inner = inner

        def __call__(self, specs: Any) -> Any:
            batches.append([s.label for s in specs])
            return self.inner(specs)

    def make(**kw: Any) -> rounds.RoundRunner:
        inner = rounds.InProcess(kw["matrix"], kw["engine"], kw["invocation"], lambda _: None, lambda e, t: e)
        return Recorder(inner)

    argv = ["--axis", "torch", "--versions", TORCHES, "--from", "2.0.0", "--to", "2.3.0", "--parallel", "3",
            "--out", str(tmp_path / "out"), "--results-root", str(tmp_path / "r")]  # fmt: skip
    services = bisect_cli.Services(matrix=FakeMatrix(), engine=FakeEngine(torch_behaviour), runner=make)
    assert bisect_cli.run_survey(parse("survey", argv), services) == 0
    data = json.loads((tmp_path / "out" / "survey.json").read_text())
    assert [(c["before"], c["after"]) for c in data["change_points"]] == [("2.0.1", "2.1.0")]
    assert batches[0] == ["2.0.0", "2.3.0"] and max(len(b) for b in batches) == 3
    assert data["rounds"] == len(batches) < data["probe_count"]


def test_parallel_auto_fits_the_probes_to_the_host() -> None:
    from dataclasses import replace

    from repro.bisect.driver import auto_parallel

    req = parse("bisect", ["--axis", "torch", "--from", "2.0.0", "--parallel", "auto"])
    assert req.parallel == 0
    # 8 GPUs, probes of 2 ranks: 4 probes, each on its own pair.
    two_ranks = replace(req, probe=replace(req.probe, world_size=2))
    got = auto_parallel(two_ranks, FakeMatrix(), gpus=8)
    assert got.parallel == 4 and rounds.device_groups(got.devices, 4) == ["0,1", "2,3", "4,5", "6,7"]
    assert auto_parallel(req, FakeMatrix(), gpus=8).parallel == 1  # a probe takes every GPU by default
    assert auto_parallel(req, FakeMatrix(), gpus=None, cores=16).parallel == 4  # CPU: 4 ranks a probe
    assert auto_parallel(req, FakeMatrix(), gpus=None, cores=2).parallel == 1
