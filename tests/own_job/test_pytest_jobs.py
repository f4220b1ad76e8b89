"""A pytest job is judged per test: the real runner and hook run `python -m pytest` sessions (the
host's Python and pytest, a fake DeepSpeed package) and build_records weighs what pytest itself
said (repro/workload/pytest_outcomes.py, through the hook's signed record).

A session that ran no test (all skipped, none collected) is no evidence with pytest's reasons,
never clean; a missing module names PACKAGES=; failed tests without the bug are a crash with the
counts; the IllegalWork count of DeepSpeed's own code still decides, and the tests whose outcome
differs between stock and fixed are named."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from repro.core.verdict import env_verdicts
from repro.run.job import RawRun, build_records
from repro.workload import job, judge, pytest_outcomes
from tests.fixtures.job_records import job_records, job_report

MESSAGE = "[Rank 0] Error message: Illegal to call wait on IllegalWork object"


@pytest.fixture
def fake_deepspeed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A DeepSpeed whose MiCS module logs the failed wait from DeepSpeed's own code, on the job's
    PYTHONPATH: a test that calls it has taken the bug's path."""
    site = tmp_path / "site"
    pkg = site / "deepspeed"
    (pkg / "runtime" / "zero").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.0.fake'\n")
    (pkg / "runtime" / "__init__.py").write_text("")
    (pkg / "runtime" / "zero" / "__init__.py").write_text("")
    (pkg / "runtime" / "zero" / "mics.py").write_text(
        f"import logging\n\ndef failed_wait():\n    logging.getLogger('DeepSpeed').warning({MESSAGE!r})\n"
    )
    monkeypatch.setenv("MICS_REPRO_USER_PYTHONPATH", str(site))
    return site


def _session(tmp_path: Path, tests: str, patch: str = "stock", cmd: str | None = None) -> RawRun:
    """Run `python -m pytest -q test_job.py` through the runner; the raw run build_records reads.
    The runner always runs it stock (the fake DeepSpeed has nothing the fix could patch); `patch`
    names the run for the judge."""
    work = tmp_path / patch / "work"
    work.mkdir(parents=True)
    (work / "test_job.py").write_text(textwrap.dedent(tests))
    out = tmp_path / patch / "out"
    command = cmd or f"{sys.executable} -m pytest -q -p no:cacheprovider test_job.py"
    argv = ["--cmd", command, "--workdir", str(work), "--out", str(out), "--device", "gpu"]
    assert job.main([*argv, "--patch", "stock", "--timeout", "300"]) == 0
    result = json.loads((out / job.JOB_JSON).read_text())
    return RawRun(patch, result, (out / job.JOB_LOG).read_text(), None)


def _one(raw: RawRun) -> dict[str, Any]:
    [record] = build_records("cpu", [raw], None, "sha256:x", 300.0)
    return dict(record)


SKIPPED = """\
    import pytest

    @pytest.mark.parametrize("shard", [1, 2, 4])
    def test_mics(shard):
        pytest.skip("not enough GPUs are available: 4 required, 2 available")

    @pytest.mark.skip(reason="Skipping until we resolve problems with torch 2.1")
    def test_other():
        pass
    """


def test_a_session_that_skipped_every_test_is_no_evidence_with_pytests_reasons(
    tmp_path: Path, real_subprocess: None
) -> None:
    raw = _session(tmp_path, SKIPPED)
    assert raw.job["exit_code"] == 0
    record = _one(raw)
    assert (record["outcome"], record["signature"]) == ("no-evidence", "none"), record["reason"]
    assert record["reason"].startswith("pytest ran no test (4 skipped; pytest exit 0): ")
    assert "'not enough GPUs are available: 4 required, 2 available' x3" in record["reason"]
    assert "'Skipping until we resolve problems with torch 2.1' x1" in record["reason"]
    [report] = raw.job["hook_reports"]  # signed by the hook although no test imported DeepSpeed
    assert report["pytest"]["counts"] == {"skipped": 4} and report["pytest"]["ran"] == 0
    assert record["job"]["deepspeed_imported"] is False


def test_a_session_that_collected_nothing_is_no_evidence(tmp_path: Path, real_subprocess: None) -> None:
    record = _one(_session(tmp_path, "def helper():\n    pass\n"))
    assert record["outcome"] == "no-evidence", record["reason"]
    assert record["reason"].startswith("pytest ran no test (no test collected; pytest exit 5)")


def test_a_missing_module_is_an_env_error_that_names_packages(tmp_path: Path, real_subprocess: None) -> None:
    # `python -m <module>` for a module the env lacks: Python prints one line, no traceback.
    raw = _session(tmp_path, "", cmd=f"{sys.executable} -m no_such_runner_xyz -q")
    record = _one(raw)
    assert record["outcome"] == "env-error", record["reason"]
    assert "no module named 'no_such_runner_xyz'" in record["reason"]
    assert "PACKAGES=no_such_runner_xyz" in record["reason"]
    # A test module importing one: pytest reports a collection error (its own words, no Python
    # traceback) and ends the session with exit 2.
    imported = _one(_session(tmp_path / "imp", "import yaml_not_here.sub\n\ndef test_x():\n    pass\n"))
    assert imported["outcome"] == "env-error", imported["reason"]
    assert "no module named 'yaml_not_here' (exit 2)" in imported["reason"]
    assert "PACKAGES=yaml_not_here" in imported["reason"]


def test_a_collection_error_is_a_crash_that_says_so(tmp_path: Path, real_subprocess: None) -> None:
    record = _one(_session(tmp_path, "def test_x(:\n    pass\n"))
    assert (record["outcome"], record["signature"]) == ("crashed", "crash"), record["reason"]
    assert record["reason"].startswith("exit code 2: pytest could not collect test_job.py: ")


def test_failed_tests_without_the_bug_are_a_crash_with_the_counts(
    tmp_path: Path, fake_deepspeed: Path, real_subprocess: None
) -> None:
    tests = """\
        import deepspeed

        def test_ok():
            pass

        def test_broken():
            assert 1 == 2, "checkpoint mismatch"
        """
    record = _one(_session(tmp_path, tests))
    assert (record["outcome"], record["signature"]) == ("crashed", "crash"), record["reason"]
    assert record["reason"].startswith(
        "exit code 1: pytest: 1 passed, 1 failed (first: test_job.py::test_broken: "
    )
    assert "checkpoint mismatch" in record["reason"]


def test_the_bugs_path_decides_and_the_tests_that_differ_are_named(
    tmp_path: Path, fake_deepspeed: Path, real_subprocess: None
) -> None:
    stock_tests = """\
        import deepspeed.runtime.zero.mics as mics

        def test_gather():
            mics.failed_wait()  # DeepSpeed's own code logs it: the hook counts it
            assert False, "losses diverged"

        def test_other():
            pass
        """
    fixed_tests = "def test_gather():\n    pass\n\ndef test_other():\n    pass\n"
    stock = _session(tmp_path, stock_tests, "stock")
    fixed = _session(tmp_path, "import deepspeed\n" + fixed_tests, "fixed")
    records = {r["patch"]: r for r in build_records("cpu", [stock, fixed], None, "sha256:x", 300.0)}
    got = records["stock"]
    assert (got["outcome"], got["signature"]) == ("reproduced", "illegal-work-warnings"), got["reason"]
    assert "pytest: 1 passed, 1 failed" in got["reason"]
    assert any("test_job.py::test_gather failed->passed" in n for n in got["job"]["notes"]), got["job"][
        "notes"
    ]
    assert records["fixed"]["outcome"] == "clean", records["fixed"]["reason"]
    assert "pytest: 2 passed" in records["fixed"]["reason"]


def test_the_plugin_keeps_the_first_bad_word_of_a_test() -> None:
    class Report:
        def __init__(self, when: str, outcome: str) -> None:
            self.nodeid, self.when = "t.py::test_a", when
            self.failed, self.skipped = outcome == "failed", outcome == "skipped"
            self.longrepr = None if outcome == "passed" else "E   AssertionError: boom"

    pytest_outcomes._TESTS.clear()
    for when, outcome in (("setup", "passed"), ("call", "failed"), ("teardown", "failed")):
        pytest_outcomes.pytest_runtest_logreport(Report(when, outcome))
    summary = pytest_outcomes.summary(1, 1)
    pytest_outcomes._TESTS.clear()
    assert summary["tests"] == {"t.py::test_a": {"outcome": "failed", "message": "E AssertionError: boom"}}
    assert (summary["counts"], summary["ran"]) == ({"failed": 1}, 1)
    assert judge.no_test_ran({"counts": {}, "tests": {}, "exitstatus": 5}, 5).startswith("pytest ran no test")


POOL_TESTS = """\
    import multiprocessing as mp

    _BARRIER = None

    def _init(barrier):
        global _BARRIER
        _BARRIER = barrier

    def _rank(rank):
        import deepspeed.runtime.zero.mics as mics  # imported in the rank, as the harness's test does
        mics.failed_wait()
        _BARRIER.wait()  # as the ranks' rendezvous does: one task per worker
        return rank

    def test_ranks_in_a_forkserver_pool():
        # As DeepSpeed's harness (tests/unit/common.py) runs a test's ranks: a Pool under forkserver,
        # closed and joined (its workers leave through os._exit, past atexit).
        ctx = mp.get_context("forkserver")
        pool = ctx.Pool(processes=3, initializer=_init, initargs=(ctx.Barrier(3),))
        assert sorted(pool.map(_rank, range(3), chunksize=1)) == [0, 1, 2]
        pool.close()
        pool.join()
    """


def test_ranks_of_a_forkserver_pool_sign_their_records_and_their_count_is_kept(
    tmp_path: Path, fake_deepspeed: Path, real_subprocess: None
) -> None:
    raw = _session(tmp_path, POOL_TESTS)
    assert raw.job["forged_hook_records"] == [], raw.job["forged_hook_records"]
    ranks = [r for r in raw.job["hook_reports"] if r.get("deepspeed")]
    assert len(ranks) == 3 and all(r["illegal_work_failures"] == 1 for r in ranks), ranks
    assert len({r["pid"] for r in ranks}) == 3  # each worker's own pid, not the forkserver's
    record = _one(raw)
    got = (record["outcome"], record["signature"])
    assert got == ("reproduced", "illegal-work-warnings"), record["reason"]
    assert record["illegal_work_messages"] == 3 and "pytest: 1 passed" in record["reason"]


def test_a_pytest_session_on_the_cpu_twin_counts_devices_for_deepspeeds_harness(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from repro.workload import jobhook

    monkeypatch.setitem(jobhook._STATE, "device", "cpu")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    # The hook's own count (cores, no numactl) is raised to the harness's.
    monkeypatch.setenv("LOCAL_SIZE", "2")
    monkeypatch.setenv("MICS_REPRO_LAUNCHER_LOCAL_SIZE", "2")
    jobhook.pytest_session_started()
    assert jobhook.os.environ["LOCAL_SIZE"] == str(jobhook.TEST_HARNESS_DEVICES)
    # The user's own LOCAL_SIZE, and a launcher's rank, keep theirs.
    monkeypatch.setenv("LOCAL_SIZE", "3")
    jobhook.pytest_session_started()
    assert jobhook.os.environ["LOCAL_SIZE"] == "3"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_SIZE", "2")
    monkeypatch.setenv("MICS_REPRO_LAUNCHER_LOCAL_SIZE", "2")
    jobhook.pytest_session_started()
    assert jobhook.os.environ["LOCAL_SIZE"] == "2"
    # On GPUs the accelerator counts real devices: untouched.
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setitem(jobhook._STATE, "device", "gpu")
    jobhook.pytest_session_started()
    assert jobhook.os.environ["LOCAL_SIZE"] == "2"


def _pytest_report(tests: dict[str, tuple[str, str]]) -> dict[str, Any]:
    entries = {test: {"outcome": outcome, "message": message} for test, (outcome, message) in tests.items()}
    counts: dict[str, int] = {}
    for outcome, _ in tests.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return {"exitstatus": 1, "collected": len(tests), "counts": counts, "ran": len(tests), "tests": entries}


MISMATCH = "RuntimeError: mat1 and mat2 must have the same dtype, but got BFloat16 and Half"


def _pytest_pair(fixed_tests: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    stock_tests = {"t.py::test_a[1]": ("failed", MISMATCH), "t.py::test_save[2]": ("passed", "")}
    command, workdir = "python -m pytest t.py", "/w"
    stock = job_report("stock", command, workdir, exit_code=1, report={"pytest": _pytest_report(stock_tests)})
    fixed = job_report("fixed", command, workdir, exit_code=1, report={"pytest": _pytest_report(fixed_tests)})
    log = "[Rank 0] Error message: Illegal to call wait on IllegalWork object\n"
    return job_records(
        command=command, workdir=workdir, stock=stock, fixed=fixed, stock_log=log, fixed_log=""
    )


def test_the_same_failing_tests_with_and_without_the_fix_leave_it_unverified_not_refuted() -> None:
    """DeepSpeed master's un-skipped MiCS test fails on a dtype mismatch with and without the fix
    (the test was not updated while skipped): the fix took the IllegalWork away, the failures are
    the test's own, and they cannot verify it."""
    records = _pytest_pair({"t.py::test_a[1]": ("failed", MISMATCH), "t.py::test_save[2]": ("passed", "")})
    stock, fixed = records
    assert stock["outcome"] == "reproduced" and fixed["outcome"] == "crashed", (
        stock["reason"],
        fixed["reason"],
    )
    assert fixed["job"]["pytest"]["tests"]["t.py::test_a[1]"]["outcome"] == "failed"
    [verdict] = env_verdicts(records)
    assert verdict.headline().endswith("REPRODUCED; fix unverified (the same tests fail with and without it)")
    assert any("the same 1 test(s) fail with and without it" in line for line in verdict.notes())
    # a test that passed without the fix and fails with it does count against it
    broken = _pytest_pair({"t.py::test_a[1]": ("failed", MISMATCH), "t.py::test_save[2]": ("failed", "boom")})
    [verdict] = env_verdicts(broken)
    assert verdict.headline().endswith("FIX DOES NOT RESOLVE IT"), verdict.headline()


# A stand-in of pytest-randomly's seed contract (its option `--randomly-seed`, dest randomly_seed,
# default "default", read at pytest_configure): it writes down the seed it would shuffle with.
FAKE_RANDOMLY = """
import os

def pytest_addoption(parser):
    parser.addoption("--randomly-seed", dest="randomly_seed", default="default")

def pytest_configure(config):
    with open(os.environ["SEEDS_FILE"], "a") as fh:
        fh.write(f"{config.getoption('randomly_seed')}\\n")
"""


def test_the_stock_and_the_fixed_run_shuffle_their_tests_with_one_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_subprocess: None
) -> None:
    """pytest-randomly would shuffle each run its own way; where the command names no seed, both
    runs get one from the invocation (pytest_outcomes.pytest_cmdline_main). One the command names
    is left alone."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "fake_randomly.py").write_text(FAKE_RANDOMLY)
    monkeypatch.setenv("MICS_REPRO_USER_PYTHONPATH", str(site))
    seeds = tmp_path / "seeds"
    monkeypatch.setenv("SEEDS_FILE", str(seeds))
    work = tmp_path / "work"  # a job's stock and fixed run share its folder and its command
    work.mkdir()
    (work / "test_job.py").write_text("def test_one():\n    pass\n")
    command = f"{sys.executable} -m pytest -q -p no:cacheprovider -p fake_randomly test_job.py"
    for n, cmd in enumerate((command, command, command + " -k one", command + " --randomly-seed=7")):
        argv = ["--cmd", cmd, "--workdir", str(work), "--out", str(tmp_path / f"out{n}"), "--device", "gpu"]
        assert job.main([*argv, "--patch", "stock", "--timeout", "300"]) == 0
    stock, fixed, other, given = seeds.read_text().split()
    assert stock == fixed and stock.isdigit() and other.isdigit() and other != stock
    assert given == "7"
