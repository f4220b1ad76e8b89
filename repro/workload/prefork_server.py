"""The pre-imported launcher's server: `python -m repro.workload.prefork_server` (CPU envs only).

Why it exists: on CPU a run is ~4 s of training behind ~15 s of start-up, almost all of it
interpreters importing torch and DeepSpeed (torchrun's own, then one per rank). This process
imports them once per suite; every run is then forked from it:

    server (imports torch, DeepSpeed, the rank code; serves requests; never runs a torch op)
      `- leader of run A  (new session = the run's process group; waits for its ranks like torchrun)
           |- rank 0 .. rank N-1   (each: repro.workload.train.main, exactly what torchrun runs)
      `- leader of run B ...

What keeps a run trustworthy is unchanged: fresh processes per run (forked, never reused), a fresh
process group and gloo group per run, one record per run, and crash and hang isolation (a run
is its own session, which the suite interrupts, terminates and kills as a whole, as it does a
torchrun session). The ranks run the same code as under torchrun, from the CPU shims onward:
only the imports happened earlier, in the server, after the same pre-import step (the CPU
shims' placeholder modules) that the ranks would take. Nothing runs torch ops or starts a thread
before a fork: the server checks it has one thread before each fork and refuses to serve
otherwise (the suite then falls back to torchrun).

Why not on GPUs: forking a process that has initialised CUDA/HIP is undefined, and DeepSpeed's
GPU accelerators may touch the runtime when imported. GPU envs keep torchrun.

Protocol, one JSON object per line. Suite -> server (stdin):
    {"run": ID, "argv": [train args], "env": {...}, "world_size": N, "log": PATH}
    {"run": ID, "task": "module:function", "argv": [...] | null, "env": {...},
     "stdout": PATH, "stderr": PATH}      one process, no ranks (ds_report, collect_env)
Server -> suite (stdout):
    {"ready": true, "import_s": S, "modules": [...]}   once, or {"ready": false, "error": ...}
    {"run": ID, "pid": LEADER_PID}                      the run's session exists
    {"run": ID, "error": TEXT}                          it could not be started
    {"run": ID, "exit": CODE}                           its leader ended (0: every rank exited 0)
The server exits when its stdin closes; runs still going are the suite's to stop.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import random
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import NoReturn, TypedDict, final

from repro.workload.parentwatch import become_subreaper, group_alive, signal_each
from repro.workload.train import exit_now

# What the ranks import anyway, in the order they do; the server imports them once. A module a
# release does not have (no MiCS in DeepSpeed >= 0.19.8) is skipped: the rank finds out itself.
PRELOAD = (
    "torch",
    "torch.distributed",
    "deepspeed",
    "deepspeed.comm",
    "deepspeed.runtime.engine",
    "deepspeed.runtime.zero.partition_parameters",
    "deepspeed.runtime.zero.stage3",
    "deepspeed.runtime.zero.mics",
    "repro.workload.train",
    "repro.workload.collectives",
    "repro.workload.model",
    "repro.workload.logcount",
    "repro.workload.fix",
    "repro.workload.device",
    "repro.workload.cpu.gloo_transport",
    # imported lazily while DeepSpeed sets up its engine (torch >= 2.0): ~0.35 s per rank
    "torch._dynamo",
)
# Without these the server is useless (the rank would import them again): not ready.
REQUIRED = ("torch", "deepspeed", "repro.workload.train")
# What each rank runs: what torchrun runs with `-m repro.workload.train`.
ENTRY = "repro.workload.train:main"
# torchrun gives a failed rank's peers this long after SIGTERM before SIGKILL.
PEER_STOP_GRACE_S = 30.0


# The replies' channel: the stdout the suite gave us, moved off fd 1 by `take_protocol_channel`
# so that whatever an import prints (DeepSpeed logs to stdout) lands in the log, not in a reply.
_CHANNEL: list[int] = []


def take_protocol_channel() -> None:
    _CHANNEL.append(os.dup(1))
    sys.stdout.flush()
    os.dup2(2, 1)


# The protocol's messages (module docstring), as prefork.py sends and reads them.
@final  # final: `"task" in request` tells the two apart
class RunRequest(TypedDict):
    run: str
    argv: list[str]  # the trainer's
    env: dict[str, str]
    world_size: int
    log: str


class TaskRequest(TypedDict):
    run: str
    task: str  # "module:function"
    argv: list[str] | None  # None: called without arguments
    env: dict[str, str]
    stdout: str
    stderr: str


class Reply(TypedDict, total=False):
    ready: bool  # the first message: ready, or error
    import_s: float
    modules: list[str]
    skipped: dict[str, str]  # module -> why its import failed
    gc_frozen: int
    pid: int  # also: a run's leader
    error: str
    run: str
    exit: int


def emit(message: Reply) -> None:
    data = (json.dumps(message) + "\n").encode()
    fd = _CHANNEL[0] if _CHANNEL else 1
    while data:
        data = data[os.write(fd, data) :]


def _forked() -> None:
    """In a child of the server: the replies' channel is not the child's to write."""
    for fd in _CHANNEL:
        os.close(fd)
    _CHANNEL.clear()


def threads() -> int:
    """Threads of this process as the kernel sees them (C++ threads included)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def preload(modules: Sequence[str] = PRELOAD, required: Sequence[str] = REQUIRED) -> Reply:
    """Import what every rank imports. The CPU shims' pre-import step comes first, as in a rank."""
    started = time.perf_counter()
    from repro.workload.cpu import shims

    shims.before_deepspeed_import()
    loaded, skipped = [], {}
    for name in modules:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:  # noqa: BLE001 - any import failure: the rank will meet it itself
            if name in required:
                return {"ready": False, "error": f"import {name}: {type(exc).__name__}: {exc}"}
            skipped[name] = f"{type(exc).__name__}: {exc}"
    count = threads()
    if count != 1:
        return {"ready": False, "error": f"the imports started {count - 1} thread(s): forking is unsafe"}
    # What the imports made lives as long as the process; frozen, the cyclic collector of every
    # forked rank skips it. DeepSpeed collects garbage in each `see_memory_usage` (a dozen times
    # per engine set-up): over torch's and DeepSpeed's module objects that costs ~0.1 s a call,
    # over what the rank made itself next to nothing. No object changes: only what a collection
    # scans (what Python's documentation advises before fork without exec).
    gc.collect()
    gc.freeze()
    return {
        "ready": True,
        "import_s": round(time.perf_counter() - started, 2),
        "modules": loaded,
        "skipped": skipped,
        "gc_frozen": gc.get_freeze_count(),
        "pid": os.getpid(),
    }


def _default_signals() -> None:
    """A rank starts with the dispositions a fresh interpreter has."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # what Python sets at start-up
    # A rank inherits the leader's blocked signals: a stop sent between its fork and here was
    # kept pending, and acts now, with the dispositions above (a fresh interpreter blocks none).
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _rank(rank: int, world_size: int, argv: list[str], entry: str) -> NoReturn:
    """One rank: torchrun's variables, then the same entry point torchrun runs."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0",
        GROUP_WORLD_SIZE="1",
        ROLE_RANK=str(rank),
        ROLE_WORLD_SIZE=str(world_size),
        ROLE_NAME="default",
    )
    _run_entry(entry, argv)


def _run_entry(entry: str, argv: list[str] | None) -> NoReturn:
    """Call `module:function` as a fresh interpreter would run it (`argv` None: no arguments),
    then leave with its code, without interpreter teardown (train.exit_now)."""
    code = 1
    try:
        _default_signals()
        # A fresh interpreter seeds Python's RNG (and NumPy's, on first use) from the OS; a forked
        # one would share the server's state.
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        module, function = entry.split(":")
        sys.argv = [module, *(argv or [])]
        target = getattr(importlib.import_module(module), function)
        result = target() if argv is None else target(argv)
        code = result if isinstance(result, int) else 0
    except SystemExit as exc:  # argparse, sys.exit
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - train.main records its own failures; this is the rest
        traceback.print_exc()
    finally:
        exit_now(code)


def _adopt(stdout: str, stderr: str, env: dict[str, str], append: bool) -> None:
    """Become the request's process: stdin from /dev/null, stdout and stderr to its files (one
    file for both when they are the same path), its environment instead of the server's."""
    mode = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    out = os.open(stdout, mode, 0o644)
    err = out if stderr == stdout else os.open(stderr, mode, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    sys.stdout.flush()
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
    for fd in {null, out, err}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)


def _task(request: TaskRequest) -> NoReturn:
    """A one-process job in its own session (the suite's ds_report and collect_env): its stdout
    and stderr go to the files the request names."""
    try:
        _adopt(request["stdout"], request["stderr"], request["env"], append=False)
    except BaseException:  # noqa: BLE001 - a task never returns into the server's loop
        os._exit(72)
    _run_entry(str(request["task"]), request.get("argv"))


def _say(line: str) -> None:
    sys.stderr.write(f"[prefork leader {os.getpid()}] {line}\n")
    sys.stderr.flush()


# What stops a run: the suite signals the run's session (the leader and its ranks alike).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The leader takes these synchronously (sigtimedwait), never by a handler: a signal that arrives
# while it forks stays pending instead of being lost, and a rank forked meanwhile inherits it
# blocked, so it acts on it once it has a fresh interpreter's dispositions (`_run_entry`).
LEADER_SIGNALS = (signal.SIGCHLD, *STOP_SIGNALS)


def _lead(request: RunRequest, entry: str) -> NoReturn:
    """The run's session leader: fork the ranks, wait for them, stop the peers of a failed rank
    (torchrun's rule: SIGTERM, then SIGKILL after a grace period), exit with the first failure's
    code (0 when every rank exited 0). The suite signals the whole session and the ranks act on
    it; the leader stops forking, gives the ranks the same grace, then SIGKILL. On every path,
    an error of its own included, it exits only once every rank it forked is reaped: the run's
    end (the server reports the leader's exit) means its ranks are gone."""
    code = 70
    ranks: dict[int, int] = {}
    try:
        for sig in LEADER_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_BLOCK, LEADER_SIGNALS)
        _adopt(request["log"], request["log"], request["env"], append=True)
        world = int(request["world_size"])
        _say(f"forking {world} ranks from the pre-imported server (no torchrun; see prefork_server.py)")
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                _rank(rank, world, list(request["argv"]), entry)
            ranks[pid] = rank
            if _stop_forking(pid, rank, world):
                break
        code = _wait_ranks(ranks)
    except BaseException:  # noqa: BLE001 - a leader never returns into the server's loop
        traceback.print_exc()
        _kill_and_reap(ranks)
    finally:
        os._exit(code)


def _stop_pending() -> set[int]:
    return {int(sig) for sig in signal.sigpending() if sig in STOP_SIGNALS}


def _stop_forking(pid: int, rank: int, world: int) -> bool:
    """After forking `rank`: whether the session was signalled to stop meanwhile. Then no more
    ranks start, and the rank just forked gets the signal too: it may have come just before the
    fork, so it missed it. (Just after, it has it twice: a second SIGTERM or SIGHUP changes
    nothing, a second SIGINT is a second Ctrl-C, which the runner's stop sends anyway.)"""
    pending = _stop_pending()
    if not pending:
        return False
    _say(f"stopped while starting: {rank + 1} of {world} ranks forked")
    for sig in pending:
        signal_each(os.kill, [pid], sig)
    return True


def _wait_ranks(ranks: dict[int, int]) -> int:
    """Reap the ranks as they exit; a failed rank or a stop signal starts the grace period after
    which the ranks still running get SIGKILL. Returns once none is left."""
    first_failure = 0
    deadline = time.monotonic() + PEER_STOP_GRACE_S if _stop_pending() else None
    while ranks:
        for pid, rank, code in _reap_ranks(ranks):
            if code and not first_failure:
                first_failure = code
                if ranks and deadline is None:
                    _say(f"rank {rank} (pid {pid}) exited {code}: stopping the other ranks (SIGTERM)")
                    signal_each(os.kill, ranks, signal.SIGTERM)
                    deadline = time.monotonic() + PEER_STOP_GRACE_S
        if not ranks:
            break
        if deadline is not None and time.monotonic() > deadline:
            _say("ranks still running after the grace period: SIGKILL")
            signal_each(os.kill, ranks, signal.SIGKILL)
            deadline = float("inf")
        left = None if deadline is None else max(0.0, min(deadline - time.monotonic(), 1.0))
        got = (
            signal.sigwaitinfo(LEADER_SIGNALS) if left is None else signal.sigtimedwait(LEADER_SIGNALS, left)
        )
        if got is not None and got.si_signo in STOP_SIGNALS and deadline is None:
            name = signal.Signals(got.si_signo).name
            _say(f"{name}: waiting for the ranks, SIGKILL after the grace period")
            deadline = time.monotonic() + PEER_STOP_GRACE_S
    return first_failure


def _reap_ranks(ranks: dict[int, int]) -> list[tuple[int, int, int]]:
    """(pid, rank, exit code) of every rank that has exited, removed from `ranks`."""
    done = []
    while ranks:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            ranks.clear()  # nothing left to wait for
            break
        if pid == 0:
            break
        rank = ranks.pop(pid, None)
        if rank is not None:
            code = os.waitstatus_to_exitcode(status)
            done.append((pid, rank, code if code >= 0 else 128 - code))
    return done


def _kill_and_reap(ranks: dict[int, int]) -> None:
    """The leader failed itself: its ranks must not outlive it."""
    signal_each(os.kill, ranks, signal.SIGKILL)
    for pid in list(ranks):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        ranks.pop(pid, None)


def _start(request: RunRequest | TaskRequest, entry: str) -> int:
    """Fork the run's leader (or a task); returns once its session exists (so the suite can
    signal it)."""
    count = threads()
    if count != 1:
        raise RuntimeError(f"the server has {count} threads: forking is unsafe")
    gc.freeze()  # the little the server made since (requests): not the ranks' to scan
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            _forked()
            os.setsid()
            os.write(write_end, b"1")
            os.close(write_end)
        except BaseException:  # noqa: BLE001
            os._exit(71)
        if "task" in request:
            _task(request)
        _lead(request, entry)
    os.close(write_end)
    os.read(read_end, 1)
    os.close(read_end)
    return pid


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Defaults are what the suite uses; the options let tests serve a stand-in entry point
    without torch (tests/workload/test_prefork.py)."""
    p = argparse.ArgumentParser(prog="python -m repro.workload.prefork_server")
    p.add_argument("--preload", default=",".join(PRELOAD), help="modules to import once")
    p.add_argument("--required", default=",".join(REQUIRED), help="of those, the ones it needs")
    p.add_argument("--entry", default=ENTRY, help="module:function each rank runs with its argv")
    return p.parse_args(argv)


def serve(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    take_protocol_channel()
    # A rank whose leader is gone (killed with its session) is reparented here, not to init: the
    # server reaps it, and `_reap` reports a run's end only once its session is empty.
    become_subreaper()
    names = [n for n in args.preload.split(",") if n]
    ready = preload(names, [n for n in args.required.split(",") if n])
    emit(ready)
    if not ready["ready"]:
        return 3
    leaders: dict[int, str] = {}
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.05)
        if readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:  # the suite has gone: a run still going has nobody else to stop it
                _stop_leaders(leaders)
                return 0
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip():
                    _handle(json.loads(line), leaders, args.entry)
        _reap(leaders)


def _handle(request: RunRequest | TaskRequest, leaders: dict[int, str], entry: str) -> None:
    run = str(request.get("run"))
    try:
        pid = _start(request, entry)
    except Exception as exc:  # noqa: BLE001 - reported; the suite falls back to torchrun
        emit({"run": run, "error": f"{type(exc).__name__}: {exc}"})
        return
    leaders[pid] = run
    emit({"run": run, "pid": pid})


def _stop_leaders(leaders: dict[int, str]) -> None:
    """The suite closed our pipe while runs (or artifact tasks) still go: it was killed, or it
    stopped them already. Each run's session (leader and ranks) gets SIGTERM, then SIGKILL;
    returns once every session is empty (the kernel delivers SIGKILL, the reaping is ours)."""
    _reap(leaders)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(leaders):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + PEER_STOP_GRACE_S
        while leaders and time.monotonic() < deadline:
            _reap(leaders)
            time.sleep(0.05)
        if not leaders:
            return


# Leaders reaped whose session still has a member (pid -> exit code): not ended yet.
_LEADER_CODES: dict[int, int] = {}


def _reap(leaders: dict[int, str]) -> None:
    """Reap what has exited (leaders, and ranks orphaned to this subreaper); a run ends, and its
    exit is reported, when its leader is reaped and no process of its session is left."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if pid in leaders:
            _LEADER_CODES[pid] = os.waitstatus_to_exitcode(status)
    for pid in [p for p in _LEADER_CODES if not group_alive(p)]:
        emit({"run": leaders.pop(pid), "exit": _LEADER_CODES.pop(pid)})


if __name__ == "__main__":
    sys.exit(serve())
