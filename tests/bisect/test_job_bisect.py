"""`make bisect AXIS=deepspeed ... CMD=...`: a bisection over DeepSpeed releases that probes the
user's command (repro/run/job.py) instead of our suite, through the real driver and orchestration
with the fake matrix of tests/bisect/test_bisect.py and an engine whose jobs print what a DeepSpeed job
prints (IllegalWork messages from 0.13.0 on, where PR #4792 started catching the exception)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from repro.cli import bisect_commands as bisect_cli
from tests.fixtures.fake_bisect import FakeEnv, FakeMatrix, parse
from tests.fixtures.fake_job import BAD_LOG, CLEAN_LOG, FakeJobEngine, WithPackages  # noqa: F401

# The engine whose command prints IllegalWork messages from DeepSpeed 0.13.0 on is shared with the
# walk tests of #29 (tests/fixtures/fake_job.py).


@pytest.mark.parametrize("pythonpath", [None, "/opt/deps"])
def test_bisect_over_deepspeed_with_a_custom_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pythonpath: str | None
) -> None:
    # The user's PYTHONPATH reaches the job (venv engine), so the first-bad line carries it.
    if pythonpath is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", pythonpath)
    work = tmp_path / "proj"
    work.mkdir()
    args = parse(
        "bisect",
        [
            "--axis",
            "deepspeed",
            "--versions",
            "0.12.3,0.12.6,0.13.0,0.13.1,0.14.0",
            "--from",
            "0.12.3",
            "--to",
            "0.14.0",
            "--cmd",
            "torchrun --nproc_per_node 2 train.py",
            "--workdir",
            str(work),
            "--out",
            str(tmp_path / "out"),
            "--results-root",
            str(tmp_path / "results"),
        ],
    )
    engine = FakeJobEngine()
    lines: list[str] = []
    services = bisect_cli.Services(matrix=FakeMatrix(), engine=engine, say=lines.append)
    assert bisect_cli.run_bisect(args, services) == 0
    data = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert (data["status"], data["last_good"], data["first_bad"]) == ("found", "0.12.6", "0.13.0")
    assert engine.commands and set(engine.commands) == {"torchrun --nproc_per_node 2 train.py"}
    assert data["evidence"]["first_bad"]["signature"] == "illegal-work-warnings"
    # The first bad is reproduced by probing the same command in the same env.
    prefix = f"PYTHONPATH={pythonpath} " if pythonpath else ""
    assert data["repro_command"].startswith(f"{prefix}make probe ENV=cpu DEEPSPEED=0.13.0 PATCH=stock CMD=")
    runs = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    assert runs and {r["scenario"] for r in runs} == {"custom"}
    assert all(p["record"] and p["record"].endswith("/job.json") for p in data["probes"])


def test_bisect_of_a_command_with_its_own_packages(tmp_path: Path, monkeypatch: Any) -> None:
    """PACKAGES= reaches every candidate: each probe layers the command's packages over its env,
    and the first bad one's reproduce line repeats them."""
    import pytest

    monkeypatch.setattr(FakeEnv, "package_pins", FakeEnv.pins, raising=False)
    work = tmp_path / "proj"
    work.mkdir()

    argv = [
        "--axis",
        "deepspeed",
        "--versions",
        "0.12.6,0.13.0,0.13.1",
        "--from",
        "0.12.6",
        "--to",
        "0.13.1",
        "--cmd",
        "torchrun train.py",
        "--workdir",
        str(work),
        "--packages",
        "their-pkg==0.3",
        "--out",
        str(tmp_path / "out"),
        "--results-root",
        str(tmp_path / "results"),
    ]
    engine = WithPackages()
    services = bisect_cli.Services(matrix=FakeMatrix(), engine=engine, say=lambda _: None)
    assert bisect_cli.run_bisect(parse("bisect", argv), services) == 0
    data = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert data["first_bad"] == "0.13.0" and "PACKAGES=their-pkg==0.3" in data["repro_command"]
    assert engine.layered and all(lines == ("their-pkg==0.3",) for _, lines in engine.layered)
    runs = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    assert all(r["job"]["requirements"]["added"] == {"their-pkg": "0.3"} for r in runs)
    # Packages without a command of one's own: refused at the front door.
    with pytest.raises(bisect_cli.UsageError):
        bisect_cli.probe_options(
            parse("bisect", [a for a in argv if a not in ("--cmd", "torchrun train.py")])
        )


def test_a_custom_probe_line_names_the_engine_it_ran_in() -> None:
    # Copied as printed, the first-bad line must run where the probe ran (Docker or venv).
    from repro.bisect.probe import ProbeSpec

    options = ProbeSpec(env_id="cpu", engine="docker", command="python train.py", packages="six==1.16.0")
    line = options.repro_command()
    assert "ENGINE=docker" in line.split() and "PACKAGES=six==1.16.0" in line.split()
    assert "ENGINE=" not in ProbeSpec(env_id="cpu", command="python train.py").repro_command()
