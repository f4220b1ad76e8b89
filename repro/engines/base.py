"""Where the suite runs: a Docker image or a cached venv, behind one small protocol.

This module holds only the protocol, the types every engine shares and the lock probe both
engines' sweeps use; it imports no engine, so the engines depend on it and never the other way.
Choosing an engine is repro.engines.select.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from repro.core import paths
from repro.core.errors import UsageError

if TYPE_CHECKING:
    from repro.engines.jobdeps import JobDeps
    from repro.matrix.model import Env
    from repro.workload.record import LayerRecord

# The in-environment entry point (repro/workload/suite.py); engines add `--out`.
SUITE_MODULE = "repro.workload.suite"
REPO_ROOT = paths.REPO_ROOT


def safe_name(name: str) -> str:
    """`name` (an env id) in a file name (the build logs): all but letters, digits and `_.-` is `_`."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


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

    def prepare_job(self, env: Env, prepared: Prepared, deps: JobDeps) -> tuple[Prepared, LayerRecord]:
        """The job's packages (REQUIREMENTS=/PACKAGES=) over the prepared env, and what the
        record says of them; a UsageError when this engine cannot add them."""
        ...

    def run_job(
        self,
        prepared: Prepared,
        args: Sequence[str],
        out_dir: Path,
        workdir: Path,
        timeout_s: float | None,
        *,
        network: bool = False,
    ) -> SuiteRun:
        """A custom command under the in-env job runner (`python -m repro.workload.job *args
        --out ...`) in `workdir`; `network`: whether a container keeps its network."""
        ...


class Delegating:
    """An engine that wraps another and hands it every step it does not change (bisect's watch on
    `prepare`, the DeepSpeed checkout layers): subclasses override what they add."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.kind = inner.kind

    def describe(self) -> str:
        return self.inner.describe()

    def preflight(self, env: Env) -> None:
        self.inner.preflight(env)

    def prepare(self, env: Env) -> Prepared:
        return self.inner.prepare(env)

    def run_suite(
        self, prepared: Prepared, args: Sequence[str], out_dir: Path, timeout_s: float | None
    ) -> SuiteRun:
        return self.inner.run_suite(prepared, args, out_dir, timeout_s)

    def prepare_job(self, env: Env, prepared: Prepared, deps: JobDeps) -> tuple[Prepared, LayerRecord]:
        return self.inner.prepare_job(env, prepared, deps)

    def run_job(
        self,
        prepared: Prepared,
        args: Sequence[str],
        out_dir: Path,
        workdir: Path,
        timeout_s: float | None,
        *,
        network: bool = False,
    ) -> SuiteRun:
        return self.inner.run_job(prepared, args, out_dir, workdir, timeout_s, network=network)


@runtime_checkable
class ResolvesEnv(Protocol):
    """An engine whose environment may differ from the env's image (the venv engine: the host's
    Python, and pins chosen for it): the plan holds the env as that engine will build it."""

    def resolve_env(self, env: Env) -> Env: ...


def as_built(engine: object, env: Env) -> Env:
    """`env` as `engine` will build it (unchanged for an engine that builds the image's)."""
    return engine.resolve_env(env) if isinstance(engine, ResolvesEnv) else env


@contextlib.contextmanager
def lock_if_free(path: Path, *, create: bool = False) -> Iterator[bool]:
    """True (and the lock held for the block) when no process holds the flock on `path`: the kernel
    drops it when its holder dies, however it dies. False when one holds it, or the file is gone
    (unless `create`)."""
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_CREAT if create else 0), 0o644)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock
