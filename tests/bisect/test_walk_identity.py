"""Issue #29 items 4 and 5: a walk (survey, bisect) of the user's own command keeps its identity
(scenario `custom`, its command and job id) in what it prints and saves, says in one line why a
stock-only probe's signature differs from `make run`'s, and a bisect without a transition says
what to run next. Through the real driver and job judge, with the fake matrix and job engine."""

from __future__ import annotations

import json
from pathlib import Path

from repro.cli import bisect_commands as bisect_cli
from repro.workload.record import custom_job_id
from tests.fixtures.fake_bisect import FakeMatrix, parse
from tests.fixtures.fake_job import FakeJobEngine, always_bad

CMD = "torchrun --nproc_per_node 2 train.py --deepspeed ds_config.json"


def walk(tmp_path: Path, command: str, extra: list[str], engine: FakeJobEngine) -> tuple[dict, list[str]]:
    work = tmp_path / "proj"
    work.mkdir(exist_ok=True)
    argv = [
        "--axis", "deepspeed", "--versions", "0.12.3,0.12.6,0.13.0,0.13.1",
        *extra,
        "--cmd", CMD, "--workdir", str(work),
        "--out", str(tmp_path / "out"), "--results-root", str(tmp_path / "results"),
    ]  # fmt: skip
    lines: list[str] = []
    services = bisect_cli.Services(matrix=FakeMatrix(), engine=engine, say=lines.append)
    run = {"bisect": bisect_cli.run_bisect, "survey": bisect_cli.run_survey}[command]
    assert run(parse(command, argv), services) == 0
    return json.loads((tmp_path / "out" / f"{command}.json").read_text()), lines


def test_a_survey_of_the_users_command_names_it_not_mics(tmp_path: Path) -> None:
    data, lines = walk(tmp_path, "survey", ["--from", "0.12.6", "--to", "0.13.1"], FakeJobEngine())
    job_id = custom_job_id(CMD, str((tmp_path / "proj").resolve()))
    assert data["scenario"] == "custom"
    assert data["job"]["command"] == CMD and data["job"]["job_id"] == job_id
    # The records the survey made are the same job: the report and the issue find them by it.
    runs = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    assert {r["job"]["job_id"] for r in runs} == {job_id}
    printed = "\n".join(lines)
    assert "mics/stock" not in printed
    label = data["job"]["label"]
    assert label.startswith("`torchrun --nproc_per_node 2 train.py") and label.endswith(f"(job {job_id})")
    assert f"custom {label}/stock" in printed
    # Stock-only: warnings, not divergence; one line says why.
    assert {p["signature"] for p in data["probes"]} >= {"illegal-work-warnings"}
    assert data["signature_note"] and "fixed run to compare" in data["signature_note"]
    assert sum("fixed run to compare" in line for line in lines) == 1


def test_a_bisect_of_the_users_command_names_it(tmp_path: Path) -> None:
    data, lines = walk(tmp_path, "bisect", ["--from", "0.12.3", "--to", "0.13.1"], FakeJobEngine())
    assert data["status"] == "found" and data["scenario"] == "custom"
    assert data["job"]["command"] == CMD
    assert data["command"].startswith("make bisect AXIS=deepspeed FROM=0.12.3 TO=0.13.1")
    assert "SCENARIO=" not in data["command"]  # the user's command runs no scenario of ours
    assert not any("mics/stock" in line for line in lines)


def test_a_bisect_with_both_ends_bad_says_what_to_run_next(tmp_path: Path) -> None:
    data, lines = walk(tmp_path, "bisect", ["--from", "0.12.6", "--to", "0.13.1"], FakeJobEngine(always_bad))
    assert data["status"] == "no-transition"
    steps = data["next"]
    assert steps["earlier"] == ["0.12.3"] and "older than 0.12.6" in steps["why"]
    widen, torch_axis = steps["lines"]
    # Runnable: the same bisect from an older release the index has, and the torch axis.
    assert widen.startswith("make bisect AXIS=deepspeed FROM=0.12.3 TO=0.12.6 ")
    assert f"CMD='{CMD}'" in widen
    assert torch_axis.startswith(
        "make bisect AXIS=torch GOOD=2.0.1 BAD=2.1.0 BAD_IF=reproduced DEEPSPEED=0.12.6"
    )
    printed = "\n".join(lines)
    assert widen in printed and torch_axis in printed


def test_a_bisect_with_both_ends_good_says_what_to_run_next(tmp_path: Path) -> None:
    data, _ = walk(tmp_path, "bisect", ["--from", "0.12.3", "--to", "0.12.6"], FakeJobEngine())
    assert data["status"] == "no-transition"
    assert "newer than 0.12.6" in data["next"]["why"]
    assert data["next"]["lines"][0].startswith("make bisect AXIS=deepspeed FROM=0.12.6 TO=0.13.1 ")


def test_a_probe_of_the_users_command_names_it(tmp_path: Path) -> None:
    import argparse

    work = tmp_path / "proj"
    work.mkdir()
    parser = argparse.ArgumentParser()
    bisect_cli._probe_options(parser)
    argv = ["--env", "cpu", "--deepspeed", "0.13.1", "--cmd", CMD, "--workdir", str(work)]
    argv += ["--out", str(tmp_path / "out"), "--results-root", str(tmp_path / "results")]
    args = parser.parse_args(argv)
    args.argv = ["probe", *argv]
    lines: list[str] = []
    services = bisect_cli.Services(matrix=FakeMatrix(), engine=FakeJobEngine(), say=lines.append)
    bisect_cli.run_probe(args, services)
    data = json.loads((tmp_path / "out" / "probe.json").read_text())
    assert data["scenario"] == "custom" and data["job"]["command"] == CMD
    said = [line for line in lines if line.startswith("probe: ")]
    assert said and f"custom {data['job']['label']}/stock" in said[0]
