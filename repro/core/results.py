"""The results store: one folder per invocation, written atomically, never overwritten.

Layout (read by the report, bisection and bundles):
  results/<UTC timestamp>-<env ids>/results.json   {"schema", "tool_version", "invocation",
                                                    "envs": {id: {...}}, "runs": [record, ...]}
  results/<...>/<env id>/suite.json, runs/<run>/..., artifacts/...
  results/latest -> the newest invocation folder
Record log paths are relative to the invocation folder.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import shlex
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from repro import __version__
from repro.core import records, run_lock, safe_write, shapes
from repro.core.diskfull import disk_full_error, is_disk_full
from repro.core.errors import Interrupted, UsageError
from repro.workload.record import SCHEMA_VERSION, LayerRecord, RunRecord, write_json_atomic

RESULTS_FILE = "results.json"


# Host facts that help a maintainer; no hostnames, user names or paths (they leak into bundles).
class HostInfo(TypedDict):
    os: str
    machine: str
    python: str
    cpu_count: int | None


# results.json's "invocation": the command that made the folder, and when it ran.
class Invocation(TypedDict, total=False):
    argv: list[str]
    command: str
    started_at: str
    finished_at: str | None
    interrupted: bool
    host: HostInfo
    python_command: str
    resumed_at: list[str]  # RESUME=1 runs that finished the folder


# results.json's entry for one env: what ran the suite and how it ended.
class EnvInfo(TypedDict, total=False):
    platform: str
    engine: str  # "docker" | "venv"
    pins: dict[str, str] | None
    derived_from: str | None
    image_id: str | None  # the Docker image the runs used (`make bundle` packs it)
    venv: str | None
    built_on: str
    artifacts: dict[str, str]  # {name: path relative to the results folder}
    suite_exit_code: int | None
    suite_timed_out: bool
    interrupted: bool
    custom_command: str  # `make run CMD=`: the user's command
    job_layer: LayerRecord | None  # the job's packages (engines' prepare_job)


class ResultsData(TypedDict):
    """results.json as the host side types it (the JSON itself, so its bytes never change)."""

    schema: int
    tool_version: str
    invocation: Invocation
    envs: dict[str, EnvInfo]
    runs: list[RunRecord]


LATEST = "latest"
# A link to the folder the last command wrote, OUT= or not (results/latest follows only folders
# made under the results root): `make report`/`issue`/`bundle` without RESULTS= take that one, so a
# survey written with OUT=/elsewhere is what they report, and they say which folder it is.
LAST_WRITTEN = ".last-written"


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def new_invocation_dir(root: Path, env_ids: list[str]) -> Path:
    """A fresh folder; a name clash (two invocations in one second) gets a suffix, never a reuse."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    label = re.sub(r"[^A-Za-z0-9_.+-]", "_", "_".join(env_ids))[:80]
    base = root / f"{stamp}-{label}"
    folder, n = base, 1
    while True:
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            n += 1
            folder = Path(f"{base}-{n}")


def check_latest(root: Path) -> None:
    """results/latest may be replaced only when it is the link this tool keeps (or is not there):
    a file or folder of that name is someone's, and is refused with its path (exit 2)."""
    link = root / LATEST
    try:
        mode = os.lstat(link).st_mode
    except OSError:
        return  # not there, or no root to look in: making the folder says what is wrong
    if not stat.S_ISLNK(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a file"
        raise UsageError(
            f"{link} is {kind}, not the link to the newest results this tool keeps there",
            why="this tool replaces only what it wrote; that one may be yours",
            fix=f"move {link} away, or pass OUT=<folder> (or another RESULTS_ROOT)",
        )


def point_latest(root: Path, folder: Path) -> None:
    """results/latest -> folder, replaced atomically (symlink to a temp name, then rename)."""
    check_latest(root)
    _swap_latest(root, folder.name)


def _swap_latest(root: Path, target: str, name: str = LATEST) -> None:
    # A fresh temp name (symlink_to never replaces), so no file of that name is ever removed.
    tmp = root / f".{name.lstrip('.')}.{os.getpid()}.{os.urandom(4).hex()}"
    tmp.symlink_to(target)
    try:
        os.replace(tmp, root / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def note_written(root: Path, folder: Path) -> None:
    """Remember `folder` as the one the last command wrote (root/.last-written, an absolute link).
    Best effort: a results root that cannot hold the link costs the run nothing."""
    try:
        if os.path.lexists(root / LAST_WRITTEN) and not (root / LAST_WRITTEN).is_symlink():
            return  # someone's file of that name: left alone
        root.mkdir(parents=True, exist_ok=True)
        _swap_latest(root, str(folder.resolve()), LAST_WRITTEN)
    except OSError:
        pass


def open_invocation_dir(root: Path, out: Path | None, env_ids: list[str]) -> tuple[Path, bool]:
    """The folder of a new invocation, made and proven writable: OUT= as given (new or empty of
    results), else a fresh timestamped one under `root`. Returns (folder, whether it was made here).
    A place that cannot hold results is a UsageError naming it, not an OSError traceback."""
    where = f"OUT={out}" if out is not None else f"the results root {root}"
    made = out is None or not out.exists()
    try:
        if out is None:
            check_latest(root)  # before the folder is made: results/latest is moved to it
            folder = new_invocation_dir(root, env_ids)
        else:
            if out.exists() and not out.is_dir():
                raise UsageError(
                    f"OUT={out} is a file, not a folder",
                    why="results are a folder of files",
                    fix="choose a new OUT= folder (or leave OUT unset for a timestamped one)",
                )
            if (out / RESULTS_FILE).exists():
                raise UsageError(
                    f"OUT={out} already holds results",
                    why="results are never overwritten",
                    fix="choose a new OUT= folder (or leave OUT unset for a timestamped one); to finish "
                    "an interrupted run there, run the same command with RESUME=1 (--resume)",
                )
            if out.is_dir() and any(out.iterdir()):
                # `--out /` or `--out ~`: the run would scatter results.json and env folders among
                # files it does not own, and a failed run could not tell its own files apart.
                raise UsageError(
                    f"OUT={out} is a folder that already holds other files",
                    why="a results folder is new or empty, so everything in it belongs to one run",
                    fix="choose a new OUT= folder (or leave OUT unset for a timestamped one)",
                )
            out.mkdir(parents=True, exist_ok=True)
            folder = out
        probe = folder / f".write-test.{os.getpid()}"
        probe.write_text("")
        probe.unlink()
        run_lock.lock_folder(folder)  # one run per folder, for this run's life (run_lock.py)
        note_written(root, folder)
    except OSError as exc:
        raise UsageError(
            f"cannot write results to {where}",
            why=f"{exc.strerror or exc} ({exc.filename})",
            fix="choose a folder you can write: OUT=<folder>, or RESULTS_ROOT/--results-root",
        ) from None
    return folder, made


def latest_target(root: Path) -> str | None:
    """Where results/latest points now (None when there is no such link)."""
    try:
        return os.readlink(root / LATEST)
    except OSError:
        return None


def discard_unused(folder: Path, made: bool, root: Path, previous_latest: str | None) -> bool:
    """Undo an invocation that recorded nothing (its build failed before any suite ran): remove
    its results.json (and the folder, when it was made for it) and point results/latest back
    where it was. A folder holding anything else is kept. Returns whether it was removed."""
    left = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    if any(name not in (RESULTS_FILE, run_lock.LOCK_NAME) for name in left):
        return False
    (folder / RESULTS_FILE).unlink(missing_ok=True)
    run_lock.release(folder)
    (folder / run_lock.LOCK_NAME).unlink(missing_ok=True)
    written = root / LAST_WRITTEN
    if written.is_symlink() and Path(os.readlink(written)) == folder.resolve():
        written.unlink()  # it wrote nothing after all: the last folder written is results/latest's
    if made:
        folder.rmdir()
    link = root / LATEST
    if latest_target(root) == folder.name and link.parent.resolve() == folder.parent.resolve():
        if previous_latest is None:
            link.unlink()
        else:
            _swap_latest(root, previous_latest)
    return True


def host_info() -> HostInfo:
    return {
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }


def invocation_meta(argv: list[str], command: str) -> Invocation:
    return {
        "argv": list(argv),
        "command": command,
        "started_at": utc_now(),
        "finished_at": None,
        "interrupted": False,
        "host": host_info(),
        "python_command": shlex.join([os.path.basename(sys.executable), "-m", "repro", *argv]),
    }


def resume_line(meta: Invocation, folder: Path) -> str:
    """The command that finishes this invocation into `folder` (RESUME=1): its make line, else
    its `python -m repro` line, with the folder named (results/latest may move on meanwhile)."""
    where = shlex.quote(str(folder))
    command = str(meta.get("command") or "")
    if command.startswith("make ") or " make " in command:
        return f"{command} RESUME=1 OUT={where}"
    return f"{meta.get('python_command') or 'python -m repro'} --resume --out {where}"


class InvocationDir:
    """One invocation's folder (results.json and the envs' folders). `save()` after every change,
    so Ctrl-C loses nothing."""

    def __init__(self, folder: Path, meta: Invocation) -> None:
        self.folder = folder
        self.data: ResultsData = {
            "schema": SCHEMA_VERSION,
            "tool_version": __version__,
            "invocation": meta,
            "envs": {},
            "runs": [],
        }

    @classmethod
    def reopen(cls, folder: Path) -> InvocationDir:
        """An earlier invocation's folder, to finish what it did not (RESUME=1): its records are
        kept, it is marked running again (`finished_at` null until it ends). Locked first: a second
        run of the folder while one goes refuses, naming its pid (run_lock.py)."""
        run_lock.lock_folder(folder)
        data = load(folder)
        invocation = cls(folder, data["invocation"].copy())
        invocation.data = data
        meta = invocation.data["invocation"]
        meta.setdefault("resumed_at", []).append(utc_now())
        meta["finished_at"], meta["interrupted"] = None, False
        return invocation

    def forget_env(self, env_id: str) -> None:
        """Drop an env's entry and records from results.json before its suite finishes it
        (RESUME=1). Its folder stays: the suite keeps the finished runs' records and files there
        (repro/workload/resume.py) and hands back all of them, which replace these."""
        self.data["envs"].pop(env_id, None)
        self.forget_runs(env_id)

    def forget_runs(self, env_id: str) -> None:
        """Drop an env's records from results.json (its files stay), before they are replaced."""
        self.data["runs"] = [r for r in self.data["runs"] if r.get("env") != env_id]
        self.save()

    def env_dir(self, env_id: str) -> Path:
        # Made without following a link: an env folder that leads elsewhere (RESUME=1 on a folder
        # someone linked into) would have the suite clear and write runs there.
        return safe_write.make_folders(self.folder, env_id)

    def check_env_paths(self, env_id: str, *below: str) -> None:
        """UsageError (exit 2) when the env's folder, or one of `below` in it, is a symbolic link:
        RESUME=1 reads, clears and writes there, only inside this folder."""
        safe_write.check_inside(self.folder, env_id)
        for rel in below:
            safe_write.check_inside(self.folder, f"{env_id}/{rel}")

    def add_env(self, env_id: str, info: EnvInfo) -> None:
        self.data["envs"][env_id] = info
        self.save()

    def add_runs(self, env_id: str, runs: list[RunRecord]) -> None:
        prefix = env_id + "/"
        for run in runs:
            # The suite ran inside the env's own folder; make log paths relative to the invocation.
            logs = run.get("logs") or {}
            run["logs"] = {k: v if v.startswith(prefix) else prefix + v for k, v in logs.items()}
            self.data["runs"].append(run)
        self.save()

    def finish(self, interrupted: bool = False) -> None:
        self.data["invocation"]["finished_at"] = utc_now()
        self.data["invocation"]["interrupted"] = interrupted
        self.save()

    def interrupted(self, stop: KeyboardInterrupt) -> Interrupted:
        """Finish the invocation as interrupted; the error to raise, which prints the RESUME=1 line.
        core/signals.py names SIGTERM/SIGHUP in the KeyboardInterrupt it raises for them."""
        self.finish(interrupted=True)
        return Interrupted(
            "interrupted",
            why=str(stop) or "Ctrl-C",
            fix=f"what finished is in {self.folder}; to run only what did not finish, into "
            f"the same folder: {resume_line(self.data['invocation'], self.folder)}",
        )

    def save(self) -> None:
        try:
            write_json_atomic(str(self.folder / RESULTS_FILE), self.data)
        except OSError as exc:
            if is_disk_full(exc):  # the run ends now, saying so (no traceback, no stall)
                raise disk_full_error(
                    exc, f"the results ({RESULTS_FILE})", self.folder / RESULTS_FILE
                ) from None
            raise

    @property
    def runs(self) -> list[RunRecord]:
        return list(self.data["runs"])


def last_written(root: Path) -> Path | None:
    """The folder the last command wrote, if it still holds results."""
    link = root / LAST_WRITTEN
    if not link.is_symlink():
        return None
    folder = Path(os.readlink(link))
    return folder.resolve() if (folder / RESULTS_FILE).exists() else None


def resolve_results_dir(root: Path, given: str | None, say: Callable[[str], None] | None = None) -> Path:
    """A results folder from RESULTS=/--results, else the one the last command wrote (OUT= or
    not), else the latest one. `say` gets a line naming the folder when it is not the one the last
    command wrote, or when that one is not results/latest."""
    written = last_written(root)
    latest = (root / LATEST).resolve() if (root / LATEST).exists() else None
    folder = Path(given) if given else (written or root / LATEST)
    if not (folder / RESULTS_FILE).exists():
        raise UsageError(
            f"no {RESULTS_FILE} in {folder}",
            why="that folder is not a results folder of this tool (or no run finished yet)",
            fix="run `make repro` first, or pass RESULTS=<folder> of an earlier invocation",
        )
    folder = folder.resolve()
    if say is not None:
        if written is not None and folder != written:
            say(f"results: {folder} (RESULTS=; the last command wrote {written})")
        elif written is not None and folder != latest:
            where = latest or "not set"
            say(f"results: {folder}, the folder the last command wrote (results/latest is {where})")
    return folder


def load(folder: Path, *, fix: str = records.FIX) -> ResultsData:
    """results.json of `folder`, the one loader of it: its schema and the types of the fields the
    tool reads (repro.core.shapes.RESULTS) checked; a UsageError naming the file and the field
    when they are not. `fix`: what to do when it cannot be read as JSON."""
    path = folder / RESULTS_FILE
    data = records.read(path, "results file", fix=fix)
    if not isinstance(data, dict):
        raise UsageError(
            f"{path} is damaged: the file holds a JSON {type(data).__name__}, not an object", fix=fix
        )
    if "schema" in data and data["schema"] != SCHEMA_VERSION:
        raise UsageError(
            f"{path} has schema {data['schema']!r}",
            why=f"this tool reads results of schema {SCHEMA_VERSION}",
            fix="use the tool version that wrote it, or run again into a new folder",
        )
    checked: ResultsData = records.check(data, shapes.RESULTS, path)
    return checked


def resumable(root: Path, out: Path | None, asked: bool) -> Path | None:
    """The folder RESUME=1 finishes: OUT=, else what results/latest points to; None when resuming
    was not asked for or that folder holds no results yet (then it is an ordinary new run)."""
    folder = out if out is not None else root / LATEST
    if not asked or not (folder / RESULTS_FILE).is_file():
        return None
    return folder.resolve()


@dataclass(frozen=True)
class OpenedResults:
    folder: Path
    made: bool  # this invocation made the folder (discard_unused may remove it again)
    invocation: InvocationDir
    previous_latest: str | None  # where results/latest pointed before (discard_unused restores it)


def open_results(
    root: Path, out: Path | None, env_ids: list[str], argv: list[str], command: str, resumed: Path | None
) -> OpenedResults:
    """`make repro`'s and `make run`'s results folder: the one RESUME=1 reopens (`resumed`), else a
    new invocation folder, which results/latest points to unless OUT= chose it."""
    if resumed is not None:
        folder, made, invocation = resumed, False, InvocationDir.reopen(resumed)
    else:
        folder, made = open_invocation_dir(root, out, env_ids)
        invocation = InvocationDir(folder, invocation_meta(argv, command))
        invocation.save()
    previous_latest = latest_target(root)
    if out is None and resumed is None:
        point_latest(root, folder)
    return OpenedResults(folder, made, invocation, previous_latest)
