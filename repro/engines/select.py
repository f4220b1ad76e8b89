"""Choosing where the suite runs: the `docker|venv` chain.

With ENGINE=auto the first available engine wins (Docker when a daemon answers) and the choice is
printed with its reason, so a log always says where a result came from. This is the one module
that knows every engine class; repro.engines.base knows none of them.
"""

from __future__ import annotations

import os
from typing import Callable

from repro.core import console
from repro.engines.base import Engine, EngineKind
from repro.engines.docker import engine as docker_engine
from repro.engines.venv.engine import VenvEngine

DockerProbe = Callable[[], tuple[bool, str]]


def choose_engine(
    requested: EngineKind | str | None = None,
    *,
    docker_probe: DockerProbe | None = None,
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
        # Looked up at call time, so a test can patch docker_engine.daemon_status.
        up, reason = (docker_probe or docker_engine.daemon_status)()
        kind = EngineKind.DOCKER if up else EngineKind.VENV
        console.info(f"engine: {kind.value} (ENGINE=auto; {reason})")
    else:
        console.info(f"engine: {kind.value} (requested)")

    if kind is EngineKind.DOCKER:
        return docker_engine.DockerEngine.connect()
    return VenvEngine(python=python)
