"""Launch one run, bound it in time, and turn what the ranks wrote into a record.

A run starts either under torchrun or, on CPU, forked from the suite's pre-imported launcher
(repro/workload/prefork.py): either way its ranks run repro.workload.train in a session of their
own, which is what everything below relies on (signal the session, read the rank files).

A hang is a result: when the run exceeds its time limit, stops making progress, or its ranks'
collective records prove a deadlock (repro/workload/hangwatch.py: ranks of one group at the same
position in different collectives; ends the run within seconds instead of the stall limit), every
rank's Python stack is dumped (the ranks register faulthandler on SIGUSR1), the whole process group is
stopped in three steps (interrupt, terminate, kill) and the record says `hung` with the stacks.
Nothing is left running, also on Ctrl-C, SIGTERM or SIGHUP (see `install_stop_handlers`).
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from repro.workload import collectives, hangwatch, stackfiles
from repro.workload import record as rec
from repro.workload.defaults import RANK_STOP_GRACE_S, STACK_WAIT_S
from repro.workload.device import RanOn, hide_gpus_env
from repro.workload.leftovers import stat_fields
from repro.workload.parentwatch import group_alive, signal_each
from repro.workload.prefork import PreforkServer, PreforkUnavailable
from repro.workload.stackfiles import read_text

if TYPE_CHECKING:
    from repro.workload.train import RankRecord

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STOP_GRACE_S = RANK_STOP_GRACE_S
POLL_S = 0.25
MONITOR_INTERVAL_S = 0.5


@dataclass(frozen=True)
class RunSpec:
    env: str
    scenario: str
    patch: str
    dtype: str
    transport: str  # async|sync|strict (the gloo adapter) or plain (none) on CPU, "native" on GPU
    world_size: int
    shard_size: int | None
    hierarchical: bool
    devices_per_node: int
    steps: int
    seed: int
    timeout_s: float  # whole-run limit
    stall_s: float  # limit without a heartbeat from any rank (once one was seen)
    device: str  # cpu|gpu
    run_dir: str
    results_root: str  # logs are recorded relative to this folder
    ds_config_path: str
    model_args: tuple[str, ...] = ()

    @property
    def run_name(self) -> str:
        return f"{self.scenario}-{self.patch}-{self.dtype}-{self.transport}-w{self.world_size}"


@dataclass(frozen=True)
class LaunchResult:
    status: str | None  # None (ran to the end) | "hung" | "interrupted"
    launcher_code: int | None
    wall_s: float
    stacks: dict[str, str]
    hang_detail: str
    # "torchrun" or "prefork" (the pre-imported launcher); why torchrun ran a run meant for prefork
    launcher: str = "torchrun"
    launcher_note: str = ""


class Process(Protocol):
    """What the runner needs of a run's launcher process: torchrun's Popen or a ForkedRun."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch_env(spec: RunSpec) -> dict[str, str]:
    env = base_env(spec.device)
    # Per-node device count: how a multi-node layout is emulated on one host. MiCS reads
    # NDEV_PER_NODE first, then the accelerator's device count (LOCAL_SIZE on the CPU accelerator).
    env["NDEV_PER_NODE"] = str(spec.devices_per_node)
    if spec.device == "cpu":
        env["LOCAL_SIZE"] = str(spec.devices_per_node)
    return env


def base_env(device: str) -> dict[str, str]:
    """What every run's environment has, whatever its layout (also the pre-imported launcher's)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH", "")) if p)
    if device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        env.setdefault("OMP_NUM_THREADS", "1")  # 2-4 ranks share few cores; oversubscription stalls gloo
        # A CPU run never touches a GPU, also on a GPU host (PyPI's torch is a CUDA build).
        env.update(hide_gpus_env())
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def _command(spec: RunSpec, port: int) -> list[str]:
    launcher = {
        "--nnodes": "1",
        "--nproc_per_node": str(spec.world_size),
        "--master_addr": "127.0.0.1",
        "--master_port": str(port),
        # torchrun polls its workers every 5 s by default: up to 5 s idle after the ranks exit.
        "--monitor-interval": str(MONITOR_INTERVAL_S),
    }
    torchrun = [sys.executable, "-m", "torch.distributed.run", *_flags(launcher)]
    return [*torchrun, "-m", "repro.workload.train", *train_args(spec)]


def _flags(options: dict[str, str]) -> list[str]:
    return [part for option in options.items() for part in option]


def train_args(spec: RunSpec) -> list[str]:
    """The per-rank trainer's arguments: the same under torchrun and the pre-imported launcher."""
    options = {
        "--run-dir": spec.run_dir,
        "--ds-config": spec.ds_config_path,
        "--scenario": spec.scenario,
        "--patch": spec.patch,
        "--steps": str(spec.steps),
        "--seed": str(spec.seed),
        "--device": spec.device,
    }
    if spec.device == "cpu":
        options["--transport"] = spec.transport
    return _flags(options) + list(spec.model_args)


def _rank_pids(run_dir: str) -> list[int]:
    texts = [read_text(path).strip() for path in glob.glob(os.path.join(run_dir, "rank*.pid"))]
    return [int(text) for text in texts if text.isdigit()]


def alive(pid: int) -> bool:
    """Running, and not a zombie (a container without an init reaps nobody)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = stat_fields(pid)
    return fields is None or fields[0] != "Z"


def _dump_stacks(run_dir: str) -> dict[str, str]:
    """Ask every rank for its Python stacks (faulthandler on SIGUSR1) and read them back."""
    signal_each(os.kill, _rank_pids(run_dir), signal.SIGUSR1)
    paths = {
        os.path.basename(path)[4:-6]: path for path in sorted(glob.glob(os.path.join(run_dir, "rank*.stack")))
    }
    return stackfiles.read_settled(paths, STACK_WAIT_S, POLL_S)


def stop_group(proc: Process, pids: Callable[[], Iterable[int]], *, until_empty: bool = False) -> list[int]:
    """Interrupt, terminate, kill the launcher's process group and each of `pids()` still alive
    (one that left the group still gets the signal), each step given STOP_GRACE_S to work;
    `until_empty`: a step also waits for the group to be empty. Returns the pids alive after
    SIGKILL."""

    def targets() -> list[int]:
        return [p for p in pids() if alive(p)]

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        signal_each(os.killpg, [proc.pid], sig)
        signal_each(os.kill, targets(), sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            if proc.poll() is not None and not targets() and not (until_empty and group_alive(proc.pid)):
                return []
            time.sleep(POLL_S)
    proc.wait()
    return targets()


def wait_exit(proc: Process, timeout_s: float) -> None:
    """Pause the watch loop for up to `timeout_s`, returning as soon as the run's launcher exits
    (a sleep would leave the next run waiting for the rest of the poll interval)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout_s)


def install_stop_handlers() -> None:
    """SIGTERM/SIGHUP stop the suite like Ctrl-C: a KeyboardInterrupt in the main thread, which
    stops every run's process group and writes the records so far. `timeout`, `docker stop`
    and a closed terminal send these, not SIGINT; by default they would kill the suite at once
    and orphan the launchers (each in its own session) with their ranks.

    Only the first signal interrupts; later ones are ignored so they cannot cut the clean-up short
    (SIGKILL still can). Same policy as the host's repro/core/signals.py, which this package may
    not import (it runs in envs that have only torch and DeepSpeed).
    """
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if received:
            return
        received.append(signum)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup` asked for SIGHUP to be ignored
            signal.signal(sig, handler)


def _last_heartbeat(run_dir: str, since: float) -> float:
    beats = [os.path.getmtime(p) for p in glob.glob(os.path.join(run_dir, "rank*.heartbeat"))]
    return max(beats, default=since)


def launch(
    spec: RunSpec,
    progress: Any = None,
    stop: threading.Event | None = None,
    server: PreforkServer | None = None,
) -> LaunchResult:
    """Run `spec` through the pre-imported launcher `server` (CPU), else torchrun; never raises
    for a hang (status "hung"); Ctrl-C -> "interrupted". `stop` is how a run in a worker thread
    (which never sees Ctrl-C itself) is told to stop. When `server` cannot start the run, torchrun
    does and the result says why."""
    os.makedirs(spec.run_dir, exist_ok=True)
    log_path = os.path.join(spec.run_dir, "launcher.log")
    start = time.monotonic()
    wall_start = time.time()
    launcher, note = "torchrun", ""
    with open(log_path, "wb") as log:
        proc: Process | None = None
        if server is not None:
            proc, note = _start_prefork(spec, server, log_path)
            if proc is not None:
                launcher = "prefork"
        if proc is None and stop is not None and stop.is_set():  # interrupted while prefork tried
            return LaunchResult("interrupted", None, time.monotonic() - start, {}, "", launcher, note)
        if proc is None:
            proc = _start_torchrun(spec, log)

        def ended(status: str | None, stacks: dict[str, str] | None = None, detail: str = "") -> LaunchResult:
            assert proc is not None
            return LaunchResult(
                status, proc.returncode, time.monotonic() - start, stacks or {}, detail, launcher, note
            )

        watch = hangwatch.HangWatch(spec.stall_s)
        try:
            hang = _watch(proc, spec, watch, start, wall_start, progress, stop)
            if hang is not None:
                stacks, detail = hang
                return ended("hung", stacks, detail)
        except KeyboardInterrupt:
            stop_group(proc, lambda: _rank_pids(spec.run_dir))
            return ended("interrupted")
        # Ranks that outlived their launcher (should not happen) must not outlive the run.
        if any(alive(p) for p in _rank_pids(spec.run_dir)):
            stop_group(proc, lambda: _rank_pids(spec.run_dir))
    if stopped_by_signal(proc.returncode) or (stop is not None and stop.is_set() and proc.returncode != 0):
        # SIGHUP/SIGTERM/SIGINT reached the launcher (a closed terminal, `timeout`, a CI cancel
        # signals the whole tree), or it failed while the suite was stopping: the run was cut
        # short by the user, not crashed (we send those signals ourselves only on a hang, above).
        return ended("interrupted")
    return ended(None)


def _start_prefork(spec: RunSpec, server: PreforkServer, log_path: str) -> tuple[Process | None, str]:
    """Start the run through the pre-imported launcher; (None, why) when it cannot."""
    port = free_port()
    env = dict(launch_env(spec), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        return server.start(train_args(spec), env, spec.world_size, log_path), ""
    except PreforkUnavailable as exc:
        return None, f"ran under torchrun: {exc}"


def _start_torchrun(spec: RunSpec, log: BinaryIO) -> Process:
    """Start the run under torchrun, its output into `log`."""
    # A new session makes torchrun and its ranks one process group we can signal as a whole.
    return subprocess.Popen(
        _command(spec, free_port()),
        cwd=REPO_ROOT,
        env=launch_env(spec),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _watch(
    proc: Process,
    spec: RunSpec,
    watch: hangwatch.HangWatch,
    start: float,
    wall_start: float,
    progress: Any,
    stop: threading.Event | None,
) -> tuple[dict[str, str], str] | None:
    """Poll until the launcher exits (None) or the run hangs: then the ranks' stacks and why, the
    group stopped. KeyboardInterrupt on Ctrl-C or when `stop` is set."""
    while proc.poll() is None:
        now = time.monotonic()
        beat = _last_heartbeat(spec.run_dir, wall_start)
        stalled = beat > wall_start and time.time() - beat > spec.stall_s
        views = hangwatch.read_views(os.path.join(spec.run_dir, collectives.FOLDER), alive)
        found = watch.observe(now, views, beat if beat > wall_start else None)
        if now - start > spec.timeout_s or stalled or found is not None:
            quiet = f"no progress for {time.time() - beat:.0f} s" if stalled else ""
            detail = hangwatch.hang_detail(found, quiet, spec.stall_s, spec.timeout_s)
            stacks = _dump_stacks(spec.run_dir)
            stop_group(proc, lambda: _rank_pids(spec.run_dir))
            return stacks, detail
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        if progress is not None:
            progress(now - start)
        wait_exit(proc, POLL_S)
    return None


# A launcher killed by one of these (returncode -N), or exiting 128+N because its rank was (the
# pre-imported launcher's and a shell's convention), was stopped, not crashed.
STOP_SIGNALS = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


def stopped_by_signal(returncode: int | None) -> bool:
    codes = {int(s) for s in STOP_SIGNALS}
    return returncode is not None and (-returncode in codes or returncode - 128 in codes)


def _read_ranks(run_dir: str) -> dict[int, RankRecord]:
    ranks: dict[int, RankRecord] = {}
    for path in glob.glob(os.path.join(run_dir, "rank*.json")):
        try:
            data = rec.read_json(path)
        except (OSError, ValueError):
            continue
        ranks[int(data.get("rank", os.path.basename(path)[4:-5]))] = data
    return ranks


def _pick_exception(ranks: dict[int, RankRecord]) -> rec.RecordedException | None:
    """The exception to show: one raised from an IllegalWork object if any rank had it, else the
    lowest rank's own error, else the lowest rank's. A rank that was only `Terminated` (torchrun
    sends SIGTERM to the others when one rank fails) names the launcher, not the cause."""
    found = [(r, exc) for r, d in sorted(ranks.items()) if (exc := d.get("exception"))]
    if not found:
        return None
    illegal = [(r, e) for r, e in found if "IllegalWork" in f"{e.get('message')}{e.get('traceback')}"]
    own = [(r, e) for r, e in found if e.get("type") != "Terminated"]
    rank, exc = (illegal or own or found)[0]
    return {
        "type": exc.get("type"),
        "message": exc.get("message"),
        "rank": rank,
        "traceback": exc.get("traceback"),
    }


def assemble(spec: RunSpec, result: LaunchResult, base: rec.RunRecord) -> tuple[rec.RunRecord, str | None]:
    """Build the (unclassified) record and the runner status for `classify`."""
    ranks = _read_ranks(spec.run_dir)
    zero = ranks.get(0, {})

    def rel(path: str) -> str:
        return os.path.relpath(path, spec.results_root)

    logs = {"launcher": rel(os.path.join(spec.run_dir, "launcher.log"))}
    for path in sorted(glob.glob(os.path.join(spec.run_dir, "rank*.log"))):
        logs[os.path.basename(path)[:-4]] = rel(path)
    exit_codes: dict[str, int | None] = {"launcher": result.launcher_code}
    for r, d in sorted(ranks.items()):
        exit_codes[str(r)] = 1 if d.get("exception") else 0
    record = rec.empty_record(**base)
    record.update(
        {
            "run_name": spec.run_name,
            "losses": zero.get("losses") or [],
            "loss_scale": zero.get("loss_scale"),
            "skipped_steps": int(zero.get("skipped_steps") or 0),
            "illegal_work_messages": sum(int(d.get("illegal_work_messages") or 0) for d in ranks.values()),
            "exception": _pick_exception(ranks),
            "exit_codes": exit_codes,
            "durations": {"total_s": round(result.wall_s, 2), "train_s": zero.get("train_s")},
            "versions": zero.get("versions")
            or next((d["versions"] for d in ranks.values() if d.get("versions")), {}),
            "weights_checksum": zero.get("weights_checksum"),
            "stacks": result.stacks,
            "logs": logs,
            "backend": zero.get("backend"),
            "fix": zero.get("fix"),
            "transport_info": zero.get("transport_info") or {},
            # What rank 0 really ran on (plus the env's platform); the suite's view when it never said.
            "ran_on": _ran_on(base.get("ran_on"), zero.get("ran_on")),
            "launcher": {"kind": result.launcher, "note": result.launcher_note},
        }
    )
    status = result.status
    if status == "hung":
        done = {r: d.get("steps_completed") for r, d in ranks.items()}
        record["reason"] = f"hung: {result.hang_detail}; stacks of {len(result.stacks)} ranks captured" + (
            f"; steps completed per rank {done}" if done else ""
        )
    elif status is None and not ranks:
        # torchrun or the interpreter failed before any rank could report: the environment.
        status = "env-error"
        tail = "".join(io.StringIO(read_text(os.path.join(spec.run_dir, "launcher.log"))).readlines()[-40:])
        ended = f"{result.launcher} exited {result.launcher_code}"
        last = tail.strip().splitlines()[-1] if tail.strip() else ended
        record["exception"] = {"type": "LaunchFailure", "message": last, "rank": None, "traceback": tail}
        record["reason"] = (
            f"no rank reported ({result.launcher} exit {result.launcher_code}): environment could not run"
        )
    elif status is None and record["exception"] and record["exception"]["type"] in ENV_ERROR_TYPES:
        status = "env-error"
        record["reason"] = f"environment: {record['exception']['type']}: {record['exception']['message']}"
    elif status is None and record["exception"] and record["exception"]["type"] == "ScenarioUnsupported":
        status = "unsupported"
        record["reason"] = f"unsupported: {record['exception']['message']}"
    return record, status


def _ran_on(planned: RanOn | None, reported: RanOn | None) -> RanOn | None:
    if not reported:
        return planned
    return {**reported, "env_platform": (planned or {}).get("env_platform")}


# Exceptions that mean "this environment cannot run the workload", not "the run failed".
ENV_ERROR_TYPES = ("ImportError", "ModuleNotFoundError")
