"""`make bench` with the commands faked: both launchers on the same plan, the ratio, the probe,
the table and the jsonl line, and exit codes (speed itself is measured, never asserted)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from repro.core.cmd import CmdResult
from repro.run import bench


def _step(argv: list[str]) -> str:
    if argv[1:3] == ["-m", "torch.distributed.run"]:
        return "bare"
    if argv[3] == "repro":
        return argv[argv.index("--launcher") + 1]
    if argv[3] == "probe" and "--torch" in argv:  # the hang pair
        return "hang-" + argv[argv.index("--deepspeed") + 1]
    return argv[3]


class FakeCommands:
    def __init__(self, seconds: dict[str, float], codes: dict[str, int] | None = None) -> None:
        self.seconds, self.codes, self.calls = seconds, codes or {}, []  # type: ignore[var-annotated]

    def __call__(self, argv: list[str], **kw: Any) -> CmdResult:
        self.calls.append(argv)
        step = _step(argv)
        code = self.codes.get(step, 0)
        stdout = ""
        if argv[3:4] == ["repro"] and code == 0:
            out = Path(argv[argv.index("--out") + 1])
            out.mkdir(parents=True)
            runs = [
                {"run_name": "zero3", "outcome": "clean", "signature": "none", "durations": {"total_s": 1}},
                {"run_name": "mics-replica", "outcome": "clean", "signature": "none", "world_size": 4},
            ]
            (out / "results.json").write_text(json.dumps({"runs": runs}))
        if step == "venv-python" and code == 0 and kw.get("capture"):  # only a captured stdout is read
            stdout = "venv: reusing ...\n/cache/venvs/cpu/bin/python\n"
        if step.startswith("hang-") and code in (0, 1):
            out = Path(argv[argv.index("--out") + 1])
            out.mkdir(parents=True)
            outcome = "hung" if step == "hang-0.19.3" else "clean"
            (out / "probe.json").write_text(json.dumps({"probes": [{"outcome": outcome}]}))
        return CmdResult(tuple(argv), code, stdout, "", False, self.seconds.get(step, 1.0))


@pytest.fixture
def in_tmp_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(bench, "REPO", tmp_path)
    return tmp_path


def test_both_launchers_on_the_same_plan_then_a_probe(
    in_tmp_repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeCommands({"build": 2.0, "torchrun": 100.0, "prefork": 35.0, "probe": 12.0}, {"probe": 1})
    monkeypatch.setattr(bench.cmd, "run", fake)
    assert bench.bench("cpu", "venv", hang=False) == 0  # a probe that says "bad" is an answer
    steps = [_step(c) for c in fake.calls]
    assert steps == ["build", "torchrun", "prefork", "venv-python", "bare", "bare", "probe"]
    suite_args = [c[: c.index("--launcher")] for c in fake.calls[1:3]]
    assert suite_args[0] == suite_args[1]  # the same plan
    line = json.loads((in_tmp_repo / "results" / "bench.jsonl").read_text().splitlines()[-1])
    assert line["full_suite_s"] == {"torchrun": 100.0, "prefork": 35.0}
    assert line["ratio_prefork_to_torchrun"] == 0.35 and line["same_outcomes"] is True
    assert line["probe_warm_s"] == 12.0 and line["probe_exit_code"] == 1
    out = capsys.readouterr().out
    assert "ratio prefork / torchrun: 0.35" in out and "launcher prefork" in out


def test_a_failed_suite_is_the_exit_code(in_tmp_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.cmd, "run", FakeCommands({}, {"prefork": 3}))
    assert bench.bench() == 3
    monkeypatch.setattr(bench.cmd, "run", FakeCommands({}, {"build": 5}))
    assert bench.bench() == 5
    monkeypatch.setattr(bench.cmd, "run", FakeCommands({}, {"probe": 128}))
    assert bench.bench() == 128


def test_a_warm_commit_probe_is_the_median_of_three_after_a_warm_up(
    in_tmp_repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    times = iter([40.0, 14.0, 11.0, 19.0])  # the first makes the layer: left out

    class Commits(FakeCommands):
        def __call__(self, argv: list[str], **kw: Any) -> CmdResult:
            done = super().__call__(argv, **kw)
            if "--deepspeed-commit" in argv:
                return CmdResult(done.argv, 0, "", "", False, next(times))
            return done

    fake = Commits({})
    monkeypatch.setattr(bench.cmd, "run", fake)
    assert bench.bench("cpu-latest", "venv", "/src/DeepSpeed", "v0.19.3") == 0
    commit_calls = [c for c in fake.calls if "--deepspeed-commit" in c]
    assert len(commit_calls) == 4 and all(
        c[c.index("--ds-repo") + 1] == "/src/DeepSpeed" for c in commit_calls
    )
    line = json.loads((in_tmp_repo / "results" / "bench.jsonl").read_text().splitlines()[-1])
    assert line["commit_probe_warm_s"] == [14.0, 11.0, 19.0] and line["commit_probe_median_s"] == 14.0
    assert "probe of commit v0.19.3, warm (median of 3)" in capsys.readouterr().out


def test_bare_start_up_mirrors_the_suites_jobs_and_gives_the_verdict_ratio(
    in_tmp_repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeCommands({"torchrun": 100.0, "prefork": 30.0, "bare": 50.0})
    monkeypatch.setattr(bench.cmd, "run", fake)
    assert bench.bench("cpu", "venv", hang=False) == 0
    bare = [c for c in fake.calls if _step(c) == "bare"]
    # the env's own Python, one job per run of the suite with that run's world size
    assert [c[0] for c in bare] == ["/cache/venvs/cpu/bin/python"] * 2
    assert [c[4] for c in bare] == ["--nproc_per_node=2", "--nproc_per_node=4"]
    line = json.loads((in_tmp_repo / "results" / "bench.jsonl").read_text().splitlines()[-1])
    assert line["bare_start_s"] == 100.0 and line["ratio_verdict_to_bare"] == 0.3
    assert "ratio warm verdict / bare start-up: 0.3" in capsys.readouterr().out


def test_a_failed_bare_job_gives_no_verdict_ratio(in_tmp_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.cmd, "run", FakeCommands({}, {"bare": 1}))
    assert bench.bench("cpu", "venv", hang=False) == 0
    line = json.loads((in_tmp_repo / "results" / "bench.jsonl").read_text().splitlines()[-1])
    assert line["bare"]["exit_codes"] == [1, 1] and line["ratio_verdict_to_bare"] is None


def test_hung_against_clean_probe_each_warmed_once(
    in_tmp_repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeCommands({"hang-0.19.2": 20.0, "hang-0.19.3": 25.0}, {"hang-0.19.3": 1})
    monkeypatch.setattr(bench.cmd, "run", fake)
    assert bench.bench("cpu", "venv") == 0
    hang = [c for c in fake.calls if _step(c).startswith("hang-")]
    assert [_step(c) for c in hang] == ["hang-0.19.2"] * 2 + ["hang-0.19.3"] * 2
    assert all(c[c.index("--scenario") + 1] == "mics-replica" and "--bad-if" in c for c in hang)
    line = json.loads((in_tmp_repo / "results" / "bench.jsonl").read_text().splitlines()[-1])
    assert line["hang"]["clean"] == {"first_s": 20.0, "seconds": 20.0, "exit_code": 0, "outcome": "clean"}
    assert line["hang"]["hung"]["outcome"] == "hung" and line["hang"]["ratio_hung_to_clean"] == 1.25
    assert "ratio hung / clean probe: 1.25" in capsys.readouterr().out


def test_the_docker_engine_skips_the_venv_only_steps(
    in_tmp_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCommands({})
    monkeypatch.setattr(bench.cmd, "run", fake)
    assert bench.bench("cpu", "docker") == 0
    assert not [c for c in fake.calls if _step(c) in ("venv-python", "bare") or _step(c).startswith("hang-")]
