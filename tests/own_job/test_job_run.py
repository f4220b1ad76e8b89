"""`python -m repro run` on the host side with a fake engine: one run per patch, judged against
each other, recorded in results.json (scenario custom, the command, the workdir digest, the
patterns that decided) and shown by the summary."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from repro.core.errors import UsageError
from repro.core.fix_pairs import PairStatus
from repro.core.results import InvocationDir, invocation_meta
from repro.core.verdict import FixVerdict, Reproduces, Subject, env_verdicts
from repro.engines.base import EngineKind, Prepared, SuiteRun
from repro.matrix.schema import load_matrix
from repro.run.job import JobRequest, custom_lines, execute_job, job_args, workdir_digest
from tests.fixtures.fake_job import VenvJobEngine


def test_each_patch_runs_once_and_both_records_land_in_results(tmp_path: Path) -> None:
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    env = load_matrix().get("cpu")
    request = JobRequest(env_id="cpu", command="torchrun --nproc_per_node 2 train.py", workdir=work)
    engine = VenvJobEngine()
    invocation = InvocationDir(tmp_path / "out", invocation_meta(["run"], "make run"))
    (tmp_path / "out").mkdir()
    records = execute_job(request, env, engine, invocation, say=lambda _: None)
    assert [c[c.index("--patch") + 1] for c in engine.calls] == ["stock", "fixed"]
    assert all(c[c.index("--device") + 1] == "cpu" for c in engine.calls)
    saved = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    assert [r["patch"] for r in saved] == ["stock", "fixed"] and saved == [dict(r) for r in records]
    stock, fixed = saved
    assert (stock["outcome"], stock["signature"], stock["first_divergent_step"]) == (
        "reproduced",
        "illegal-work-divergence",
        1,
    )
    assert (fixed["outcome"], fixed["fix"]) == ("clean", {"applied": True, "fix_id": "abc"})
    for record in saved:
        assert record["scenario"] == "custom" and record["dtype"] == "fp16" and record["world_size"] == 2
        assert record["job"]["workdir_digest"] == workdir_digest(work)
        assert record["job"]["patterns"]["loss"]["name"] == "generic"
        assert record["logs"]["job"] == f"cpu/custom-{record['patch']}/job.log"
    # The conclusion under the summary is the env verdict's pair of this job (defect 1 of issue 19).
    [verdict] = env_verdicts(records)
    assert (verdict.reproduces, verdict.fixed, verdict.subject) == (
        Reproduces.YES,
        FixVerdict.YES,
        Subject.OWN_JOB,
    )
    assert custom_lines(records)[-1].startswith(f"=> {PairStatus.RESOLVED.value}:")


def test_digest_changes_with_content(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    first = workdir_digest(tmp_path)
    assert workdir_digest(tmp_path) == first
    (tmp_path / "a.py").write_text("x = 2\n")
    assert workdir_digest(tmp_path) != first


def test_request_checks(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        JobRequest(env_id="cpu", command="  ", workdir=tmp_path)
    with pytest.raises(UsageError):
        JobRequest(env_id="cpu", command="true", patches=("patched",), workdir=tmp_path)
    with pytest.raises(UsageError):
        JobRequest(env_id="cpu", command="true", workdir=tmp_path / "missing")
    with pytest.raises(UsageError):
        JobRequest(env_id="cpu", command="true", workdir=tmp_path, loss_regex="(")
    args = job_args(JobRequest(env_id="cpu", command="true", workdir=tmp_path), "fixed", "gpu")
    assert args[args.index("--workdir") + 1] == str(tmp_path.resolve())


def test_shell_execs_an_interactive_shell_with_the_hook_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from repro.cli import job_commands
    from repro.cli.main import main

    class Engine(VenvJobEngine):
        def prepare(self, env: Any) -> Prepared:
            return Prepared(EngineKind.VENV, env.id, "/venvs/cpu", "cpu venv", True, {"platform": "cpu"})

    seen: dict[str, Any] = {}

    def fake_exec(path: str, argv: list[str], env: dict[str, str]) -> None:
        seen.update(path=path, argv=argv, env=env)

    monkeypatch.setattr(job_commands, "_engine", lambda choice, shell=False: Engine())
    monkeypatch.setattr(job_commands.os, "execvpe", fake_exec)
    monkeypatch.setenv("SHELL", "/bin/bash")
    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path))
    assert main(["shell", "--env", "cpu", "--patch", "fixed"]) == 0
    env = seen["env"]
    assert (
        seen["argv"][0] == "/bin/bash" and seen["argv"][-1] == "-i"
    )  # with our rc file (tests/own_job/test_shell_rc.py)
    assert env["PATH"].split(":")[0] == "/venvs/cpu/bin"
    assert (env["MICS_REPRO_HOOK"], env["MICS_REPRO_PATCH"], env["MICS_REPRO_DEVICE"]) == (
        "1",
        "fixed",
        "cpu",
    )
    assert env["PYTHONPATH"].split(":")[0].endswith("repro/workload/hook")


class OneRankEngine(VenvJobEngine):
    """The job's launcher started one rank where its command asked for two (accelerate launch
    without --multi_gpu on a host without GPUs)."""

    def run_job(
        self, prepared: Prepared, args: Sequence[str], out_dir: Path, *rest: Any, **kw: Any
    ) -> SuiteRun:
        run = super().run_job(prepared, args, out_dir, *rest, **kw)
        job = json.loads((out_dir / "job.json").read_text())
        job["hook_reports"][0]["engine"]["world_size"] = 1
        (out_dir / "job.json").write_text(json.dumps(job))
        return run


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("accelerate launch --num_processes 2 loop.py", "add --multi_gpu"),
        ("torchrun --nproc_per_node 2 loop.py", "check the launcher's arguments"),
    ],
)
def test_a_job_that_started_fewer_ranks_than_it_asked_for_is_told_so(
    tmp_path: Path, command: str, says: str
) -> None:
    work = tmp_path / "proj"
    work.mkdir()
    env = load_matrix().get("cpu")
    request = JobRequest(env_id="cpu", command=command, workdir=work)
    invocation = InvocationDir(tmp_path / "out", invocation_meta(["run"], "make run"))
    (tmp_path / "out").mkdir()
    records = execute_job(request, env, OneRankEngine(), invocation, say=lambda _: None)
    for record in records:
        [note] = [n for n in record["job"]["notes"] if "asks for 2 ranks" in n]
        assert "but 1 started" in note and says in note
    assert any("asks for 2 ranks" in line and says in line for line in custom_lines(records))
    two = execute_job(
        request,
        env,
        VenvJobEngine(),
        InvocationDir(tmp_path / "two", invocation_meta(["run"], "m")),
        say=lambda _: None,
    )
    assert not any("asks for" in n for r in two for n in r["job"]["notes"])
