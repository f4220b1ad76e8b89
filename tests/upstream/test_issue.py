"""`make issue`: ISSUE.md from a bisect or survey folder, scrubbed like a bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from repro.core.errors import UsageError
from repro.core.scrub import Scrubber
from repro.upstream.issue import make as issue
from tests.fixtures.bisect_entries import bisect_entry, commit_entry, commits_entry, probe_entry

HOME = "/home/alice"
# faulthandler's dump (most recent call first), with a helper thread before the running one.
HELPER = (
    'Thread 0x01 (most recent call first):\n  File "/usr/lib/python3.11/threading.py", line 324 in wait\n\n'
)
STACK_WAIT = (
    HELPER + "Current thread 0x02 (most recent call first):\n"
    '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
    '  File "/home/alice/venv/deepspeed/comm/torch.py", line 206 in all_reduce_coalesced\n'
    '  File "/home/alice/venv/deepspeed/runtime/zero/mics.py", line 426 in allreduce_mics_shard_grads\n'
)
STACK_ON = (
    HELPER + "Current thread 0x02 (most recent call first):\n"
    '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
    '  File "/home/alice/venv/deepspeed/comm/torch.py", line 317 in reduce_scatter_tensor\n'
    '  File "/home/alice/venv/deepspeed/runtime/zero/stage3.py", line 1731 in __avg_scatter_grads\n'
)


def probe(version: str, outcome: str, verdict: str, record: str | None = None) -> dict[str, Any]:
    versions = {"python": "3.11.7", "torch": "2.13.0", "deepspeed": "0.19.3+abc", "hip": None}
    reason = f"{outcome} in {HOME}/results"
    return probe_entry(version, outcome, verdict, record, reason=reason, env="cpu-latest", versions=versions)


def commit(short: str, subject: str, pr: int | None) -> dict[str, Any]:
    url = f"https://github.com/deepspeedai/DeepSpeed/pull/{pr}" if pr else None
    return commit_entry(short, subject, date="2026-01-01T00:00:00+00:00", pr=pr, pr_url=url)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    out = tmp_path / "bisect-1"
    run = out / "cpu-latest" / "runs" / "mics-replica-fixed"
    run.mkdir(parents=True)
    (run / "record.json").write_text(
        json.dumps({"stacks": {"0": STACK_WAIT, "1": STACK_ON, "2": STACK_WAIT}})
    )
    (out / "results.json").write_text("{}")
    bad_probe = probe("02663d6", "hung", "bad", "cpu-latest/runs/mics-replica-fixed/record.json")
    good_probe = probe("1111111", "clean", "good")
    first_bad_commit = {**commit("02663d6", "MiCS: replica groups (#8060)", 8060), "files": " mics.py | 4 +-"}
    reproduce = {
        "make": f"make probe ENV=cpu-latest DS_REPO={HOME}/DeepSpeed DEEPSPEED_COMMIT=02663d6",
        "pip": "DS_BUILD_OPS=0 pip install --no-deps --no-build-isolation 'git+https://github.com/deepspeedai/DeepSpeed@02663d6'",
        "command": None,
    }
    commits = commits_entry(
        bad_probe,
        good_probe,
        (first_bad_commit, commit("1111111", "Docs (#8000)", 8000)),
        reproduce,
        first_bad="02663d6",
        last_good="1111111",
    )
    data = bisect_entry(
        "cpu-latest",
        "0.19.3",
        "0.19.2",
        (probe("0.19.3", "hung", "bad"), probe("0.19.2", "clean", "good")),
        probes=[probe("0.19.0", "clean", "good"), probe("0.19.3", "hung", "bad")],
        repro_command="make repro ENV=cpu-latest DEEPSPEED=0.19.3",
        commits=commits,
    )
    (out / "bisect.json").write_text(json.dumps(data))
    return out


def scrubber() -> Scrubber:
    return Scrubber.from_host({}, home=HOME, hostnames=["gpubox17"], user="alice")


def test_issue_names_the_commit_and_its_pr(folder: Path) -> None:
    text = issue.write(folder, scrubber()).read_text()
    first = text.splitlines()[0]
    assert first.startswith("# MiCS (mics-replica, fixed): hung since 02663d6")
    assert "PR #8060: https://github.com/deepspeedai/DeepSpeed/pull/8060" in text
    assert " mics.py | 4 +-" in text
    assert "git+https://github.com/deepspeedai/DeepSpeed@02663d6" in text
    assert "| torch | `2.13.0` |" in text and "| bad means | `BAD_IF=failed` |" in text
    # Probes of both stages, release then commit.
    assert "| deepspeed | `0.19.0` | clean" in text and "| deepspeed-commit | `02663d6` | hung" in text


def test_hang_stacks_are_grouped_by_where_the_ranks_are(folder: Path) -> None:
    text = issue.render(folder, scrubber())
    # Named by the innermost DeepSpeed frame: the wait below it is the same on every rank.
    assert 'ranks 0, 2: File "deepspeed/comm/torch.py", line 206 in all_reduce_coalesced' in text
    assert 'ranks 1: File "deepspeed/comm/torch.py", line 317 in reduce_scatter_tensor' in text
    assert "line 324 in wait" not in text  # only the running thread's stack is shown


def test_nothing_of_the_host_is_left(folder: Path) -> None:
    text = issue.render(folder, scrubber())
    assert "alice" not in text and HOME not in text
    assert str(folder) not in text
    # A venv run cannot be bundled (exit 16): the lines that make a Docker run and bundle it.
    assert "make repro ENGINE=docker ENV=cpu-latest DEEPSPEED=0.19.3" in text
    assert "make bundle ENV=cpu-latest RESULTS=results/latest" in text
    assert scrubber().leaks(text) == []


def test_a_survey_folder_lists_its_change_points(tmp_path: Path) -> None:
    (tmp_path / "survey.json").write_text(
        json.dumps(
            {
                "kind": "survey",
                "axis": "deepspeed",
                "env": "cpu-latest",
                "scenario": "mics-replica",
                "patch": "fixed",
                "command": "make survey AXIS=deepspeed FROM=0.19.0 TO=0.19.6",
                "change_points": [
                    {
                        "before": "0.19.2",
                        "after": "0.19.3",
                        "outcome_before": "clean",
                        "outcome_after": "hung",
                        "signature_before": "none",
                        "signature_after": "hang",
                        "unknown_between": [],
                    }
                ],
                "probes": [probe("0.19.2", "clean", ""), probe("0.19.3", "hung", "")],
            }
        )
    )
    text = issue.render(tmp_path, scrubber())
    # The title says the transition, not only the release where it ends up.
    assert text.startswith("# MiCS (mics-replica, fixed): hung (hang) from DeepSpeed 0.19.3 (0.19.2: clean)")
    assert "- 0.19.2 -> 0.19.3: clean/none -> hung/hang" in text


def test_a_folder_without_a_walk_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="none of bisect.json, survey.json or results.json"):
        issue.render(tmp_path, scrubber())
