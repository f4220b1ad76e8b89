"""A job whose program cannot start (exit 127/126) is an env-error that names the program and the
fix (repro/workload/judge.py), and a survey whose releases could not run says so instead of a bare
"no change" (repro/bisect/output.py). Issue #29 item 1: `torchrun` missing from the layer venvs made
every release but the env's own "unknown" with only "exit 127" as the reason."""

from __future__ import annotations

from typing import Any

import pytest

from repro.bisect.output import survey_summary
from repro.workload import judge, ladder


def _judge(log: str, exit_code: int) -> ladder.Judgement:
    return judge.judge(
        judge.parse(log), patch="stock", exit_code=exit_code, status=None, used_deepspeed=False
    )


@pytest.mark.parametrize(
    ("log", "program", "words"),
    [
        ("bash: line 1: torchrun: command not found\n", "torchrun", "python -m torch.distributed.run"),
        ("sh: 1: deepspeed: not found\n", "deepspeed", "PACKAGES="),  # dash
        ("bash: torchrun: command not found\n", "torchrun", "PACKAGES="),  # bash before 5.1
        ("[rank0]: hello\n./launch.sh: line 3: torchrun: command not found\n", "torchrun", "PACKAGES="),
    ],
)
def test_a_program_that_is_not_found_is_named_with_the_fix(log: str, program: str, words: str) -> None:
    verdict = _judge(log, 127)
    assert verdict.outcome == "env-error" and verdict.signature == "none"
    assert f"{program!r}" in verdict.reason and "exit 127" in verdict.reason
    assert words in verdict.reason


def test_a_script_that_cannot_be_started_says_why() -> None:
    bad = "bash: line 1: ./train.py: /opt/gone/bin/python: bad interpreter: No such file or directory\n"
    verdict = _judge(bad, 126)
    assert verdict.outcome == "env-error"
    assert "'./train.py'" in verdict.reason and "/opt/gone/bin/python" in verdict.reason
    assert "python <script>" in verdict.reason
    denied = _judge("bash: line 1: ./run.sh: Permission denied\n", 126)
    assert "'./run.sh'" in denied.reason and "executable" in denied.reason


def test_hostile_and_unrelated_lines_name_nothing() -> None:
    # Only the shell's own words, and only for exit 127/126: a training log that mentions
    # "not found" is not a missing program.
    assert judge.parse("checkpoint: /ckpt/latest: not found, starting fresh\n").missing_program is None
    assert _judge("bash: line 1: torchrun: command not found\n", 1).outcome == "crashed"
    hostile = _judge("bash: line 1: $(rm -rf ~)\x1b[2J: command not found\n", 127)
    assert hostile.outcome == "env-error" and "\\x1b" in hostile.reason  # quoted, not a terminal code
    huge = _judge("bash: line 1: " + "x" * 100_000 + ": command not found\n", 127)
    assert huge.outcome == "env-error" and len(huge.reason) < 1000  # too long to be a name: exit code only


def _survey(unknown: list[str], reason: str) -> dict[str, Any]:
    names = ["0.12.6", "0.13.0", "0.13.1"]
    rows = [{"version": n, "reason": reason if n in unknown else "ok"} for n in names]
    return {
        "axis": "deepspeed",
        "env": "cpu",
        "scenario": "custom",
        "patch": "stock",
        "probe_count": 3,
        "candidates": names,
        "envs_built": 2,
        "envs_reused": 1,
        "segments": [{"from": "0.13.1", "to": "0.13.1", "outcome": "clean", "signature": "none"}],
        "change_points": [],
        "unknown": unknown,
        "every": True,
        "probes": rows,
    }


def test_a_survey_with_unknown_releases_does_not_claim_no_change() -> None:
    why = "the command could not run in this env: 'torchrun': command not found (exit 127); ..."
    text = "\n".join(survey_summary(_survey(["0.12.6", "0.13.0"], why)))
    assert "between the probed releases" not in text
    assert "1 of 3 releases that ran" in text
    assert f"0.12.6, 0.13.0: {why}" in text
    clean = "\n".join(survey_summary(_survey([], "")))
    assert "no change of outcome or signature between the probed releases" in clean
