"""What bisect.json, survey.json and probe.json hold, key by key: written by repro.bisect, read
back by repro.upstream (which may not import repro.bisect). Their runtime shapes, the keys a
file is checked for when read, are repro.core.shapes' PROBE, CHANGE, COMMIT and WALK."""

from __future__ import annotations

from typing import TypedDict


# One probe in bisect.json, survey.json and probe.json (shapes.PROBE).
class ProbeRow(TypedDict, total=False):
    version: str  # the candidate's label: a release, or a commit's short SHA
    outcome: str
    signature: str
    reason: str
    seconds: float
    env: str | None
    reused_env: bool | None
    record: str | None
    versions: dict[str, str | None]  # the run record's `versions`
    layered_on: str | None  # the cached venv a DeepSpeed-only probe venv was layered on
    verdict: str  # bisect only: good | bad | unknown


# A commit in bisect.json: candidate_commits, first_bad_commit, last_good_commit (shapes.COMMIT).
class CommitRow(TypedDict, total=False):
    sha: str
    short: str
    subject: str
    date: str
    pr: int | None
    pr_url: str | None
    files: str  # first_bad_commit only: what it changed (git show --stat)


# A change point (shapes.CHANGE): neighbouring probed candidates whose outcome or signature differ.
class Change(TypedDict):
    before: str
    after: str
    outcome_before: str
    outcome_after: str
    signature_before: str
    signature_after: str
    unknown_between: list[str]


# survey.json: a run of candidates with one outcome and signature ("from" is a keyword, hence the call).
Segment = TypedDict("Segment", {"from": str, "to": str, "outcome": str, "signature": str})


# bisect.json's `next` when both ends gave one verdict: why, what to run instead, the releases beyond.
class Next(TypedDict):
    why: str
    lines: list[str]
    earlier: list[str]
    later: list[str]


# How to reproduce the first bad commit: with this tool, with pip, and the command to run then.
class Reproduce(TypedDict):
    make: str
    pip: str
    command: str | None


# bisect.json and survey.json (shapes.WALK): one bisect's or survey's data.
class WalkData(TypedDict, total=False):
    kind: str  # bisect | survey (a COMMITS=1 stage the releases gave no boundary for: skipped)
    why: str  # kind skipped: why
    axis: str  # torch | deepspeed | deepspeed-commit
    env: str
    fixed: dict[str, str | None]  # the other package's pin (None: the env's own)
    scenario: str
    patch: str
    job: dict[str, str] | None  # the user's command (repro.core.jobname.job_identity), else None
    command: str  # the make line of the whole walk
    candidates: list[str]
    status: str  # found | no-transition | no-verdict | too-few | in-progress (survey: done | in-progress)
    interrupted: bool
    change_points: list[Change]
    probes: list[ProbeRow]
    probe_count: int
    envs_built: int
    envs_reused: int
    signature_note: str | None  # STOCK_ONLY_NOTE where it applies
    runner: str  # where the probes ran: in-process | local | slurm (rounds.data_of)
    parallel: int  # probes a round
    rounds: int
    # bisect only
    bad_if: str
    reference: list[str] | None  # BAD_IF=differs: the (outcome, signature) bad means differing from
    direction: str | None  # regression | fix
    last_good: str | None
    first_bad: str | None
    evidence: dict[str, ProbeRow]  # {"last_good", "first_bad"}: the boundary's probes ({} until found)
    unknown_between: list[str]
    repro_command: str | None
    next: Next | None  # no-transition: what to run next
    resume_command: str | None  # interrupted: the line that goes on from the narrowed range
    # survey only
    every: bool
    segments: list[Segment]
    unknown: list[str]  # candidates whose env could not run
    # AXIS=deepspeed-commit
    ds_repo: str
    repo_url: str
    candidate_commits: dict[str, CommitRow]  # short SHA -> commit
    first_bad_commit: CommitRow | None
    last_good_commit: CommitRow | None
    reproduce: Reproduce | None
    # COMMITS=1: the commit bisect between a bisect's boundary releases, or (survey) one per change point
    commits: WalkData | list[WalkData]
