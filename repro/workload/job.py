"""Run a user's command inside an env with the interpreter-start hook, bounded in time.

`python -m repro.workload.job --cmd "torchrun ... train.py" --workdir DIR --out OUT --patch fixed`
runs the command with `bash -c` in WORKDIR, this interpreter's bin folder first on PATH (the env's
venv or image Python) and repro/workload/hook first on PYTHONPATH with the hook switched on
(repro/workload/jobhook.py). Output goes to the terminal and OUT/job.log.

A hang is a result, as for our own ranks (repro/workload/runner.py): when the processes'
collective records (the hook records every torch.distributed collective, repro/workload/
collectives.py) prove a deadlock or show every rank stuck in a collective for longer than the job's
own steps explain (repro/workload/hangwatch.py), when the job prints nothing and no DeepSpeed step
touches the heartbeat for --stall-timeout seconds, or when the --timeout is reached, every
hooked Python process dumps its stack (SIGUSR1), then the process group and every process the
hook saw are interrupted, terminated, killed. OUT/job.json says how it ended, with
the stacks, the processes that survived (none, normally) and the hook's reports; the host judges
it (repro/workload/judge.py).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, TypedDict

from repro.workload import collectives, hangwatch, hookpth, hooksign, leftovers, outwrites, stackfiles
from repro.workload.defaults import STACK_WAIT_S
from repro.workload.device import hide_gpus_env
from repro.workload.diskfull import EXIT_DISK_FULL, DiskFull, is_disk_full
from repro.workload.hooksign import HookRecord
from repro.workload.parentwatch import become_subreaper, follow_tool, group_alive, signal_each
from repro.workload.record import CPU_TRANSPORTS, Rendezvous, write_json_atomic
from repro.workload.runner import alive, free_port, install_stop_handlers, stop_group, stopped_by_signal

HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hook")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLL_S = 0.25
JOB_LOG = "job.log"
JOB_JSON = "job.json"


def hook_environment(
    base: dict[str, str],
    *,
    patch: str,
    device: str,
    transport: str,
    job_dir: str | None,
    user_pythonpath: str | None,
) -> dict[str, str]:
    """The environment that switches the hook on for every Python process of the job."""
    env = dict(base)
    env["PATH"] = os.pathsep.join(p for p in (os.path.dirname(sys.executable), env.get("PATH", "")) if p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HOOK_DIR, user_pythonpath or "") if p)
    env.update(
        MICS_REPRO_HOOK="1",
        MICS_REPRO_PATCH=patch,
        MICS_REPRO_DEVICE=device,
        MICS_REPRO_TRANSPORT=transport,
        MICS_REPRO_ROOT=REPO_ROOT,
        PYTHONUNBUFFERED="1",
    )
    if job_dir:
        env["MICS_REPRO_JOB_DIR"] = job_dir
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")  # ranks share few cores; oversubscription stalls gloo
        env.update(hide_gpus_env())
    return env


# A command that names its rendezvous itself keeps it (torchrun/DeepSpeed/accelerate flags, an
# inline MASTER_PORT=, torchrun's --standalone, which picks a free port of its own).
_SETS_PORT = re.compile(
    r"--master[_-]port|--rdzv[_-]endpoint|--main[_-]process[_-]port|\bMASTER_PORT=|--standalone"
)


def rendezvous(command: str, environ: dict[str, str]) -> tuple[dict[str, str], Rendezvous]:
    """The variables that give this run a free rendezvous port, and what to record about it.

    Every launcher defaults to 29500, so two jobs, or a job next to another torchrun on this host,
    collide. Unless the command or the user's environment sets a port: MASTER_PORT (a plain
    `python train.py` calling deepspeed.init_distributed(), DeepSpeed's launch.py children),
    PET_MASTER_PORT (torchrun reads its --master-port default from it) and
    MICS_REPRO_MASTER_PORT (the hook lowers DeepSpeed's launcher default to it).
    """
    if _SETS_PORT.search(command) or environ.get("MASTER_PORT") or environ.get("PET_MASTER_PORT"):
        given = environ.get("MASTER_PORT") or environ.get("PET_MASTER_PORT")
        return {}, {"port": int(given) if given and given.isdigit() else None, "set_by": "job"}
    port = free_port()
    variables = dict.fromkeys(("MASTER_PORT", "PET_MASTER_PORT", "MICS_REPRO_MASTER_PORT"), str(port))
    return variables, {"port": port, "set_by": "repro"}


def _pids(job_dir: str) -> dict[int, str]:
    """pid -> argv of every process the hook reached (its pid file)."""
    paths = glob.glob(os.path.join(job_dir, "pids", "*"))
    return {
        int(os.path.basename(p)): stackfiles.read_text(p).strip()
        for p in paths
        if os.path.basename(p).isdigit()
    }


def dump_stacks(job_dir: str) -> dict[str, str]:
    """SIGUSR1 to every hooked process, then read what faulthandler wrote."""
    pids = [p for p in _pids(job_dir) if alive(p)]
    signal_each(os.kill, pids, signal.SIGUSR1)
    paths = {str(pid): os.path.join(job_dir, "stacks", f"{pid}.stack") for pid in pids}
    stacks = stackfiles.read_settled(paths, STACK_WAIT_S, POLL_S)
    return {pid: text for pid, text in stacks.items() if text}


def group_members(pgid: int) -> list[int]:
    """Pids of the job's process group (Linux /proc), the shell and launchers included."""
    members = [(p, leftovers.stat_fields(p)) for p in leftovers.all_pids()]
    return sorted(p for p, f in members if f is not None and f[2] == str(pgid) and f[0] != "Z")


def _is_python(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv0 = fh.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return False
    return os.path.basename(argv0).startswith("python")


def unhooked_stacks(pgid: int, hooked: set[int], path: str | None = None) -> tuple[dict[str, str], list[int]]:
    """Python processes of the group the hook is not in (started with -I/-S, or a PYTHONPATH the
    job replaced): their stacks through py-spy (PyPI) when it is installed in the env. Returns
    the stacks and the pids left without one."""
    missing = [p for p in group_members(pgid) if p not in hooked and _is_python(p)]
    spy = shutil.which("py-spy", path=path)  # the job's PATH: the env's bin folder first
    stacks: dict[str, str] = {}
    if spy is None:
        return stacks, missing
    for pid in missing:
        try:
            done = subprocess.run(
                [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=STACK_WAIT_S * 5
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip():
            stacks[str(pid)] = "(py-spy dump)\n" + done.stdout
    return stacks, [p for p in missing if str(p) not in stacks]


def stop_everything(proc: subprocess.Popen[bytes], job_dir: str) -> list[int]:
    """Interrupt, terminate, kill the group and every hooked process, until the group is empty;
    returns the pids still alive after SIGKILL."""
    return stop_group(proc, lambda: _pids(job_dir), until_empty=True)


class _Tee(threading.Thread):
    """Copies the job's output to the terminal and the log; remembers when it last spoke. A full
    disk does not end it: it keeps the job's pipe drained (else the job blocks on its output) and
    keeps the DiskFull for the watch loop, which stops the run at once."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: str) -> None:
        super().__init__(daemon=True)
        self.proc, self.log_path = proc, log_path
        self.last_output = time.time()
        self.error: DiskFull | None = None
        # What this thread wrote: a log that holds anything else was written by the job too.
        self.written = 0
        self.digest = hashlib.sha256()

    def run(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        with open(self.log_path, "ab") as log:
            for chunk in iter(stdout.readline, b""):
                self.last_output = time.time()
                if self.error is None:
                    try:
                        log.write(chunk)
                        log.flush()
                        self.written += len(chunk)
                        self.digest.update(chunk)
                    except OSError as exc:
                        if not is_disk_full(exc):
                            raise
                        self.error = DiskFull("the job's log", self.log_path, exc)
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("torch", "deepspeed"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _last_heartbeat(job_dir: str) -> float:
    try:
        return os.path.getmtime(os.path.join(job_dir, "heartbeat"))
    except OSError:
        return 0.0


def _watch(
    proc: subprocess.Popen[bytes],
    tee: _Tee,
    job_dir: str,
    args: argparse.Namespace,
    path: str | None,
    start: float,
) -> tuple[str | None, str, dict[str, str], list[int]]:
    """Wait for the command, ending it as hung when a hang rule fires: (status, hang detail,
    stacks, survivors)."""
    watch = hangwatch.HangWatch(args.stall_timeout, floor_s=hangwatch.JOB_STALL_FLOOR_S)
    while proc.poll() is None:
        if tee.error is not None:
            raise tee.error  # the log cannot be written: the run ends now (run_job stops it)
        beat = _last_heartbeat(job_dir)
        quiet = time.time() - max(tee.last_output, beat)
        views = hangwatch.read_views(os.path.join(job_dir, collectives.FOLDER), alive)
        found = watch.observe(time.monotonic(), views, beat or None, tee.last_output)
        if time.monotonic() - start > args.timeout or quiet > args.stall_timeout or found is not None:
            said = f"no output and no heartbeat for {quiet:.0f} s" if quiet > args.stall_timeout else ""
            detail = hangwatch.hang_detail(found, said, args.stall_timeout, args.timeout)
            stacks = dump_stacks(job_dir)
            spied, unseen = unhooked_stacks(proc.pid, set(_pids(job_dir)), path)
            stacks.update(spied)
            if unseen:
                detail += (
                    f"; no stack from Python process(es) {unseen}, which the hook did not reach"
                    " (install py-spy in the env to get them)"
                )
            return "hung", detail, stacks, stop_everything(proc, job_dir)
        time.sleep(POLL_S)
    return None, "", {}, []


# What the job could reach (_evidence). total=False, as JobResult.
class JobEvidence(TypedDict, total=False):
    hook_reports: list[HookRecord]  # signature verified
    hook_signed: bool
    forged_hook_records: list[dict[str, str]]  # {"file", "why"}
    job_wrote: list[str]


# OUT/job.json: how the job ended; repro/run/job.py reads it. A runner that ends writes every key;
# total=False: one that died may have left only some, or none.
class JobResult(JobEvidence, total=False):
    status: str | None  # None: the command ended by itself
    exit_code: int | None
    hang_detail: str
    wall_s: float
    started_at: float
    stacks: dict[str, str]
    survivors: list[int]
    left_running: dict[str, str]
    processes: dict[str, str]
    hook_pth: str | None
    rendezvous: Rendezvous
    versions: dict[str, str | None]
    log: str
    command: str
    workdir: str
    patch: str
    device: str
    transport: str


def run_job(args: argparse.Namespace) -> JobResult:
    out = os.path.abspath(args.out)
    job_dir = os.path.join(out, "job")
    os.makedirs(job_dir, exist_ok=True)
    # The hook's .pth door: reaches processes whose PYTHONPATH the job replaces (hookpth.py). The
    # engines ask for it (an environment variable, which an older runner in a bundle's image
    # ignores); a test running this module with the host's own Python leaves that Python alone.
    pth = hookpth.install() if os.environ.get(hookpth.INSTALL_VAR) == "1" else None
    env = hook_environment(
        dict(os.environ),
        patch=args.patch,
        device=args.device,
        transport=args.transport,
        job_dir=job_dir,
        user_pythonpath=os.environ.get("MICS_REPRO_USER_PYTHONPATH"),
    )
    port_env, port_info = rendezvous(args.cmd, env)
    env.update(port_env)
    token = leftovers.new_token()  # marks every process of this run, wherever it goes (leftovers.py)
    env[leftovers.RUN_TOKEN_VAR] = token
    key = hooksign.new_key()  # this run's: the hook signs its records with it (hooksign.py)
    env[hooksign.KEY_VAR] = key
    before = outwrites.snapshot(out)
    shell = shutil.which("bash") or "/bin/sh"
    started = time.time()
    start = time.monotonic()
    proc = subprocess.Popen(
        [shell, "-c", args.cmd],
        cwd=args.workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    tee = _Tee(proc, os.path.join(out, JOB_LOG))
    tee.start()
    try:
        status, detail, stacks, survivors = _watch(proc, tee, job_dir, args, env.get("PATH"), start)
    except KeyboardInterrupt:
        status, detail, stacks = "interrupted", "", {}
        survivors = stop_everything(proc, job_dir)
    except DiskFull:
        stop_everything(proc, job_dir)
        leftovers.stop(token, {proc.pid}, below_me=bool(getattr(args, "subreaper", False)))
        raise
    if status is None and stopped_by_signal(proc.returncode):
        status = "interrupted"  # SIGHUP/SIGTERM reached the command itself: stopped, not crashed
    if status is None and (any(alive(p) for p in _pids(job_dir)) or group_alive(proc.pid)):
        survivors = stop_everything(proc, job_dir)  # leftovers of a finished command must not outlive it
    # What left the group (setsid, a double fork) and the hook never saw: found by the run's token
    # (and, in the real runner, a child subreaper), stopped, named.
    stray, still = leftovers.stop(token, {proc.pid}, below_me=bool(getattr(args, "subreaper", False)))
    survivors = sorted(set(survivors) | set(still))
    tee.join(timeout=10)
    if tee.error is not None:  # the command ended before the watch saw it: the log is still cut
        raise tee.error
    return {
        "status": status,
        "exit_code": proc.returncode,
        "hang_detail": detail,
        "wall_s": round(time.monotonic() - start, 3),
        "started_at": started,
        "stacks": stacks,
        "survivors": survivors,
        "left_running": stray,  # {pid: command line}: what outlived the command, stopped by the runner
        "processes": {str(k): v for k, v in _pids(job_dir).items()},
        **_evidence(out, job_dir, key, before, tee),
        "hook_pth": pth,
        "rendezvous": port_info,
        "versions": _versions(),
        "log": JOB_LOG,
        "command": args.cmd,
        "workdir": args.workdir,
        "patch": args.patch,
        "device": args.device,
        "transport": args.transport if args.device == "cpu" else "native",
    }


def _evidence(out: str, job_dir: str, key: str, before: dict[str, tuple[int, int]], tee: _Tee) -> JobEvidence:
    """What job.json says of the evidence the job could reach: the hook's records whose signature
    verified (hooksign.py), the others, and what the job wrote into OUT (outwrites.py)."""
    trusted, forged = _reports(job_dir, key.encode())
    copied = None if tee.is_alive() else (tee.written, tee.digest.hexdigest())
    return {
        "hook_reports": trusted,
        "hook_signed": True,  # the reports above are those whose signature verified
        "forged_hook_records": forged,
        "job_wrote": outwrites.job_writes(out, before, JOB_LOG, copied),
    }


def _reports(job_dir: str, key: bytes) -> tuple[list[HookRecord], list[dict[str, str]]]:
    """The hook's records (signature verified, hooksign.py) and the others, named by file."""
    found: list[tuple[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(job_dir, "hook", "*.json"))):
        try:
            with open(path) as fh:
                found.append((os.path.basename(path), json.load(fh)))
        except (OSError, ValueError, RecursionError):
            found.append((os.path.basename(path), None))
    trusted, forged = hooksign.sort_records(found, key)
    return trusted, [{**f, "file": f"job/hook/{f['file']}"} for f in forged]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m repro.workload.job")
    p.add_argument("--cmd", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--patch", choices=("stock", "fixed"), default="stock")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--transport", choices=CPU_TRANSPORTS, default="async")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--stall-timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    args.subreaper = False
    if argv is None:  # a real command line (tests call main(argv) and keep their own handlers)
        install_stop_handlers()
        follow_tool()  # the tool's death (even SIGKILL) stops the job like Ctrl-C
        args.subreaper = become_subreaper()  # the job's orphans come to this runner, not to init
    try:
        result = run_job(args)
        _write_result(os.path.join(args.out, JOB_JSON), result)
    except DiskFull as full:
        sys.stderr.write(full.message() + "\n")
        return EXIT_DISK_FULL
    return 0


def _write_result(path: str, result: JobResult) -> None:
    try:
        write_json_atomic(path, result)
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFull("the run's record (job.json)", path, exc) from None
        raise


if __name__ == "__main__":
    sys.exit(main())
