"""Issue 19 end to end: a real small DeepSpeed job of the user's own (not our suite) through
`make run` on the CPU twin (torch 2.1.0 + DeepSpeed 0.13.1, venv engine). The summary line, the
check-fix answer (its exit code), the report's answer and a bundle's issue comment say the same
thing; and `make report` over two folders of two different jobs finds both jobs' runs.

The bundle is made by the product's `make_bundle` from these real records; only the image side is
the fake docker-py client of the bundle tests (a venv run has no image to pack), so the folder's
env is marked as a Docker run of that fake image first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from repro.core.verdict import FixVerdict, Reproduces, Subject, check_fix, env_verdicts
from tests.fixtures.classifier_job import COMMAND, make, run_job

pytestmark = pytest.mark.integration


def _run(project: Path, out: Path, command: str = COMMAND) -> tuple[str, list[dict[str, Any]]]:
    stdout, results = run_job(project, out, command)
    return stdout, results["runs"]


@pytest.fixture
def first_job(classifier_run: tuple[Path, str, dict[str, Any]]) -> tuple[Path, str, list[dict[str, Any]]]:
    # The same `make run` as test_job_integration's: made once per session (tests/fixtures).
    out, stdout, results = classifier_run
    return out, stdout, results["runs"]


def test_summary_check_fix_report_and_issue_comment_agree(
    first_job: tuple[Path, str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    out, stdout, runs = first_job
    [verdict] = env_verdicts(runs)
    assert (verdict.reproduces, verdict.fixed, verdict.subject) == (
        Reproduces.YES,
        FixVerdict.YES,
        Subject.OWN_JOB,
    )
    headline = verdict.headline()
    assert headline == "cpu (your command): REPRODUCED; fix resolves it"
    # Every custom record says what it ran on (the hook, in each process of the process group).
    assert {r["ran_on"]["device"] for r in runs} == {"cpu"} and all(r["ran_on"]["joined_group"] for r in runs)
    # 1. the summary `make run` printed
    summary = stdout.split("\nverdict:\n", 1)[1].splitlines()
    assert summary[0].strip() == headline
    # 2. check-fix: the same verdict's answer and exit code
    assert check_fix(runs).exit_code == 0
    # 3. the report
    done = make("report", f"RESULTS={out}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [answer] = json.loads((out / "report.json").read_text())["headline"]
    assert (answer["reproduces"], answer["fixed"], answer["headline"]) == ("yes", "yes", headline)
    # 4. a bundle's issue comment
    comment = _bundle_comment(out, tmp_path)
    assert f"**Verdict:** {headline}" in comment


def _bundle_comment(results: Path, tmp_path: Path) -> str:
    from repro.core.scrub import Scrubber
    from repro.upstream.bundle import make as bundle
    from tests.fixtures.fake_bundle_docker import SOURCE_ID, SOURCE_TAG, FakeClient

    folder = tmp_path / "as-docker"
    shutil.copytree(results, folder)
    data = json.loads((folder / "results.json").read_text())
    data["envs"]["cpu"].update(engine="docker", image_id=SOURCE_ID)
    (folder / "results.json").write_text(json.dumps(data))
    client = FakeClient()
    client.add_source_image(SOURCE_ID, SOURCE_TAG)
    request = bundle.BundleRequest(env_id="cpu", out=tmp_path / "bundle", results=folder, archive=False)
    made = bundle.make_bundle(request, client, Scrubber.from_host(paths={}), say=lambda _line: None)
    return (made.folder / "ISSUE_COMMENT.md").read_text()


def test_merging_two_folders_of_two_jobs_reports_both(
    first_job: tuple[Path, str, list[dict[str, Any]]],
    classifier_project: Path,
    tmp_path: Path,
) -> None:
    first, _stdout, _runs = first_job
    second = tmp_path / "b"
    _run(classifier_project, second, COMMAND + " --second-job")  # the script ignores its arguments
    out = tmp_path / "report"
    done = make("report", f"RESULTS={first},{second}", f"OUT={out}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((out / "report.json").read_text())
    jobs = [row for row in data["table"] if row["scenario"] == "custom"]
    assert len(jobs) == 2 and len({row["job"] for row in jobs}) == 2
    assert all(row["stock"]["outcome"] == "reproduced" and row["fixed"]["outcome"] == "clean" for row in jobs)
    [answer] = data["headline"]
    assert answer["headline"] == "cpu (your command): REPRODUCED; fix resolves it"
