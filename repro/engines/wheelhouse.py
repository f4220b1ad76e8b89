"""A per-machine directory of wheels and sdists, so torch (gigabytes) is downloaded once, not per image.

Both engines install from it first (`--find-links`), the Docker engine by serving it over HTTP on
127.0.0.1 for the duration of a build. For an air-gapped site: run `ensure` for the wanted envs on
a connected machine, copy `<cache>/wheelhouse` to the same place on the target, and set
`MICS_REPRO_OFFLINE=1` there; installs then use only the wheelhouse (`--no-index`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from repro.core import cmd, console
from repro.core.errors import BuildError
from repro.core.paths import cache_root
from repro.engines.base import safe_name
from repro.matrix.compat import torch_build as torch_build  # its home moved; callers import it here

if TYPE_CHECKING:
    from repro.matrix.model import Env

PYPI_SIMPLE = "https://pypi.org/simple"
# Cross-downloads (target Python differs from the host's) name every platform tag the images
# accept: pip expands only the legacy manylinux2014 alias to older tags, and the PyTorch
# indexes tag their ROCm/CUDA wheels plain linux_x86_64.
TARGET_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "linux_x86_64",
)
STAMP_DIR = ".stamps"
DEFAULT_SERVE_PORT = 47491  # MICS_REPRO_WHEELHOUSE_PORT overrides


def offline_mode() -> bool:
    return os.environ.get("MICS_REPRO_OFFLINE", "") not in ("", "0")


@dataclass(frozen=True)
class DownloadPlan:
    """What one env needs in the wheelhouse; its `key` names the stamp written after a download."""

    requirements: tuple[str, ...]
    sdists: tuple[str, ...]
    index_url: str | None
    python: str

    @classmethod
    def for_env(cls, env: Env, python: str | None = None) -> DownloadPlan:
        """`python`: the major.minor the wheels are for (the venv's interpreter); default the env's."""
        # Everything the env's install steps take, DeepSpeed aside: it ships only an sdist, and is
        # fetched without its (already listed) dependencies.
        specs = [spec for step in env.install_steps() for spec in step.specs]
        reqs = tuple(r for r in specs if canonicalize_name(_name(r)) != "deepspeed")
        return cls(reqs, (f"deepspeed=={env.deepspeed}",), env.torch_index, python or env.python)

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def pinned(self) -> tuple[str, ...]:
        """The `name==version` specs: the big files whose absence means a download is needed."""
        return tuple(r for r in (*self.requirements, *self.sdists) if "==" in r)


def _name(spec: str) -> str:
    try:
        return Requirement(spec).name
    except InvalidRequirement as exc:
        raise BuildError(f"bad requirement {spec!r} in the env", why=str(exc)) from exc


@dataclass(frozen=True)
class _Dist:
    name: str
    version: Version
    tags: frozenset[Tag] | None  # None: an sdist, built for whatever Python installs it


def _dist(path: Path) -> _Dist | None:
    try:
        if path.name.endswith(".whl"):
            name, version, _build, tags = parse_wheel_filename(path.name)
            return _Dist(name, version, tags)
        if path.name.endswith((".tar.gz", ".zip")):
            name, version = parse_sdist_filename(path.name)
            return _Dist(name, version, None)
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return None


def _runs_on(tags: frozenset[Tag] | None, python: str | None) -> bool:
    """Whether a wheel's tags admit CPython `python` ("3.9") on Linux x86_64."""
    if tags is None or python is None:
        return True
    minor = int(python.split(".")[1])
    for tag in tags:
        if not (tag.platform == "any" or tag.platform.endswith("x86_64")):
            continue
        if tag.interpreter in ("py3", f"py3{minor}") or tag.interpreter == f"cp3{minor}":
            return True
        if tag.abi == "abi3" and tag.interpreter.startswith("cp3") and int(tag.interpreter[3:]) <= minor:
            return True
    return False


class Wheelhouse:
    def __init__(self, path: Path | None = None, *, offline: bool | None = None) -> None:
        self.path = path if path is not None else cache_root() / "wheelhouse"
        self.offline = offline_mode() if offline is None else offline

    def files_for(self, spec: str, python: str | None = None, build: str | None = None) -> list[Path]:
        """Files whose project and version satisfy `spec`, that install on CPython `python`.

        `build` (e.g. "rocm5.6") demands that local version label, so PyPI's torch does not pass
        for the ROCm build of the same version.
        """
        req = Requirement(spec)
        want = canonicalize_name(req.name)
        found = []
        for path in sorted(self.path.glob("*")) if self.path.is_dir() else []:
            dist = _dist(path)
            if dist is None or dist.name != want:
                continue
            if not req.specifier.contains(dist.version, prereleases=True):
                continue
            if build is not None and dist.version.local != build:
                continue
            if _runs_on(dist.tags, python):
                found.append(path)
        return found

    def missing(self, plan: DownloadPlan) -> list[str]:
        build = torch_build(plan.index_url)
        return [
            spec
            for spec in plan.pinned()
            if not self.files_for(spec, plan.python, build if _name(spec) == "torch" else None)
        ]

    def _stamp(self, plan: DownloadPlan) -> Path:
        return self.path / STAMP_DIR / f"{plan.key()}.json"

    def is_complete(self, plan: DownloadPlan) -> bool:
        return self._stamp(plan).is_file() and not self.missing(plan)

    def ensure(self, env: Env, python: str | None = None) -> bool:
        """Fill the wheelhouse for `env`; True when it then holds everything the env installs.

        A complete wheelhouse is what installs should use alone (`--no-index`): given both, pip
        takes an index's copy of a wheel over the identical local one, so torch would be fetched
        again. Complete means a stamp from a full `pip download` of the env (or, offline, every
        pinned file present). `python`: the CPython major.minor to fetch wheels for, the venv's
        interpreter (default: the env's, which its image uses).
        """
        plan = DownloadPlan.for_env(env, python)
        if self.is_complete(plan):
            console.info(f"wheelhouse: {env.id} already complete ({self.path})")
            return True
        if self.offline:
            missing = self.missing(plan)
            if missing:
                raise BuildError(
                    f"the wheelhouse lacks {', '.join(missing)} and MICS_REPRO_OFFLINE is set",
                    why=f"offline installs use only {self.path}",
                    fix="on a machine with network access run the same command without "
                    "MICS_REPRO_OFFLINE, then copy its wheelhouse directory here",
                )
            return True
        self.path.mkdir(parents=True, exist_ok=True)
        with console.task(
            f"wheelhouse: fetching what {env.id} needs into {self.path} (files already there are reused)"
        ):
            self._pip_download(plan, env.id)
        stamp = self._stamp(plan)
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(json.dumps(asdict(plan), indent=2) + "\n")
        return True

    def _download_argv(self, python: str | None = None) -> list[str]:
        """`pip download` into the wheelhouse (which it reads first); with `python`, for that CPython
        when it is not this tool's own."""
        argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-d", str(self.path)]
        argv += ["--find-links", str(self.path)]
        if python is not None and python != f"{sys.version_info.major}.{sys.version_info.minor}":
            argv += ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
            argv += [flag for platform in TARGET_PLATFORMS for flag in ("--platform", platform)]
        return argv

    def _pip_download(self, plan: DownloadPlan, env_id: str) -> None:
        index = ["--index-url", plan.index_url, "--extra-index-url", PYPI_SIMPLE] if plan.index_url else []
        steps = [
            [*self._download_argv(plan.python), *index, *plan.requirements],
            # DeepSpeed ships only an sdist; its deps are already in `requirements`.
            [*self._download_argv(), "--no-deps", "--no-binary", ":all:", *plan.sdists],
        ]
        # pip's output (hundreds of lines) goes to a log, shown in full when it fails.
        log = cache_root() / "logs" / f"wheelhouse-{safe_name(env_id)}.log"
        for argv in steps:
            result, _ = cmd.run_logged(argv, log, "wheelhouse: pip download")
            if not result.ok:
                raise BuildError(
                    "pip could not download the env's packages into the wheelhouse",
                    why=f"`pip download` exited with {result.returncode} (output above, and in {log})",
                    fix="check network access to PyPI (and the torch index); behind a TLS-"
                    "intercepting proxy set PIP_CERT or MICS_REPRO_CA_BUNDLE",
                )

    def add(self, specs: Sequence[str], python: str) -> bool:
        """Download these exact `name==version` packages, without their dependencies, for Python
        `python` (a job's packages, repro/engines/jobdeps.py): a bundle then carries them and an
        offline host installs them again. False when pip could not (the run goes on)."""
        self.path.mkdir(parents=True, exist_ok=True)
        return cmd.run([*self._download_argv(python), "--no-deps", *specs], capture=True).ok

    @contextlib.contextmanager
    def serve(self) -> Iterator[str]:
        """Serve the wheelhouse read-only on 127.0.0.1 while the block runs.

        Builds run with host networking, so pip inside the build reaches this address; a build
        context cannot carry gigabytes of wheels cheaply, and BuildKit mounts are unavailable.
        The port is fixed because the URL is a build arg, and the classic builder keys its
        layer cache on build-arg values: a new port per build would reinstall torch every time.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        handler = functools.partial(_QuietHandler, directory=str(self.path))
        port = int(os.environ.get("MICS_REPRO_WHEELHOUSE_PORT", DEFAULT_SERVE_PORT))
        try:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        except OSError as exc:
            console.warn(
                f"wheelhouse: port {port} is busy ({exc.strerror}); serving on a free port, so this "
                "build cannot reuse cached layers that used the wheelhouse"
            )
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, name="wheelhouse-http", daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # one line per wheel request would bury the build log
