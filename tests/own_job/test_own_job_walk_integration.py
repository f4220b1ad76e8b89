"""Issue #29, "Done means": a small DeepSpeed job that needs a package through REQUIREMENTS= (a local
wheel built here), launched with torchrun, surveyed over two DeepSpeed releases on the torch 2.1
CPU twin (0.13.0 a layered release env over the env's 0.13.1); a bisect of the same pair, where
both ends are bad (no transition); `make issue` on the survey and on the bisect names the command
and the package and no host path (the `make run` folder's ISSUE.md is checked in
test_job_deps_integration.py); a report over the survey and a `make run` folder of another job
shows both commands and both reproduce lines."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.classifier_job import make, write_project
from tests.fixtures.wheels import build_wheel

pytestmark = pytest.mark.integration
COMMAND = "torchrun --nproc_per_node 2 train_with_dep.py"
WRAPPER = """\
import runpy
import sys

import mics_repro_walkdep  # what REQUIREMENTS= brings: the job fails without it

sys.argv[0] = "train_classifier.py"
runpy.run_path("train_classifier.py", run_name="__main__")
"""


def test_own_job_survey_issue_and_report(
    tmp_path: Path, classifier_run: tuple[Path, str, dict[str, Any]]
) -> None:
    wheel = build_wheel(tmp_path / "wheels", "mics_repro_walkdep", "1.0", "VALUE = 1\n")
    work = write_project(tmp_path / "job")
    (work / "train_with_dep.py").write_text(WRAPPER)
    (work / "requirements.txt").write_text(f"{wheel}\n")

    def walk(command: str, ends: tuple[str, str], out: Path) -> subprocess.CompletedProcess[str]:
        """`make survey|bisect` of the job over the pair 0.13.0, 0.13.1 on the cpu env."""
        return make(
            command, "AXIS=deepspeed", *ends, "VERSIONS=0.13.0,0.13.1", "ENV=cpu", f"WORKDIR={work}",
            f"REQUIREMENTS={work / 'requirements.txt'}", f"OUT={out}", f"CMD={COMMAND}",
        )  # fmt: skip

    out = tmp_path / "survey"
    done = walk("survey", ("FROM=0.13.0", "TO=0.13.1"), out)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    survey = json.loads((out / "survey.json").read_text())
    assert survey["scenario"] == "custom" and survey["job"]["command"] == COMMAND
    outcomes = {p["version"]: (p["outcome"], p["signature"]) for p in survey["probes"]}
    assert set(outcomes) == {"0.13.0", "0.13.1"}
    assert all(o not in ("env-error", "interrupted") for o, _ in outcomes.values()), outcomes  # all judged
    assert "mics/stock" not in done.stdout
    done = make("issue", f"RESULTS={out}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    text = (out / "ISSUE.md").read_text()
    assert COMMAND in text and "mics_repro_walkdep" in text and str(tmp_path) not in text
    assert "WORKDIR=<your job folder>" in text
    # Both releases have the bug: a bisect of the pair finds no transition, and its ISSUE.md still
    # names the job, its package and what to run next, with no host path.
    assert {o for o, _ in outcomes.values()} == {"reproduced"}, outcomes
    bisect_out = tmp_path / "bisect"
    done = walk("bisect", ("GOOD=0.13.0", "BAD=0.13.1"), bisect_out)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    bisect = json.loads((bisect_out / "bisect.json").read_text())
    assert bisect["first_bad"] is None and bisect["next"]["lines"], bisect
    done = make("issue", f"RESULTS={bisect_out}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    text = (bisect_out / "ISSUE.md").read_text()
    assert COMMAND in text and "mics_repro_walkdep" in text and str(tmp_path) not in text
    assert "Traceback" not in done.stdout + done.stderr
    other, _, _ = classifier_run
    report = tmp_path / "report"
    done = make("report", f"RESULTS={out},{other}", f"OUT={report}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    md = (report / "REPORT.md").read_text()
    assert COMMAND in md and "train_classifier.py" in md
    assert md.count("Reproduce ") >= 2
