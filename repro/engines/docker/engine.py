"""The Docker engine: everything that talks to the Docker daemon lives here (docker-py 7.x).

Images are built from an in-memory context (nothing is written into the repo) that mirrors the
repo paths the Dockerfiles COPY from, with host networking so pip reaches PyPI and the
wheelhouse served on 127.0.0.1. Suites run in containers with networking off; a container is a
context manager that is removed on success, failure, Ctrl-C and time-out alike.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import importlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from repro.core import console
from repro.core.cmd import STOP_GRACE_S as HOST_STOP_GRACE_S
from repro.core.errors import BuildError, UsageError
from repro.core.paths import REPO_ROOT, cache_root
from repro.core.printable import printable
from repro.engines import jobdeps
from repro.engines.base import SUITE_MODULE, EngineKind, Prepared, SuiteRun, lock_if_free, safe_name
from repro.engines.docker import joblayer
from repro.engines.docker.build_context import (
    BuildContext,
    ca_bundle,
    image_args,
    make_context,
    parse_build_args,
    source_args,
)
from repro.engines.passthrough import run_environment
from repro.engines.preflight import DockerFacts, check_devices, cuda_via_cdi, docker_unavailable
from repro.engines.wheelhouse import Wheelhouse
from repro.workload.parentwatch import OWNER_LOCK_DIR, OWNER_LOCK_ENV, OWNER_LOCK_PATH

if TYPE_CHECKING:
    from repro.matrix.model import Env
    from repro.workload.record import ImageLayerRecord, LayerRecord

LABEL_CONTEXT = "mics-repro.context-sha"
LABEL_PINS_KEY = "mics-repro.pins-key"
# A run's container names its tool's owner-lock folder: the next start removes the containers
# whose tool died without removing them (SIGKILL), see sweep_stale.
LABEL_OWNER = "mics-repro.owner"
OWNER_LOCK_FILE = "owner.lock"


def daemon_status() -> tuple[bool, str]:
    """(answers, reason) for ENGINE=auto; never raises."""
    try:
        _client()
        host = os.environ.get("DOCKER_HOST") or "the local socket"
        return True, f"a Docker daemon answers at {host}"
    except Exception as exc:  # any failure means "no usable daemon" here
        return False, f"no Docker daemon answers ({type(exc).__name__}: {str(exc)[:120]})"


def _client(timeout: int = 30) -> Any:
    """A docker-py client whose daemon answered a ping (raises when none does)."""
    # Imported by name: the repo's own docker/ folder (Dockerfiles) shadows docker-py for mypy.
    docker = importlib.import_module("docker")
    # docker-py 7.2 follows the CLI context unless DOCKER_HOST is set; from_env covers both.
    client = docker.from_env(timeout=timeout)
    client.ping()
    return client


@dataclass
class _BuildLog:
    path: Path
    prefix: str
    errors: list[str] = field(default_factory=list)
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=25))


class DockerEngine:
    kind = EngineKind.DOCKER

    def __init__(
        self,
        client: Any,
        *,
        repo_root: Path = REPO_ROOT,
        wheelhouse: Wheelhouse | None = None,
        log_dir: Path | None = None,
        base_image: str | None = None,
        build_args: Mapping[str, str] | None = None,
    ) -> None:
        self.client = client
        self.repo_root = repo_root
        self.wheelhouse = wheelhouse if wheelhouse is not None else Wheelhouse()
        self.log_dir = log_dir if log_dir is not None else cache_root() / "logs"
        self.base_override = base_image or os.environ.get("MICS_REPRO_BASE_IMAGE") or None
        self.extra_args = (
            dict(build_args)
            if build_args is not None
            else parse_build_args(os.environ.get("MICS_REPRO_BUILD_ARGS", ""))
        )

    @classmethod
    def connect(cls, **kwargs: Any) -> DockerEngine:
        try:
            client = _client()
        except Exception as exc:
            raise docker_unavailable(f"{type(exc).__name__}: {exc}") from exc
        # The ping had a deadline; the rest must not: a followed log stream is silent for as long
        # as a run is (a hang waits out its whole limit), and a client timeout would cut it.
        client.api.timeout = None
        return cls(client, **kwargs)

    def describe(self) -> str:
        version = self.client.version()
        return f"Docker {version.get('Version', '?')} (API {version.get('ApiVersion', '?')})"

    def preflight(self, env: Env) -> None:
        refuse_host_torch(env)
        check_devices(env, docker=DockerFacts.from_info(self.client.info()))

    # -- images ------------------------------------------------------------------------------
    def image_labels(self, ref: str) -> dict[str, str] | None:
        import docker.errors

        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        return dict(image.labels or {})

    def image_id(self, ref: str) -> str:
        return str(self.client.images.get(ref).id)

    def prepare(self, env: Env) -> Prepared:
        refuse_host_torch(env)
        tag = env.image_tag()
        ca = ca_bundle()
        args = image_args(self.base_override, self.extra_args)
        context = make_context(env, self.repo_root, ca, args)
        labels = self.image_labels(tag)
        if labels is not None and labels.get(LABEL_CONTEXT) == context.digest:
            console.info(f"docker: reusing image {tag} (Dockerfile and workload unchanged)")
            return Prepared(EngineKind.DOCKER, env.id, self.image_id(tag), tag, True, _details(env))
        if labels is not None:
            console.info(
                f"docker: {tag} exists but its Dockerfile or workload changed; rebuilding "
                "(cached layers are reused)"
            )
        complete = self.wheelhouse.ensure(env)
        image_id = self.build(env, context, args, wheelhouse_only=complete)
        return Prepared(EngineKind.DOCKER, env.id, image_id, tag, False, _details(env))

    def build(
        self,
        env: Env,
        context: BuildContext,
        args: Mapping[str, str],
        *,
        wheelhouse_only: bool = False,
        tag: str | None = None,
    ) -> str:
        """Build `env`'s image (or, with `tag`, an image over it: a job's packages);
        `wheelhouse_only` installs from the served wheelhouse alone."""
        tag = tag or env.image_tag()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = _BuildLog(self.log_dir / f"build-{safe_name(env.id)}.log", f"[build {env.id}] ")
        started = time.monotonic()
        with (
            console.task(f"docker: building {tag} (log: {log.path})"),
            self.wheelhouse.serve() as url,
            open(log.path, "w") as sink,
        ):
            no_index = wheelhouse_only or self.wheelhouse.offline
            all_args = {**source_args(url, no_index=no_index, environ=os.environ), **args}
            stream = self.client.api.build(
                fileobj=io.BytesIO(context.data),
                custom_context=True,
                dockerfile=context.dockerfile,
                tag=tag,
                buildargs=all_args,
                network_mode="host",
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                labels={LABEL_CONTEXT: context.digest, LABEL_PINS_KEY: env.pins_key()},
            )
            for chunk in stream:
                _record_chunk(chunk, log, sink)
            # Inside the step, so that a failed build ends its live line as failed.
            if log.errors:
                hint = ""
                unreachable = ("pull access denied", "no such host", "not found")
                if any(word in e for e in log.errors for word in unreachable):
                    hint = (
                        "; if no registry is reachable, make a local base (`make base-image`) and set "
                        "MICS_REPRO_BASE_IMAGE=mics-repro/base:bookworm (CPU envs)"
                    )
                if not console.shows(console.Level.VERBOSE):  # not streamed: the whole output now
                    console.failed(
                        f"docker: building {tag} failed; its output ({log.path}):",
                        log.path.read_text(errors="replace").rstrip(),
                    )
                raise BuildError(
                    f"building {tag} failed",
                    why="\n".join(log.tail)[-3000:],
                    fix=f"read the whole log in {log.path}{hint}",
                )
        image_id = self.image_id(tag)
        console.info(f"docker: built {tag} ({image_id[:19]}) in {time.monotonic() - started:.0f} s")
        return image_id

    def prepare_job(
        self, env: Env, prepared: Prepared, deps: jobdeps.JobDeps
    ) -> tuple[Prepared, LayerRecord]:
        """The job's packages (REQUIREMENTS=/PACKAGES=) as an image FROM the env's
        (repro/engines/docker/joblayer.py); runs then use that image."""
        tag = joblayer.job_tag(env.image_tag(), deps)
        context = joblayer.make_context(env.image_tag(), prepared.handle, deps)
        labels = self.image_labels(tag)
        reused = labels is not None and labels.get(LABEL_CONTEXT) == context.digest
        if reused:
            console.info(f"docker: reusing the job image {tag} ({deps.describe()})")
            image_id = self.image_id(tag)
        else:
            self.wheelhouse.path.mkdir(parents=True, exist_ok=True)
            for wheel in deps.wheels:  # the job's own wheels travel with the wheelhouse
                shutil.copy2(wheel, self.wheelhouse.path / Path(wheel).name)
            image_id = self.build(env, context, {}, wheelhouse_only=self.wheelhouse.offline, tag=tag)
        out = self.client.containers.run(image_id, ["cat", joblayer.ADDED], remove=True, **offline_kwargs())
        added = json.loads(out.decode() if isinstance(out, bytes) else str(out))
        specs = [f"{name}=={version}" for name, version in added.items()]
        keep = specs and not reused and not self.wheelhouse.offline
        if keep and not self.wheelhouse.add(specs, env.python):  # the run goes on; offline reuse is lost
            console.warn(f"warning: could not copy the job's packages into {self.wheelhouse.path}")
        record: ImageLayerRecord = {
            **deps.record(),
            "layer": tag,
            "image_id": image_id,
            "base": prepared.label,
            "added": added,
        }
        label = f"{tag} (the job's packages over {prepared.label})"
        return Prepared(EngineKind.DOCKER, env.id, image_id, label, reused, _details(env)), record

    def import_rootfs(self, tar_path: Path, ref: str, changes: Sequence[str]) -> str:
        """`docker import` a root filesystem tarball (the locally made base image)."""
        repository, _, tag = ref.rpartition(":")
        self.client.api.import_image_from_file(
            str(tar_path), repository=repository, tag=tag, changes=list(changes)
        )
        return self.image_id(ref)

    # -- containers ----------------------------------------------------------------------------
    def run_suite(
        self, prepared: Prepared, args: Sequence[str], out_dir: Path, timeout_s: float | None
    ) -> SuiteRun:
        command = ["python", "-m", SUITE_MODULE, *args]
        return self._run_in_env(prepared, command, out_dir, timeout_s, prepared.env_id)

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
        """A custom command (repro/run/job.py): the in-env runner in the env's image, WORKDIR
        mounted read-write at the same path (the job's files stay where the user has them), no
        network unless asked."""
        # MICS_REPRO_HOOK_PTH: the runner installs the hook's .pth into the image's Python (in this
        # container only), so a job that replaces PYTHONPATH is still hooked (repro/workload/hookpth.py).
        command = ["env", "MICS_REPRO_HOOK_PTH=1", "python", "-m", "repro.workload.job", *args]
        name, binds = f"{prepared.env_id}-job", (f"{workdir}:{workdir}:rw",)
        return self._run_in_env(prepared, command, out_dir, timeout_s, name, binds, network)

    def _run_in_env(
        self,
        prepared: Prepared,
        command: Sequence[str],
        out_dir: Path,
        timeout_s: float | None,
        name_hint: str,
        binds: tuple[str, ...] = (),
        network: bool = False,
    ) -> SuiteRun:
        return self.run(
            prepared.handle,
            [*command, "--out", RESULTS_DIR],
            out_dir,
            timeout_s,
            platform=prepared.details.get("platform", "cpu"),
            name_hint=name_hint,
            copy_out=RESULTS_DIR,
            binds=binds,
            network=network,
        )

    def run(
        self,
        image: str,
        command: Sequence[str],
        out_dir: Path,
        timeout_s: float | None,
        *,
        platform: str = "cpu",
        name_hint: str = "run",
        copy_out: str | None = None,
        binds: tuple[str, ...] = (),
        network: bool = False,
    ) -> SuiteRun:
        out_dir.mkdir(parents=True, exist_ok=True)
        log_path = out_dir / "engine.log"
        via_cdi = platform == "cuda" and cuda_via_cdi(DockerFacts.from_info(self.client.info()))
        options = replace(run_options(platform, device_gids(), via_cdi=via_cdi), binds=binds, network=network)
        name = f"mics-repro-{re.sub(r'[^a-zA-Z0-9_.-]+', '-', name_hint)}-{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        # Containers get none of the host's environment but the GPU selection and NCCL/RCCL/HSA settings;
        # without a network, none of those that name the host's interfaces (passthrough.py says why).
        passed = run_environment(os.environ, platform, networkless=not network)
        sweep_stale(self.client, owners_dir())
        with (
            _owner_lock() as lock_dir,
            ManagedContainer(
                self.client,
                image,
                list(command),
                name,
                replace(options, binds=(*options.binds, f"{lock_dir}:{OWNER_LOCK_DIR}:ro")),
                {"PYTHONUNBUFFERED": "1", **passed, OWNER_LOCK_ENV: OWNER_LOCK_PATH},
                labels={LABEL_OWNER: lock_dir},
            ) as box,
        ):
            try:
                box.start()
                logger = threading.Thread(
                    target=box.follow_logs, args=(log_path, f"[{name_hint}] "), daemon=True
                )
                logger.start()
                exit_code, timed_out = box.wait(timeout_s)
                logger.join(timeout=30)
            except BaseException:
                # Ctrl-C/SIGTERM/SIGHUP: the suite, interrupted, records what it has; keep those
                # records (copied out before the container is removed on leaving the block).
                if copy_out:
                    box.stop_and_copy_out(copy_out, out_dir)
                raise
            if copy_out:
                box.copy_out(copy_out, out_dir)
        return SuiteRun(exit_code, timed_out, time.monotonic() - started, out_dir, log_path)


@contextlib.contextmanager
def _owner_lock() -> Iterator[str]:
    """A folder holding a file this process keeps locked while the container runs: the suite in
    it waits for the lock (repro/workload/parentwatch.py), which the kernel releases when this
    process dies, even by SIGKILL, and then stops its runs. Nothing of a run outlives the tool."""
    # Under the cache (in $HOME): a folder Docker Desktop shares with its VM by default, unlike /tmp.
    parent = owners_dir()
    parent.mkdir(parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="run-", dir=parent)
    path = os.path.join(folder, OWNER_LOCK_FILE)
    try:
        with open(path, "w") as handle:
            os.chmod(folder, 0o755)
            os.chmod(path, 0o644)  # readable by the container's user, whoever it is
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def owners_dir() -> Path:
    return cache_root() / "owners"


def sweep_stale(client: Any, owners: Path) -> list[str]:
    """Remove the containers of runs whose tool is gone; their names.

    A tool killed by SIGKILL cannot remove its container: the suite in it stops itself when the
    owner lock is released (repro/workload/parentwatch.py), and the stopped container stays. Such a
    container is recognised by its owner folder (LABEL_OWNER): one of ours (under `owners`) whose
    lock nobody holds any more. Only then is it removed, with the folder; a live tool's lock is
    held, so its running container is never touched, nor one whose folder is gone (a container
    kept on purpose with MICS_REPRO_KEEP_CONTAINER, another cache's run). Never raises.
    """
    import docker.errors

    try:
        # ignore_removed: docker-py inspects each listed container; one removed in between by its
        # own tool is not a failure to look.
        found = client.containers.list(all=True, filters={"label": LABEL_OWNER}, ignore_removed=True)
    except (docker.errors.DockerException, OSError) as exc:
        console.warn(f"warning: could not look for containers left by killed runs: {exc}")
        return []
    removed: list[str] = []
    for container in found:
        folder = Path(str((container.labels or {}).get(LABEL_OWNER, "")))
        if folder.parent != owners or not folder.name.startswith("run-"):
            continue
        with lock_if_free(folder / OWNER_LOCK_FILE) as free:
            if not free:
                continue
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                console.warn(f"warning: could not remove container {container.name}: {exc}")
                continue
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(container.name))
    _sweep_orphan_folders(owners, {Path(str((c.labels or {}).get(LABEL_OWNER, ""))) for c in found})
    if removed:
        console.info(
            f"docker: removed {len(removed)} container(s) left by a killed run: {', '.join(removed)}"
        )
    return removed


# A folder is made, then locked, then bound into a container a moment later: one that no container
# names and nobody has locked for this long is a killed tool's whose container was already gone.
ORPHAN_FOLDER_AGE_S = 3600.0


def _sweep_orphan_folders(owners: Path, named: set[Path]) -> None:
    try:
        folders = [f for f in owners.iterdir() if f.name.startswith("run-") and f not in named]
    except OSError:
        return
    for folder in folders:
        try:
            if time.time() - folder.stat().st_mtime < ORPHAN_FOLDER_AGE_S:
                continue
        except OSError:
            continue
        with lock_if_free(folder / OWNER_LOCK_FILE) as free:
            if free:
                shutil.rmtree(folder, ignore_errors=True)


def _details(env: Env) -> dict[str, str]:
    return {"platform": env.platform.value, "tag": env.image_tag()}


def _record_chunk(chunk: Mapping[str, Any], log: _BuildLog, sink: Any) -> None:
    text = chunk.get("stream") or chunk.get("status") or ""
    if "error" in chunk:
        detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
        log.errors.append(str(detail))
        text = f"ERROR: {detail}\n"
    if text:
        sink.write(text)
        sink.flush()  # so `tail -f` on the log follows a long build
        for line in str(text).splitlines():
            if line.strip():
                log.tail.append(line)
                console.detail(log.prefix + line)  # VERBOSE=1; else only the step's line, and the log


# -- running containers --------------------------------------------------------------------------
RESULTS_DIR = "/results"
KEEP_ENV = "MICS_REPRO_KEEP_CONTAINER"
# Per step (SIGINT, then SIGTERM, then SIGKILL): the same as for a suite in a venv, which is
# longer than the suite's own escalation (workload/defaults.py SUITE_STOP_S), so the suite
# stops its ranks and writes their records before Docker would kill it.
STOP_GRACE_S = HOST_STOP_GRACE_S
CPU_SHM = "8g"  # torch's shared-memory tensors and gloo need more than Docker's 64 MB default
ROCM_DEVICES = ("/dev/kfd", "/dev/dri")


@dataclass(frozen=True)
class RunOptions:
    """The platform-dependent part of `containers.create(...)`."""

    devices: tuple[str, ...] = ()
    group_add: tuple[str, ...] = ()
    ipc_mode: str | None = None
    shm_size: str | None = None
    security_opt: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    gpus: bool = False
    cdi_devices: tuple[str, ...] = ()  # e.g. "nvidia.com/gpu=all": GPUs by CDI name instead of --gpus
    binds: tuple[str, ...] = ()  # "host:container:rw" (custom jobs: WORKDIR at the same path)
    network: bool = False  # containers run offline; a custom job may ask for it (NETWORK=1)

    def to_kwargs(self) -> ContainerOptions:
        kwargs: ContainerOptions = {}
        if self.binds:
            kwargs["volumes"] = list(self.binds)
        if self.devices:
            kwargs["devices"] = [f"{d}:{d}:rwm" for d in self.devices]
        if self.group_add:
            kwargs["group_add"] = list(self.group_add)
        if self.ipc_mode:
            kwargs["ipc_mode"] = self.ipc_mode
        if self.shm_size:
            kwargs["shm_size"] = self.shm_size
        if self.security_opt:
            kwargs["security_opt"] = list(self.security_opt)
        if self.cap_add:
            kwargs["cap_add"] = list(self.cap_add)
        if self.gpus or self.cdi_devices:
            from docker.types import DeviceRequest

            requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])] if self.gpus else []
            if self.cdi_devices:  # what `docker run --device nvidia.com/gpu=all` sends (Docker 25+)
                requests.append(DeviceRequest(driver="cdi", device_ids=list(self.cdi_devices)))
            kwargs["device_requests"] = requests
        return kwargs

    def cli_pairs(self) -> list[tuple[str, str]]:
        """The same options as `docker run` (flag, value) pairs, for printed and scripted runs."""
        pairs = [("--device", d) for d in self.devices] + [("--group-add", g) for g in self.group_add]
        if self.ipc_mode:
            pairs.append(("--ipc", self.ipc_mode))
        if self.shm_size:
            pairs.append(("--shm-size", self.shm_size))
        pairs += [("--security-opt", o) for o in self.security_opt] + [("--cap-add", c) for c in self.cap_add]
        if self.gpus:
            pairs.append(("--gpus", "all"))
        pairs += [("--device", d) for d in self.cdi_devices]
        pairs += [("-v", b) for b in self.binds]
        return pairs


# RunOptions as keyword arguments of docker-py's containers.create.
class ContainerOptions(TypedDict, total=False):
    volumes: list[str]
    devices: list[str]
    group_add: list[str]
    ipc_mode: str
    shm_size: str
    security_opt: list[str]
    cap_add: list[str]
    device_requests: list[Any]  # docker.types.DeviceRequest (docker-py has no types)


def offline_kwargs() -> dict[str, str]:
    """A container without a network that still has its loopback: `docker run --network none`.
    (docker-py's `network_disabled=True` leaves no network at all and an empty /etc/hosts, so
    `localhost` does not resolve: accelerate's port check and any rendezvous on "localhost" die with
    socket.gaierror, a failure no user's host has.)"""
    return {"network_mode": "none"}


def device_gids(paths: Sequence[str] = ROCM_DEVICES) -> tuple[int, ...]:
    """GIDs owning the ROCm device nodes (and the render nodes under /dev/dri), sorted, unique."""
    gids: set[int] = set()
    for path in paths:
        candidates = [Path(path)]
        if Path(path).is_dir():
            candidates += [p for p in Path(path).iterdir() if p.name.startswith(("render", "card"))]
        for node in candidates:
            try:
                gids.add(node.stat().st_gid)
            except OSError:
                continue
    gids.discard(0)
    return tuple(sorted(gids))


def run_options(platform: str, rocm_gids: Sequence[int] = (), *, via_cdi: bool = False) -> RunOptions:
    """`via_cdi` (CUDA): the daemon has NVIDIA CDI specs but no NVIDIA runtime hook, so `--gpus` may
    find no device driver (daemons before moby#50228): ask for the GPUs by their CDI name."""
    if platform == "rocm":
        # Numeric GIDs work whatever /etc/group the image has; "video" is the documented fallback.
        groups = tuple(str(g) for g in rocm_gids) or ("video",)
        return RunOptions(
            devices=ROCM_DEVICES,
            group_add=groups,
            ipc_mode="host",
            security_opt=("seccomp=unconfined",),
            cap_add=("SYS_PTRACE",),
        )
    if platform == "cuda":
        if via_cdi:
            return RunOptions(ipc_mode="host", cdi_devices=("nvidia.com/gpu=all",))
        return RunOptions(ipc_mode="host", gpus=True)
    return RunOptions(shm_size=CPU_SHM)


class ManagedContainer:
    """A created container that is always removed on leaving the block (unless KEEP_ENV is set)."""

    def __init__(
        self,
        client: Any,
        image: str,
        command: list[str],
        name: str,
        options: RunOptions,
        environment: Mapping[str, str] | None = None,
        *,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.client, self.image, self.command, self.name = client, image, command, name
        self.options = options
        self.environment = dict(environment or {"PYTHONUNBUFFERED": "1"})
        self.labels = {"mics-repro": "1", **(labels or {})}
        self.container: Any = None

    def __enter__(self) -> ManagedContainer:
        # A failure inside create leaves nothing behind; anything after it is undone by __exit__.
        try:
            self.container = self.client.containers.create(
                self.image,
                self.command,
                name=self.name,
                init=True,
                **({} if self.options.network else offline_kwargs()),
                environment=self.environment,
                labels=self.labels,
                **self.options.to_kwargs(),
            )
        except KeyboardInterrupt:  # the daemon may have made it before the answer was cut off
            self._remove_by_name()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if os.environ.get(KEEP_ENV, "") not in ("", "0"):
            console.info(
                f"docker: keeping container {self.name} ({KEEP_ENV} is set); remove it with "
                f"`docker rm -f {self.name}`"
            )
            return
        if exc_type is not None and self._running():
            try:
                self.stop()
            except BaseException:  # a second Ctrl-C while stopping: fall through to the forced remove
                pass
        try:
            self._remove()
        except KeyboardInterrupt:
            self._remove()  # one more Ctrl-C during the removal: remove anyway, then stop
            raise

    def start(self) -> None:
        self.container.start()

    def _running(self) -> bool:
        try:
            self.container.reload()
            return bool(self.container.status == "running")
        except Exception:
            return False

    def wait(self, timeout_s: float | None) -> tuple[int, bool]:
        """(exit code, timed out). On time-out the container is stopped; the code is then 124."""
        import requests

        try:
            status = self.container.wait(timeout=timeout_s)
            return int(status.get("StatusCode", -1)), False
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            console.warn(f"! {self.name}: time limit of {timeout_s:g} s reached; stopping it")
            self.stop()
            return 124, True

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Interrupt (SIGINT, so the suite can write what it has), then terminate, then kill."""
        import docker.errors
        import requests

        try:
            self.container.kill(signal="SIGINT")
            self.container.wait(timeout=grace_s)
            return
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            pass
        except docker.errors.APIError:
            return  # already stopped
        self.container.stop(timeout=int(grace_s))

    def stop_and_copy_out(self, container_path: str, dest: Path) -> None:
        """On an interruption: stop the suite the gentle way, then save what it wrote. Never raises
        (the interruption being handled is what the caller re-raises); a second interruption
        while stopping skips to the removal."""
        try:
            if self._running():
                self.stop()
            console.info(f"docker: copying what {self.name} recorded before removing it")
            self.copy_out(container_path, dest)
        except BaseException as exc:  # noqa: B036 - see the docstring
            console.warn(f"warning: could not keep the records of {self.name}: {type(exc).__name__}: {exc}")

    def _remove(self) -> None:
        import docker.errors

        if self.container is None:
            return
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            console.warn(f"warning: could not remove container {self.name}: {exc}")

    def _remove_by_name(self) -> None:
        import docker.errors

        try:
            self.client.containers.get(self.name).remove(force=True)
        except (docker.errors.DockerException, OSError):
            pass  # not made, or the daemon is unreachable: nothing more to do here

    def follow_logs(self, path: Path, prefix: str) -> None:
        """Copy the container's output to `path` and to the terminal (prefixed) until it exits."""
        pending = b""
        with open(path, "ab") as sink:
            try:
                for chunk in self.container.logs(stream=True, follow=True):
                    sink.write(chunk)
                    sink.flush()
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        console.info(prefix + line.decode(errors="replace"))
            except Exception as exc:  # the run goes on; only the live copy of its output stops
                console.warn(
                    f"warning: lost the log stream of {self.name} ({type(exc).__name__}: {exc}); "
                    f"`docker logs` has the rest while the container exists"
                )
            if pending:
                console.info(prefix + pending.decode(errors="replace"))

    def copy_out(self, container_path: str, dest: Path) -> int:
        """Copy a directory out of the container into `dest`; returns the number of files."""
        import docker.errors

        try:
            stream, _stat = self.container.get_archive(container_path)
        except docker.errors.NotFound:
            console.info(f"docker: {container_path} does not exist in {self.name}; nothing to copy")
            return 0
        # Streamed, never held whole: the archive is as large as the container made /results.
        return extract_tree(io.BufferedReader(ChunkStream(stream), _CHUNK), dest)


RESULTS_MAX_BYTES = 4 << 30  # what /results may hold in all; a run's records and logs are megabytes
_CHUNK = 1 << 20


class ResultsTooLarge(Exception):
    """The container's archive went past RESULTS_MAX_BYTES."""


class ChunkStream(io.RawIOBase):
    """A readable stream over an iterator of byte chunks (docker-py's get_archive, an image's save),
    read on demand (tarfile's stream mode reads it)."""

    def __init__(self, chunks: Any) -> None:
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not len(self._pending):
            try:
                self._pending = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def extract_tree(fileobj: Any, dest: Path, max_bytes: int = RESULTS_MAX_BYTES) -> int:
    """Extract a get_archive tar (rooted at the copied directory) into `dest`, refusing to leave it.

    Only regular files and directories are taken: results never need links or devices, and
    skipping them removes every way a member could write outside `dest`. The tar is read as a
    stream (one pass, nothing held in memory) and at most `max_bytes` of file data are written.
    A file that is already in `dest` (the host's engine.log) is never replaced by the container's.
    """
    root = dest.resolve()
    written: set[Path] = set()
    total = 0
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
            for member in tar:
                parts = Path(member.name).parts[1:]  # drop the copied directory's own name
                if not parts or any(p in ("..", "") for p in parts) or Path(member.name).is_absolute():
                    continue
                target = root.joinpath(*parts)
                if root not in target.resolve().parents and target.resolve() != root:
                    continue
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                if not member.isfile():
                    continue
                if target.exists() or target.is_symlink():
                    console.warn(
                        f"warning: the container's {'/'.join(parts)} was not copied: "
                        "the host's own file of that name is kept"
                    )
                    continue
                total += member.size
                if total > max_bytes:
                    raise ResultsTooLarge(f"{'/'.join(parts)} takes the results past {max_bytes} bytes")
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                if source is None:
                    continue
                with open(target, "xb") as sink:
                    shutil.copyfileobj(source, sink, _CHUNK)
                written.add(target)
    except ResultsTooLarge as exc:
        console.warn(f"warning: stopped copying the container's results: {printable(str(exc))}")
    except (tarfile.TarError, OSError) as exc:
        console.warn(f"warning: the container's results archive is unreadable: {type(exc).__name__}: {exc}")
    return len(written)


def refuse_host_torch(env: Env) -> None:
    """An env whose torch is the host Python's (`torch_from = "host"`) has no image to build: an
    image cannot hold the host's torch, and a download is what such an env exists to avoid."""
    if env.host_torch:
        raise UsageError(
            f'env {env.id} takes torch from the host\'s Python (torch_from = "host"): no image can hold it',
            fix="use ENGINE=venv (make gpu-check always does), or an env whose torch comes from an index",
        )
