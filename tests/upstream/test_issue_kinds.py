"""Issue #29 item 3: `make issue` (and the report) over every kind of results folder, built by the
real orchestration with the test fakes: a run and a custom run, a survey (with a change, with
unknown probes, interrupted), a bisect with and without a transition, a release -> commit bisect.
Every template renders (StrictUndefined), nothing contradicts its own table, and a custom job's
ISSUE.md names its command, files, packages, DeepSpeed config, #5080 and the fix, with no host path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from repro.cli import bisect_commands as bisect_cli
from repro.core.errors import Interrupted
from repro.core.results import InvocationDir, invocation_meta
from repro.core.scrub import Scrubber
from repro.engines import jobdeps
from repro.report.build import build_report
from repro.run.job import JobRequest, execute_job, reproduce_line
from repro.upstream.issue import make as issue
from tests.fixtures.fake_bisect import FakeEngine, FakeEnv, FakeMatrix, parse, torch_behaviour
from tests.fixtures.fake_job import BAD_LOG, WithPackages, always_bad, from_0_13
from tests.fixtures.report_records import ResultsBuilder

CMD = "torchrun --nproc_per_node 2 train.py --deepspeed ds_config.json"
DS_CONFIG = {"zero_optimization": {"stage": 3, "mics_shard_size": 2}, "train_batch_size": 4}
GLOO_WAIT = (
    "Current thread 0x02 (most recent call first):\n"
    '  File "/opt/lab/repro/workload/cpu/gloo_transport.py", line 88 in wait\n'
    '  File "/venv/deepspeed/runtime/zero/stage3.py", line 1731 in __avg_scatter_grads\n'
)
COALESCED = (
    "Current thread 0x02 (most recent call first):\n"
    '  File "/venv/deepspeed/comm/torch.py", line 206 in all_reduce_coalesced\n'
    '  File "/venv/deepspeed/runtime/zero/mics.py", line 426 in allreduce_mics_shard_grads\n'
)


def crash_before_0_13(env: FakeEnv) -> str:
    """0.12.x dies of the IllegalWork (no try/except yet); 0.13.0 on only warns (PR #4792)."""
    if env.deepspeed.startswith("0.12"):
        return (
            "Traceback (most recent call last):\nRuntimeError: Illegal to call wait on IllegalWork object\n"
        )
    return BAD_LOG


@pytest.fixture
def job_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(FakeEnv, "package_pins", FakeEnv.pins, raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    work = tmp_path / "my-hf-job"
    work.mkdir()
    (work / "train.py").write_text("print('train')\n")
    (work / "ds_config.json").write_text(json.dumps(DS_CONFIG, indent=1))
    (work / "requirements.txt").write_text("transformers==4.40.2\n")
    return work


def walk(tmp_path: Path, name: str, command: str, argv: list[str], engine: Any) -> Path:
    out = tmp_path / name
    argv = [*argv, "--out", str(out), "--results-root", str(tmp_path / "results")]
    services = bisect_cli.Services(matrix=FakeMatrix(), engine=engine, say=lambda _: None)
    run = {"bisect": bisect_cli.run_bisect, "survey": bisect_cli.run_survey}[command]
    try:
        run(parse(command, argv), services)
    except Interrupted:
        pass  # an interrupted walk leaves its folder: a kind `make issue` must read too
    return out


def own(work: Path, *more: str) -> list[str]:
    reqs = str(work / "requirements.txt")
    return ["--cmd", CMD, "--workdir", str(work), "--requirements", reqs, *more]


def custom_run(tmp_path: Path, work: Path) -> Path:
    """`make run CMD=... REQUIREMENTS=...`: stock and fixed of the job, through the real job path."""
    request = JobRequest(
        env_id="cpu",
        command=CMD,
        workdir=work,
        patches=("stock", "fixed"),
        deps=jobdeps.parse(str(work / "requirements.txt"), None),
    )
    folder = tmp_path / "run-custom"
    folder.mkdir()
    inv = InvocationDir(folder, invocation_meta(["run"], reproduce_line(request)))
    inv.save()
    execute_job(request, FakeMatrix().get("cpu"), WithPackages(), inv, say=lambda _: None)
    return folder


def suite_run(tmp_path: Path) -> Path:
    b = ResultsBuilder(tmp_path, "run-suite").env("cpu")
    b.clean("cpu", "zero3")
    b.diverging_bug("cpu", "mics")
    b.clean("cpu", "mics", "fixed")
    b.write()
    return b.folder


def hang_run(tmp_path: Path) -> Path:
    b = ResultsBuilder(tmp_path, "run-hang").env("cpu", torch="2.13.0", deepspeed="0.19.6")
    b.clean("cpu", "zero3", world_size=4)
    stacks = {"0": COALESCED, "1": COALESCED, "2": GLOO_WAIT, "3": GLOO_WAIT}
    b.run("cpu", "mics-replica", world_size=4, status="hung", losses=[], stacks=stacks, reason="hung")
    b.write()
    return b.folder


def commit_bisect(tmp_path: Path) -> Path:
    """A release bisect that went on into the commits (COMMITS=1), as bisect.json holds it."""
    out = tmp_path / "bisect-commits"
    out.mkdir()
    InvocationDir(out, invocation_meta(["bisect"], "make bisect COMMITS=1")).save()

    def probe(version: str, outcome: str, verdict: str) -> dict[str, Any]:
        sig = "hang" if outcome == "hung" else "none"
        return {"version": version, "outcome": outcome, "signature": sig, "verdict": verdict,
                "reason": outcome, "seconds": 1.0, "env": "cpu", "record": None, "versions": {}}  # fmt: skip

    short = {"sha": "a" * 40, "short": "aaaaaaa", "subject": "replica groups (#8060)", "date": "2026-01-01",
             "pr": 8060, "pr_url": None}  # fmt: skip
    good = {**short, "sha": "b" * 40, "short": "bbbbbbb", "subject": "docs"}
    commits = {
        "kind": "bisect", "axis": "deepspeed-commit", "status": "found", "first_bad": "aaaaaaa",
        "last_good": "bbbbbbb", "evidence": {"first_bad": probe("aaaaaaa", "hung", "bad"),
                                             "last_good": probe("bbbbbbb", "clean", "good")},
        "probes": [probe("bbbbbbb", "clean", "good"), probe("aaaaaaa", "hung", "bad")],
        "first_bad_commit": {**short, "files": " mics.py | 2 +-"}, "last_good_commit": good,
        "reproduce": {"make": "make probe ENV=cpu DEEPSPEED_COMMIT=aaaaaaa", "pip": "pip install x",
                      "command": None},
    }  # fmt: skip
    data = {
        "kind": "bisect", "axis": "deepspeed", "env": "cpu", "scenario": "mics-replica", "patch": "fixed",
        "bad_if": "failed", "status": "found", "first_bad": "0.19.3", "last_good": "0.19.2",
        "evidence": {"first_bad": probe("0.19.3", "hung", "bad"),
                     "last_good": probe("0.19.2", "clean", "good")},
        "probes": [probe("0.19.2", "clean", "good"), probe("0.19.3", "hung", "bad")],
        "repro_command": "make repro ENV=cpu DEEPSPEED=0.19.3", "commits": commits,
    }  # fmt: skip
    (out / "bisect.json").write_text(json.dumps(data))
    return out


RANGE = ["--axis", "deepspeed", "--versions", "0.12.3,0.12.6,0.13.0,0.13.1"]
TORCH = ["--axis", "torch", "--versions", "2.0.1,2.1.0,2.2.0", "--from", "2.0.1", "--to", "2.2.0"]
Maker = Callable[[Path, Path], Path]
KINDS: dict[str, Maker] = {
    "run": lambda tmp, work: suite_run(tmp),
    "custom-run": custom_run,
    "hung-run": lambda tmp, work: hang_run(tmp),
    "survey": lambda tmp, work: walk(tmp, "s", "survey", TORCH, FakeEngine(torch_behaviour)),
    "custom-survey": lambda tmp, work: walk(
        tmp, "cs", "survey", [*RANGE, "--from", "0.12.6", "--to", "0.13.1", *own(work)],
        WithPackages(crash_before_0_13),
    ),
    "survey-with-unknowns": lambda tmp, work: walk(
        tmp, "su", "survey", [*RANGE, "--from", "0.12.6", "--to", "0.13.1", *own(work)],
        WithPackages(from_0_13, broken=["2.1.0-0.12.6", "2.1.0-0.13.1"]),
    ),
    "interrupted-survey": lambda tmp, work: walk(
        tmp, "si", "survey", [*RANGE, "--from", "0.12.3", "--to", "0.13.1", *own(work)],
        WithPackages(from_0_13, interrupt_at=3),
    ),
    "bisect": lambda tmp, work: walk(tmp, "b", "bisect", TORCH, FakeEngine(torch_behaviour)),
    "custom-bisect": lambda tmp, work: walk(
        tmp, "cb", "bisect", [*RANGE, "--from", "0.12.3", "--to", "0.13.1", *own(work)], WithPackages()
    ),
    "bisect-no-transition": lambda tmp, work: walk(
        tmp, "bn", "bisect", [*RANGE, "--from", "0.12.6", "--to", "0.13.1", *own(work)],
        WithPackages(always_bad),
    ),
    "interrupted-bisect": lambda tmp, work: walk(
        tmp, "bi", "bisect", [*RANGE, "--from", "0.12.3", "--to", "0.13.1", *own(work)],
        WithPackages(from_0_13, interrupt_at=2),
    ),
    "release-commit-bisect": lambda tmp, work: commit_bisect(tmp),
}  # fmt: skip


def scrubber() -> Scrubber:
    return Scrubber.from_host({}, home="/nonexistent-home", hostnames=[], user="")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_template_renders_for_every_kind_of_folder(kind: str, tmp_path: Path, job_folder: Path) -> None:
    folder = KINDS[kind](tmp_path, job_folder)
    text = issue.render(folder, scrubber())  # StrictUndefined: a missing field raises here
    assert text.startswith("# MiCS")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]]
    # Never a statement its own table contradicts.
    if any("| reproduced |" in row for row in rows):
        assert "reproduced the bug" not in text.split("## What was expected")[0]
    # No host path: not the results folder, not the job folder.
    assert str(tmp_path) not in text
    if kind.startswith(("custom", "survey-with", "interrupted", "bisect-no")):
        assert "<your job folder>" in text or "## Reproduce" in text
    # The report renders its templates (StrictUndefined too) over the same folder.
    paths = build_report([folder], tmp_path / f"report-{kind}", scrubber=scrubber())
    assert paths.markdown.is_file() and paths.html.is_file()


def test_a_custom_survey_issue_says_what_a_maintainer_needs(tmp_path: Path, job_folder: Path) -> None:
    text = issue.render(KINDS["custom-survey"](tmp_path, job_folder), scrubber())
    title = text.splitlines()[0]
    # From the transition: a crash on 0.12.6 became warnings from 0.13.0, both the bug.
    assert "reproduced (illegal-work-crash) with DeepSpeed 0.12.6" in title
    assert "reproduced (illegal-work-warnings) from 0.13.0" in title
    expected = text.split("## What was expected")[1].split("##")[0]
    assert "0.12.6" not in expected and "ZeRO-3" in expected
    assert CMD in text and "`train.py`" in text and "`ds_config.json`" in text
    assert '"mics_shard_size": 2' in text  # the small config, inlined
    assert "`transformers==4.40.2`" in text
    assert "https://github.com/deepspeedai/DeepSpeed/issues/5080" in text
    assert "WORKDIR=<your job folder>" in text and "REQUIREMENTS=<your job folder>/requirements.txt" in text
    # No fixed run in a stock survey: the probe line that makes one.
    assert "make probe ENV=cpu DEEPSPEED=0.13.0 PATCH=fixed" in text
    # A venv survey cannot be bundled as it is: the Docker run and the bundle instead.
    assert (
        "ENGINE=docker" in text and "make bundle ENV=cpu+torch2.1.0+ds0.13.0 RESULTS=results/latest" in text
    )
    assert "| deepspeed | `0.13.0` | reproduced | illegal-work-warnings | bad |" in text  # verdict filled


def test_a_survey_with_unknown_probes_names_the_one_that_reproduced(tmp_path: Path, job_folder: Path) -> None:
    text = issue.render(KINDS["survey-with-unknowns"](tmp_path, job_folder), scrubber())
    assert "| reproduced |" in text and "No probe" not in text
    assert "With DeepSpeed 0.13.0 the job (patch `stock`) ends **reproduced**" in text


def test_a_bisect_without_a_transition_renders_with_what_to_try(tmp_path: Path, job_folder: Path) -> None:
    text = issue.render(KINDS["bisect-no-transition"](tmp_path, job_folder), scrubber())
    assert "## What to try next" in text and "AXIS=torch GOOD=2.0.1" in text
    assert "make bisect AXIS=deepspeed FROM=0.12.3 TO=0.12.6" in text


def test_a_custom_run_issue_names_the_fix_and_its_outcome(tmp_path: Path, job_folder: Path) -> None:
    text = issue.render(KINDS["custom-run"](tmp_path, job_folder), scrubber())
    assert CMD in text and "make run ENV=cpu WORKDIR=<your job folder>" in text
    fix = text.split("## The fix")[1].split("##")[0]
    assert "patches/deepspeed-0.13.1.patch" in fix and "**clean**" in fix


def test_a_hang_through_the_cpu_adapter_is_explained(tmp_path: Path, job_folder: Path) -> None:
    text = issue.render(KINDS["hung-run"](tmp_path, job_folder), scrubber())
    assert "Ranks 2, 3 wait in `gloo_transport.py`" in text
    assert "CPU transport adapter" in text and "different collectives" in text
    assert "ranks 0, 1 in `all_reduce_coalesced`" in text
    assert "## The fix" not in text  # the replica hang is another bug; the fix is not its cure


@pytest.mark.parametrize("how", ["outside", "link-out", "large"])
def test_a_config_outside_the_job_folder_or_too_large_is_named_not_read(
    how: str, tmp_path: Path, job_folder: Path
) -> None:
    secret = tmp_path / "elsewhere.json"
    secret.write_text('{"not": "for the issue"}')
    command = f"torchrun train.py --deepspeed {'../elsewhere.json' if how == 'outside' else 'ds_config.json'}"
    if how == "link-out":
        (job_folder / "ds_config.json").unlink()
        (job_folder / "ds_config.json").symlink_to(secret)
    if how == "large":
        (job_folder / "ds_config.json").write_text(json.dumps({"pad": "x" * 5000}))
    from repro.run.job import workdir_digest
    from repro.upstream.issue.facts import job_facts

    job = {
        "command": command,
        "workdir": str(job_folder),
        "job_id": "x",
        "workdir_digest": workdir_digest(job_folder),
    }
    facts = job_facts({"job": job})
    assert facts is not None and facts.ds_config and facts.ds_config_text == ""
    assert facts.ds_config_note  # says why it is not inlined


def test_a_reproduce_line_keeps_no_host_path() -> None:
    from repro.upstream.issue.facts import portable_line

    line = (
        "PYTHONPATH=/home/alice/deps make run ENV=cpu WORKDIR=/home/alice/job "
        "REQUIREMENTS=/home/alice/job/reqs/r.txt 'CMD=torchrun train.py'"
    )
    out = portable_line(line, "/home/alice/job")
    assert "/home" not in out
    assert out == (
        "PYTHONPATH=<as on your host> make run ENV=cpu WORKDIR=<your job folder> "
        "REQUIREMENTS=<your job folder>/reqs/r.txt 'CMD=torchrun train.py'"
    )


def test_an_interrupted_survey_says_so_and_how_to_go_on(tmp_path: Path, job_folder: Path) -> None:
    text = issue.render(KINDS["interrupted-survey"](tmp_path, job_folder), scrubber())
    unfinished = next(line for line in text.splitlines() if line.startswith("This survey did not finish"))
    assert "make survey AXIS=deepspeed FROM=0.12.3 TO=0.13.1" in unfinished
    assert "WORKDIR=<your job folder>" in unfinished


def test_a_record_naming_another_folder_reads_nothing_from_it(tmp_path: Path) -> None:
    """A results folder from elsewhere (or edited) may name any folder of this host as its job's:
    without the run's digest, nothing of it (file names, a JSON config) reaches the text."""
    from repro.upstream.issue.facts import job_facts

    private = tmp_path / "private"
    private.mkdir()
    (private / "ds_config.json").write_text('{"token": "mine"}')
    (private / "id_ed25519").write_text("key")
    for digest in (None, "sha256:" + "0" * 64):
        job = {"command": "python t.py --deepspeed ds_config.json", "workdir": str(private), "job_id": "x"}
        facts = job_facts({"job": {**job, "workdir_digest": digest}})
        assert facts is not None and facts.files == () and facts.ds_config_text == ""
        assert "not the one the run used" in facts.files_note


def test_a_local_wheel_requirement_is_named_without_its_host_path(tmp_path: Path) -> None:
    from repro.upstream.issue.facts import job_facts

    work = tmp_path / "job"
    work.mkdir()
    lines = [f"{tmp_path}/wheels/dep-1.0-py3-none-any.whl", f"file://{work}/vendor/x.whl", "six==1.16.0"]
    job = {"command": "python t.py", "workdir": str(work), "requirements": {"lines": lines}}
    facts = job_facts({"job": job})
    assert facts is not None
    assert facts.packages == ("dep-1.0-py3-none-any.whl", "<your job folder>/vendor/x.whl", "six==1.16.0")
