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

_EXEMPT_MARKERS = ("integration", "docker", "browser", "bootstrap", "slurm")


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
