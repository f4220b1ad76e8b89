"""The suite's scheduler: several runs at once, yet every record judged against its control, in
plan order, and an interruption that leaves every started run recorded and nothing launched after.

torchrun is replaced by a stand-in that writes the per-rank records a real run writes, so the
real `runner.assemble`, `classify` and suite bookkeeping run unchanged.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from repro.workload import runner, suite
from tests.fixtures.prefork import FakePreforkServer
from tests.fixtures.runspec import LaunchStandIn, write_fake_ranks


class FakeTorchrun(LaunchStandIn):
    """Stands in for `runner.launch`: writes rank records; counts how many runs overlap."""

    def __init__(self, interrupt_run: str | None = None) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most_at_once = 0
        self.started: list[str] = []
        self.interrupt_run = interrupt_run
        self.both_running = threading.Event()
        self.servers: list[Any] = []
        self.server: Any = None  # what the suite's start_prefork returned

    def launch(self, spec: runner.RunSpec, stop: threading.Event | None, server: Any) -> runner.LaunchResult:
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.started.append(spec.run_name)
            self.servers.append(server)
            if self.running >= 2:
                self.both_running.set()
        try:
            # Hold every run until a second one is in flight (or a short grace passes), so that
            # overlap is observed by counting, not by timing.
            self.both_running.wait(timeout=5)
            if spec.run_name == self.interrupt_run:
                return runner.LaunchResult("interrupted", None, 0.1, {}, "")
            if self.interrupt_run is not None and stop is not None and spec.scenario != "zero3":
                stop.wait(timeout=5)  # a sibling run: stopped by the suite, like a real one
                if stop.is_set():
                    return runner.LaunchResult("interrupted", None, 0.1, {}, "")
            return write_fake_ranks(spec)
        finally:
            with self.lock:
                self.running -= 1


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeTorchrun, jobs: int, *extra: str
) -> tuple[int, dict]:
    monkeypatch.setattr(suite.runner, "launch", fake)
    fake.server = FakePreforkServer()
    monkeypatch.setattr(suite, "start_prefork", lambda out, device: fake.server)
    monkeypatch.setattr(suite, "mics_available", lambda: True)
    out = tmp_path / "out"
    code = suite.main(
        [
            "--env",
            "fake",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--no-artifacts",
            "--jobs",
            str(jobs),
            "--world-size",
            "2",
            *extra,
        ]
    )
    return code, json.loads((out / "suite.json").read_text())


def test_two_jobs_overlap_and_records_keep_plan_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeTorchrun()
    code, data = _run(tmp_path, monkeypatch, fake, jobs=2)
    assert code == 0
    assert fake.most_at_once == 2
    names = [r["run_name"] for r in data["runs"]]
    planned = [
        f"{p.scenario}-{p.patch}-{p.dtype}-{p.transport}-w2"
        for p in suite.plan(list(suite.rec.SCENARIOS), list(suite.rec.PATCHES), "fp32", ["async"], 2, True)
    ]
    assert names == planned
    by_name = {r["run_name"]: r for r in data["runs"]}
    control = by_name["zero3-stock-fp32-async-w2"]
    assert control["outcome"] == "clean"
    for record in data["runs"][1:]:
        assert record["control_run"] == control["run_name"]
        expected = "reproduced" if record["patch"] == "stock" else "clean"
        assert record["outcome"] == expected, record["reason"]
        assert os.path.exists(tmp_path / "out" / "runs" / record["run_name"] / "record.json")
    assert data["interrupted"] is False and data.get("finished_at")
    # CPU runs go through the pre-imported launcher, which the suite closes at the end.
    assert fake.servers == [fake.server] * 8 and fake.server.closed and not fake.server.abandoned
    assert data["launcher"]["used"] == "prefork" and data["launcher"]["server"]["fake"] is True


def test_one_job_never_overlaps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTorchrun()
    fake.both_running.set()  # nothing to wait for
    code, data = _run(tmp_path, monkeypatch, fake, jobs=1)
    assert code == 0 and fake.most_at_once == 1 and len(data["runs"]) == 8


def test_interruption_records_started_runs_and_launches_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeTorchrun(interrupt_run="mics-stock-fp32-async-w2")
    code, data = _run(tmp_path, monkeypatch, fake, jobs=2)
    assert code == 130 and data["interrupted"] is True
    recorded = [r["run_name"] for r in data["runs"]]
    # the control, the interrupted run and whatever was in flight beside it; nothing after
    assert sorted(recorded) == sorted(fake.started)
    planned = [
        r
        for r in [
            f"{p.scenario}-{p.patch}-{p.dtype}-{p.transport}-w2"
            for p in suite.plan(
                list(suite.rec.SCENARIOS), list(suite.rec.PATCHES), "fp32", ["async"], 2, True
            )
        ]
    ]
    assert recorded == planned[: len(recorded)]
    assert len(recorded) < 8
    assert any(r["outcome"] == "interrupted" for r in data["runs"])
    for name in recorded:
        assert (tmp_path / "out" / "runs" / name / "record.json").exists()
    # a run still waiting for the launcher's imports must not wait them out
    assert fake.server.abandoned and fake.server.closed


def test_launcher_torchrun_starts_no_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTorchrun()
    fake.both_running.set()
    code, data = _run(tmp_path, monkeypatch, fake, 1, "--launcher", "torchrun")
    assert code == 0 and fake.servers == [None] * 8
    assert data["launcher"] == {"requested": "torchrun", "used": "torchrun", "note": ""}


def test_choose_launcher() -> None:
    assert suite.choose_launcher("cpu", "auto") == ("prefork", "")
    assert suite.choose_launcher("cpu", "prefork") == ("prefork", "")
    assert suite.choose_launcher("cpu", "torchrun") == ("torchrun", "")
    assert suite.choose_launcher("gpu", "auto") == ("torchrun", "")
    launcher, note = suite.choose_launcher("gpu", "prefork")
    assert launcher == "torchrun" and "CPU only" in note


def test_default_jobs() -> None:
    assert suite.default_jobs("gpu", 8) == 1
    assert suite.default_jobs("cpu", 4) >= 2


def test_a_launcher_that_cannot_start_means_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTorchrun()
    fake.both_running.set()
    monkeypatch.setattr(suite.runner, "launch", fake)
    monkeypatch.setattr(suite, "mics_available", lambda: True)

    def broken(*args: Any, **kw: Any) -> None:
        raise OSError("no room for the log")

    monkeypatch.setattr(suite, "PreforkServer", broken)
    out = tmp_path / "out"
    argv = ["--env", "fake", "--out", str(out), "--device", "cpu", "--no-artifacts", "--world-size", "2"]
    assert suite.main([*argv, "--jobs", "1"]) == 0
    data = json.loads((out / "suite.json").read_text())
    assert fake.servers == [None] * 8 and len(data["runs"]) == 8
    assert data["launcher"]["used"] == "torchrun" and "could not start" in data["launcher"]["note"]
