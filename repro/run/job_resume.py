"""RESUME=1 for `make run`: which of a job's runs (one per patch, stock and fixed) an earlier,
unfinished invocation already finished, so only the others run again.

A run finished when the in-env runner (repro/workload/job.py) wrote its job.json with an end
other than `interrupted`, for the same command in the same folder. The records of both runs are
then rebuilt from every run's own files (job.json and the log; repro/run/job.py build_records):
the stock run is judged against the fixed one, and that judgement reads only those files, so
re-judging a kept run against a control run again is exact and needs no rerun of it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from repro.core.errors import UsageError
from repro.core.smallfile import read_regular

if TYPE_CHECKING:
    from repro.core.results import EnvInfo, InvocationDir
    from repro.workload.job import JobResult

JOB_JSON = "job.json"
MAX_JOB_JSON_BYTES = 64 << 20


def run_folder(env_dir: Path, patch: str) -> Path:
    return env_dir / f"custom-{patch}"


def finished(job: JobResult | None, patch: str, command: str, workdir: str) -> bool:
    """Whether a run's job.json says it ended (any end but interrupted) running this job."""
    if not isinstance(job, Mapping):
        return False
    same = job.get("command") == command and job.get("workdir") == workdir and job.get("patch") == patch
    return same and job.get("status") != "interrupted"


def read_job(folder: Path) -> JobResult | None:
    """The run's job.json; None when there is none or it cannot be read."""
    try:
        job: JobResult = json.loads(read_regular(folder / JOB_JSON, MAX_JOB_JSON_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return job if isinstance(job, dict) else None


def unfinished_patches(env_dir: Path, patches: Sequence[str], command: str, workdir: str) -> list[str]:
    """The patches whose run did not finish, in the order given."""
    return [p for p in patches if not finished(read_job(run_folder(env_dir, p)), p, command, workdir)]


def check_run_folders(invocation: InvocationDir, env_id: str, patches: Sequence[str]) -> None:
    """UsageError (exit 2) when the env's folder or a run's folder is a symbolic link: RESUME=1
    reads, removes and writes them, and must do so only inside the results folder."""
    invocation.check_env_paths(env_id, *(run_folder(Path(), p).name for p in patches))


def clear_unfinished(env_dir: Path, patch: str) -> None:
    """An unfinished attempt's files go before the run starts again: its new files are the run's."""
    folder = run_folder(env_dir, patch)
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder)


def check_same_job(envs: Mapping[str, EnvInfo], env_id: str, command: str, folder: Path) -> None:
    """RESUME=1 finishes an interrupted `make run` of this command in this env, nothing else."""
    other = sorted(e for e, info in envs.items() if e != env_id or info.get("custom_command") != command)
    if other:
        raise UsageError(
            f"{folder} holds results of another invocation ({', '.join(other)})",
            why="RESUME=1 finishes an interrupted `make run` of the same command in the same env",
            fix="give OUT= of the interrupted `make run` (the line it printed), or leave RESUME unset",
        )
