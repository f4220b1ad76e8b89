"""A pytest plugin in every pytest session of a custom job: what pytest itself says of each test,
handed to the hook's signed record so the judge (judge.py) can weigh a pytest job per test.

Why: a session that ran no test (all skipped, none collected) says nothing about the bug, and a
session's exit status alone cannot tell "3 tests failed" from "pytest could not start". pytest's own
reports can: this plugin keeps each test id's outcome (passed, failed, error, skipped, xfailed,
xpassed) with the skip reason or the failure's last line, the counts, and the exit status.

Record only, but for one thing: it adds no option, changes no test and no report, and writes
nothing itself: the hook (jobhook.note_pytest) puts the summary into its record. The one thing:
where pytest-randomly shuffles the tests (DeepSpeed's dev requirements install it) and the command
names no seed, the seed comes from the command line and folder (`pytest_cmdline_main`), so the
stock and the fixed run of a job run their tests in one order. At the session's start it tells the hook a
pytest session began (jobhook.pytest_session_started: DeepSpeed's test harness needs a device
count). Loaded by name through PYTEST_PLUGINS, which the hook sets where it runs
(jobhook._load_pytest_plugin). Only the session that owns the results records: an xdist worker
hands its reports to its controller, pytest-forked's child to its parent, and those record them.

Runs inside the environments: standard library only (Python 3.9+), pytest's objects read by
attribute.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

# summary() returns it; declared with the hook's record (jobhook cannot import this module)
from repro.workload.hooksign import PytestSummary as PytestSummary

# Outcomes that ran a test body: a session with none of these ran no test.
RAN = ("passed", "failed", "error", "xfailed", "xpassed")
# At most this many test ids are kept by name (a whole `tests/unit` has thousands); counts are whole.
MAX_TESTS = 2000
MAX_MESSAGE = 300

MAX_ERRORS = 20


_TESTS: dict[str, dict[str, str]] = {}
# "path/file.py:774: RuntimeError": a location and an exception's name, without its message
BARE_LOCATION = re.compile(r"^\S+:\d+: [\w.]+$")
# pytest's line for the exception raised: "E   RuntimeError: words"
RAISED_LINE = re.compile(r"^E\s+[\w.]+: ")
_ERRORS: list[dict[str, str]] = []


def _message(report: Any) -> str:
    """The skip reason or the failure's own last line, short."""
    longrepr = getattr(report, "longrepr", None)
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, "Skipped: why")
        text = str(longrepr[2])
        return text[len("Skipped: ") :] if text.startswith("Skipped: ") else text
    crash = getattr(longrepr, "reprcrash", None)
    text = str(getattr(crash, "message", "") or "")
    if not text and longrepr is not None:
        lines = [line for line in str(longrepr).splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    if BARE_LOCATION.match(text) and longrepr is not None:
        # A report rebuilt by pytest-forked/xdist may keep only "pool.py:774: RuntimeError": the
        # exception's own words are then in the report's last "E   Name: ..." line.
        raised = [line[1:].strip() for line in str(longrepr).splitlines() if RAISED_LINE.match(line)]
        text = raised[-1] if raised else text
    return " ".join(text.split())[:MAX_MESSAGE]


def _outcome(report: Any) -> str | None:
    """This phase's say on the test, or None when the phase adds nothing (a passing setup)."""
    when = getattr(report, "when", "call")
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.failed:
        return "failed" if when == "call" else "error"
    if report.skipped:
        return "skipped"
    return "passed" if when == "call" else None


def pytest_cmdline_main(config: Any) -> None:
    """Give pytest-randomly a seed of the invocation where the command names none: otherwise the
    stock and the fixed run are shuffled apart, and a test that one of them never reached (a hang
    stops the session) reads as a difference the fix made. Runs before any pytest_configure (it
    is called first, pytest-randomly picks its seed there); pytest prints "Using --randomly-seed=N"
    in both runs. An xdist worker takes its controller's seed, and any seed the command gives (or
    `-p no:randomly`) is left as it is."""
    params = getattr(config, "invocation_params", None)  # pytest >= 5.1
    seed = getattr(config.option, "randomly_seed", None)
    if seed != "default" or params is None or hasattr(config, "workerinput"):
        return
    config.option.randomly_seed = zlib.crc32(repr((tuple(params.args), str(params.dir))).encode())


def pytest_configure(config: Any) -> None:
    """Besides the record and the seed above: the hook learns a pytest session began (on the CPU twin it
    then counts enough devices for DeepSpeed's test harness: jobhook.pytest_session_started)."""
    from repro.workload import jobhook

    jobhook.pytest_session_started()


def pytest_runtest_logreport(report: Any) -> None:
    said = _outcome(report)
    if said is None:
        return
    seen = _TESTS.get(report.nodeid)
    # The first bad word stands: a test that failed its call and its teardown failed, not error.
    if seen is not None and seen["outcome"] in ("failed", "error") and said != "passed":
        return
    if seen is not None and said == "passed":
        return
    _TESTS[report.nodeid] = {"outcome": said, "message": "" if said == "passed" else _message(report)}


def pytest_collectreport(report: Any) -> None:
    """A module pytest could not collect (a SyntaxError, a missing module): no test id to hold it."""
    if report.failed and len(_ERRORS) < MAX_ERRORS:
        _ERRORS.append({"nodeid": str(report.nodeid), "message": _message(report)})


def summary(exitstatus: int, collected: int | None) -> PytestSummary:
    counts: dict[str, int] = {}
    for entry in _TESTS.values():
        counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
    kept = dict(list(_TESTS.items())[:MAX_TESTS])
    return {
        "exitstatus": int(exitstatus),
        "collected": collected,
        "counts": counts,
        "ran": sum(counts.get(name, 0) for name in RAN),
        "tests": kept,
        "tests_cut": len(_TESTS) - len(kept),
        "collect_errors": list(_ERRORS),
    }


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: its controller records
        return
    from repro.workload import jobhook

    jobhook.note_pytest(summary(int(exitstatus), getattr(session, "testscollected", None)))
