"""What a custom job wrote into its results folder (OUT) besides the lab's own files.

A job knows OUT/job through MICS_REPRO_JOB_DIR, so it can leave files there, or append to job.log,
which the judge reads. The runner (repro/workload/job.py) takes a snapshot of OUT before the job
starts and compares after it ended, before it writes job.json itself: every file that is new or
changed and is not one the lab writes is reported (job.json's `job_wrote`, the record and the
verdict text), and so is job.log grown beyond what the runner copied into it.

The lab's own files: job.log (the runner's copy of the output) and, per hooked process, under
job/: pids/<pid>, stacks/<pid>.stack, hook/<pid>.json, collectives/<pid>.json, heartbeat.
A file the job writes under one of these names is not seen here; the hook's records are signed
for that reason (repro/workload/hooksign.py).

Runs inside the environments: standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re

MAX_FILES = 10000  # the walk is bounded: the job could fill OUT with files
MAX_LISTED = 20
_LAB_FILES = re.compile(
    r"^(?:job/pids/\d+|job/stacks/\d+\.stack|job/hook/\d+\.json(?:\.tmp)?"
    r"|job/collectives/\d+\.json|job/heartbeat)$"
)


def snapshot(out: str) -> dict[str, tuple[int, int]]:
    """Relative path -> (size, mtime_ns) of the regular files under `out` (links not followed)."""
    found: dict[str, tuple[int, int]] = {}
    for root, dirs, files in os.walk(out):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            found[os.path.relpath(path, out).replace(os.sep, "/")] = (info.st_size, info.st_mtime_ns)
            if len(found) >= MAX_FILES:
                return found
    return found


def job_writes(
    out: str, before: dict[str, tuple[int, int]], log_name: str, log_copied: tuple[int, str] | None
) -> list[str]:
    """The paths (relative to `out`) the job created or changed, at most MAX_LISTED and then how
    many more. `log_copied`: (bytes, sha256) of what the runner copied into job.log (None: not
    known, the copy had not ended); a job.log that holds anything else is named first."""
    after = snapshot(out)
    changed = sorted(
        path
        for path, seen in after.items()
        if path != log_name and before.get(path) != seen and not _LAB_FILES.match(path)
    )
    listed = changed[:MAX_LISTED]
    if len(changed) > MAX_LISTED:
        listed.append(f"... and {len(changed) - MAX_LISTED} more")
    if log_copied is not None:
        offset = before.get(log_name, (0, 0))[0]
        log = _log_changed(os.path.join(out, log_name), offset, *log_copied)
        if log:
            listed.insert(0, f"{log_name} ({log})")
    return listed


def _log_changed(path: str, offset: int, copied: int, digest: str) -> str:
    """ "" when the log holds, after `offset`, exactly what the runner copied; else what differs."""
    h = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
                size += len(block)
    except OSError:
        return "" if copied == 0 else "removed by the job"
    if size == copied and h.hexdigest() == digest:
        return ""
    return f"{size} bytes, not the {copied} bytes the runner copied from the job's output"
