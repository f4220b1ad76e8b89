"""Shared test fixtures.

The default tier must never reach the real machine's processes or Docker daemon: an accidental
real call there would make a test slow, flaky and dependent on the host. Tests marked
`integration`, `docker`, `browser` or `bootstrap` are exempt; a default-tier test that really means to start
a process (e.g. checking `repro.core.cmd` against `sh`) asks for the `real_subprocess` fixture.
"""

from __future__ import annotations

import errno
import os
import subprocess
from typing import Any

import pytest

# THE tier list (pyproject.toml and the Makefile take it from here): a test with one of these
# markers needs what its description says; a test with none is the default `unit` tier, which
# `make test-unit` runs (`-m unit`, added at collection).
TIERS = {
    "integration": "runs real torch + DeepSpeed releases under torchrun (needs the env's venv; slow)",
    "docker": "needs a real Docker engine",
    "browser": "needs Debian's chromium",
    "bootstrap": "a fresh clone and a bare Python run the README commands (needs git, make and PyPI)",
    "slurm": "needs a Slurm controller answering on this host (.ci/start-slurm.sh starts one)",
}
UNIT = "unit"
_EXEMPT_MARKERS = tuple(TIERS)
# `make test` (tests/run_tiers.py) runs these real tests in a pytest of their own beside the
# others: they wait mostly on dockerd, the disk and the network (Docker, a fresh clone's set-up) or
# pick their own ports (DeepSpeed's test harness in the PR regression test), and the two streams
# then take about as long each. Marked as collected, like the tiers.
SIDE_STREAM = "side_stream"
SIDE_STREAM_TIERS = ("docker", "bootstrap")
SIDE_STREAM_MODULES = ("test_pr_regression_integration.py",)


def pytest_configure(config: pytest.Config) -> None:
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    config.addinivalue_line(
        "markers", f"{UNIT}: the default tier: fakes only (added to every test without a tier)"
    )
    config.addinivalue_line(
        "markers", f"{SIDE_STREAM}: run beside the other real tests by make test (added; see SIDE_STREAM)"
    )
    config.addinivalue_line(
        "markers",
        "optional: an opt-in test of a real tier that may skip even in CI (e.g. a slow stand-in build)",
    )


def pytest_itemcollected(item: pytest.Item) -> None:
    # Marked as each test is collected, before `-m` deselects by marker.
    if not any(item.get_closest_marker(m) for m in TIERS):
        item.add_marker(UNIT)
    elif any(item.get_closest_marker(m) for m in SIDE_STREAM_TIERS) or item.path.name in SIDE_STREAM_MODULES:
        item.add_marker(SIDE_STREAM)


def _tier(item_keywords: Any) -> str:
    return next((name for name in TIERS if name in item_keywords), UNIT)


_tier_seconds: dict[str, list[float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Each tier's cost stays in sight (CI prints it with pytest's slowest tests).
    entry = _tier_seconds.setdefault(_tier(report.keywords), [0.0, 0.0])
    entry[1] += report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome == "skipped"):
        entry[0] += 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _tier_seconds:
        return
    terminalreporter.section("time per tier (setup + call + teardown)")
    for name, (count, seconds) in sorted(_tier_seconds.items(), key=lambda kv: -kv[1][1]):
        terminalreporter.write_line(f"{name:<12} {int(count):>5} tests {seconds:>9.1f} s")


class _RefusedCall(AssertionError):
    pass


# Programs a library may probe for and do without: refused as if not installed, so the library's
# own fallback runs (matplotlib's font manager runs `fc-list` on first use with no font cache).
_ABSENT_PROGRAMS = ("fc-list",)


def _program(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    argv = args[0] if args else kwargs.get("args", "")
    first = argv if isinstance(argv, (str, bytes, os.PathLike)) else (list(argv) or [""])[0]
    return os.path.basename(os.fsdecode(first))


def _refuse(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        if what == "subprocess.Popen" and _program(args, kwargs) in _ABSENT_PROGRAMS:
            name = _program(args, kwargs)
            raise FileNotFoundError(errno.ENOENT, f"No such file or directory: {name!r}", name)
        raise _RefusedCall(
            f"default-tier test tried to use the real {what} (args={args[:1]!r}); fake the seam "
            "(repro.core.cmd.run / a fake docker client), mark the test, or request `real_subprocess`"
        )

    return refuse


@pytest.fixture(autouse=True)
def _no_real_side_effects(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if any(request.node.get_closest_marker(m) for m in _EXEMPT_MARKERS):
        return
    if "real_subprocess" not in request.fixturenames:
        monkeypatch.setattr(subprocess, "Popen", _refuse("subprocess.Popen"))
    try:
        import docker.api.client  # binds `docker` too
    except ImportError:
        return
    monkeypatch.setattr(docker, "from_env", _refuse("Docker client (docker.from_env)"))
    monkeypatch.setattr(docker, "DockerClient", _refuse("Docker client (docker.DockerClient)"))
    monkeypatch.setattr(docker.api.client.APIClient, "__init__", _refuse("Docker API client"))


@pytest.fixture
def real_subprocess() -> None:
    """Opt-in for default-tier tests that must run a real, cheap process (e.g. `sh -c`)."""


# CI sets MICS_REPRO_REQUIRE_TIERS=1: there a tier that skips (no Docker daemon, no venv, no
# chromium) means the CI script failed to provide it, so the skip is turned into a failure.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and os.environ.get("MICS_REPRO_REQUIRE_TIERS") == "1"
        and any(item.get_closest_marker(m) for m in _EXEMPT_MARKERS)
        and not item.get_closest_marker("optional")
    ):
        report.outcome = "failed"
        report.longrepr = f"tier required in CI but skipped: {report.longrepr}"


# Real evidence made once per test session and shared by every module that asserts on it
# (tests/fixtures/; STYLE.md 15): registered here so any test module can ask for it by name.
from tests.fixtures.classifier_job import classifier_project, classifier_run  # noqa: E402, F401
from tests.fixtures.cpu_plan import reporter_stack  # noqa: E402, F401
from tests.fixtures.docker_repro import docker_cpu_repro  # noqa: E402, F401
from tests.fixtures.fake_bundle_docker import host  # noqa: E402, F401 - the bundle tests' host
