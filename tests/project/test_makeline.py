"""The one builder of "the make line that reproduces this" and its users: results.json (run
commands), probe rows, bisect/survey resume lines and bundles print lines a shell can run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from repro.bisect.probe import ProbeSpec
from repro.cli import main as cli
from repro.core.makeline import make_line
from repro.engines import base as engines
from repro.workload.record import empty_record, write_json_atomic
from tests.fixtures.stand_in_engine import StandInEngine


def test_only_given_values_appear_in_order() -> None:
    line = make_line(
        "repro", [("ENV", "cpu"), ("TORCH", None), ("DTYPE", ""), ("EVERY", False), ("STEPS", 3)]
    )
    assert line == "make repro ENV=cpu STEPS=3"


def test_zero_is_a_value_not_a_missing_one() -> None:
    # 0 == False in Python: a naive `value in (None, "", False)` would drop STEPS=0.
    assert make_line("repro", [("STEPS", 0), ("TIMEOUT", 0.0)]) == "make repro STEPS=0 TIMEOUT=0.0"


def test_ordinary_values_are_unquoted_and_odd_ones_are_quoted() -> None:
    line = make_line(
        "repro",
        [("SCENARIOS", "mics,mics-hier"), ("ENV", "cpu+torch2.2.2"), ("CONFIG", "my configs/ds.json")],
    )
    assert line == "make repro SCENARIOS=mics,mics-hier ENV=cpu+torch2.2.2 CONFIG='my configs/ds.json'"
    assert shlex.split(line)[-1] == "CONFIG=my configs/ds.json"


def test_probe_repro_command() -> None:
    spec = ProbeSpec(env_id="cpu", torch="2.1.0", deepspeed="0.12.6", transport="sync", steps=4)
    assert spec.repro_command() == (
        "make repro ENV=cpu TORCH=2.1.0 DEEPSPEED=0.12.6 SCENARIOS=mics PATCH=stock TRANSPORT=sync STEPS=4"
    )


class OneRunEngine(StandInEngine):
    name = "one run"

    def run_suite(self, prepared: Any, args: Any, out_dir: Path, timeout_s: float) -> engines.SuiteRun:
        run = empty_record(
            env=prepared.env_id,
            run_name="zero3-stock",
            scenario="zero3",
            patch="stock",
            transport="async",
            outcome="clean",
            signature="none",
        )
        write_json_atomic(str(out_dir / "suite.json"), {"env": prepared.env_id, "runs": [run]})
        return engines.SuiteRun(0, False, 0.1, out_dir, None)


@pytest.mark.parametrize(
    "argv,expected",
    [
        (
            ["repro", "--env", "cpu", "--steps", "3", "--world-size", "2"],
            "make repro ENV=cpu STEPS=3 WORLD_SIZE=2",
        ),
        (
            ["check-fix", "--env", "cpu", "--patch", "fixed", "--transport", "sync"],
            "make check-fix ENV=cpu PATCH=fixed TRANSPORT=sync",
        ),
    ],
)
def test_results_json_names_the_make_line_of_the_run(
    argv: list[str], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("repro.cli.run_commands._engine", lambda choice: OneRunEngine())
    out = tmp_path / "out"
    cli.main([*argv, "--out", str(out), "--results-root", str(tmp_path / "results")])
    assert json.loads((out / "results.json").read_text())["invocation"]["command"] == expected
