"""Where the suite runs: a Docker image or a cached venv, behind one small protocol.

`choose_engine` walks the `docker|venv` chain: with ENGINE=auto the first available wins (Docker
when a daemon answers) and the choice is printed with its reason, so a log always says where a
result came from.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from repro.core import paths
from repro.core.errors import UsageError

if TYPE_CHECKING:
    from repro.matrix.model import Env

# The in-environment entry point (repro/workload/suite.py); engines add `--out`.
SUITE_MODULE = "repro.workload.suite"
REPO_ROOT = paths.REPO_ROOT


class EngineKind(enum.Enum):
    AUTO = "auto"
    DOCKER = "docker"
    VENV = "venv"

    @classmethod
    def parse(cls, value: str) -> EngineKind:
        try:
            return cls(value.strip().lower())
        except ValueError:
            valid = ", ".join(k.value for k in cls)
            raise UsageError(f"unknown engine {value!r}", fix=f"use one of: {valid}") from None


@dataclass(frozen=True)
class Prepared:
    """An environment ready to run the suite: an image (id + tag) or a venv (its directory)."""

    engine: EngineKind
    env_id: str
    handle: str
    label: str
    reused: bool
    details: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SuiteRun:
    """What running the suite did. A time-out is a value here (exit code 124), never an exception."""

    exit_code: int
    timed_out: bool
    duration_s: float
    out_dir: Path
    log_path: Path | None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Engine(Protocol):
    kind: EngineKind

    def describe(self) -> str:
        """One line for the preamble: which daemon / which interpreter."""
        ...

    def preflight(self, env: Env) -> None:
        """Raise a typed error before anything long starts (missing devices, Python too new...)."""
        ...

    def prepare(self, env: Env) -> Prepared:
        """Build or reuse the image/venv for `env`, printing progress on long steps."""
        ...

    def run_suite(
        self, prepared: Prepared, args: Sequence[str], out_dir: Path, timeout_s: float | None
    ) -> SuiteRun:
        """Run `python -m repro.workload.suite *args --out ...`; results land in `out_dir`."""
        ...


DockerProbe = Callable[[], tuple[bool, str]]


def _probe_docker() -> tuple[bool, str]:
    from repro.engines.docker.engine import daemon_status

    return daemon_status()


def choose_engine(
    requested: EngineKind | str | None = None,
    *,
    docker_probe: DockerProbe = _probe_docker,
    python: str | None = None,
) -> Engine:
    """Resolve ENGINE (argument, else the ENGINE variable, else auto) to a concrete engine.

    An explicit `docker` with no daemon fails here (DockerUnavailableError) instead of falling
    back silently: a user who asked for a container must not get a venv result unknowingly.
    """
    if requested is None:
        requested = os.environ.get("ENGINE", "auto") or "auto"
    kind = requested if isinstance(requested, EngineKind) else EngineKind.parse(requested)

    if kind is EngineKind.AUTO:
        up, reason = docker_probe()
        kind = EngineKind.DOCKER if up else EngineKind.VENV
        print(f"engine: {kind.value} (ENGINE=auto; {reason})", flush=True)
    else:
        print(f"engine: {kind.value} (requested)", flush=True)

    if kind is EngineKind.DOCKER:
        from repro.engines.docker.engine import DockerEngine

        return DockerEngine.connect()
    from repro.engines.venv.engine import VenvEngine

    return VenvEngine(python=python)
