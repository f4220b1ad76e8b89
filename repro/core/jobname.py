"""How a user's own command (`CMD=`, scenario `custom`) is named wherever the lab shows it:
survey/bisect lines and JSON, ISSUE.md, the report. By its command, never by its job id alone:
two jobs in one report are told apart by what they run, the id only settles ties."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from repro.workload.record import custom_job_id

SHORT_WIDTH = 60


def short_command(command: str, width: int = SHORT_WIDTH) -> str:
    """The command on one line (runs of white space as one space), cut to `width` with an ellipsis."""
    one = " ".join(command.split())
    return one if len(one) <= width else one[: width - 3].rstrip() + "..."


def job_label(command: str, job_id: str) -> str:
    """`torchrun --nproc_per_node 2 train.py` (job 7e5033f3247a): what a person recognises first."""
    if not command.strip():
        return f"job {job_id}"
    return f"`{short_command(command)}` (job {job_id})"


def job_identity(command: str, workdir: str | None) -> dict[str, str]:
    """The `job` block of survey.json/bisect.json: which of the user's jobs the walk probed. The id is
    the records' own (custom_job_id of the command and the resolved folder), so the report and the
    issue can find the walk's records by it."""
    job_id = custom_job_id(command, str(Path(workdir or ".").resolve()))  # as repro/run/job.py runs it
    return {
        "command": command,
        "short": short_command(command),
        "job_id": job_id,
        "label": job_label(command, job_id),
    }


def walk_subject(data: Mapping[str, Any]) -> str:
    """What a walk probed, for its headline and summary: `mics/stock`, or for the user's command
    `custom `torchrun ...` (job 7e50...)/stock`."""
    job = data.get("job") if isinstance(data.get("job"), Mapping) else None
    what = f"custom {job['label']}" if job and job.get("label") else str(data.get("scenario"))
    return f"{what}/{data.get('patch')}"
