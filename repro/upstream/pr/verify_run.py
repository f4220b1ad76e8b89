"""The use case behind `make pr VERIFY=1 RANGE=1` and `make pr-verify`: wires the matrix, DS_REPO
and the records of a `make pr` folder to the verification (pr_verify) and the range (pr_range),
then renders PR_DESCRIPTION.md again from pr.json, verify.json and range.json."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from repro.core import console, safe_write
from repro.core.errors import MatrixError, PythonVersionError, UsageError
from repro.core.scrub import Scrubber, hand_out
from repro.matrix import compat
from repro.upstream.pr import affected_range as pr_range
from repro.upstream.pr import description as pr_description
from repro.upstream.pr import oldest_torch as pr_oldest
from repro.upstream.pr import suite as pr_suite
from repro.upstream.pr import verify as pr_verify
from repro.upstream.pr.checks import UPSTREAM_CI, Stack
from repro.upstream.pr.fix import MICS
from repro.workload import fix

REPORTER_ENV = "cpu"
NEWEST_ENV = "cpu-latest"


def stacks(matrix: Any, upstream: Mapping[str, Any] | None = None, given: str | None = None) -> list[Stack]:
    """The torches to verify with. Default: the reporter's, every preset of REF's CPU CI
    (`upstream`: pr_suite.workflow_torches of its workflow) and the matrix's newest. TORCHES= picks
    (each must be one of these or a release the matrix can derive the newest env with).

    DeepSpeed's own tests (a long step) run on the torch REF's CI installs by default when it is
    one of them, else on every stack."""
    reporter, newest = matrix.get(REPORTER_ENV).torch, matrix.get(NEWEST_ENV).torch
    ci = dict(upstream or {})
    presets = [t for t in ci.get("presets") or [] if t not in (reporter, newest)]
    torches = [reporter, *presets, newest] if given is None else _given_torches(given)
    chosen = [_stack(matrix, t, reporter, newest) for t in torches]
    default = ci.get("default")
    if any(s.torch == default for s in chosen):
        chosen = [replace(s, suite=s.torch == default) for s in chosen]
    return chosen


def _given_torches(given: str) -> list[str]:
    torches: list[str] = []
    for text in (t.strip() for t in given.split(",") if t.strip()):
        if text in torches:
            console.warn(f"TORCHES: torch {text} is given twice: one stack")
            continue
        torches.append(text)
    if not torches:
        raise UsageError(f"TORCHES={given} names no torch", fix="e.g. TORCHES=2.10.0,2.13.0")
    return torches


def _stack(matrix: Any, torch: str, reporter: str, newest: str) -> Stack:
    """The reporter's or the newest env for their own torch; any other torch on the reporter's env
    with that torch (as the range's columns: PyPI's wheels, where the newest env's CPU index may be
    out of reach) and the newest env's DeepSpeed dependencies (a recent REF imports einops, which
    0.13.1's do not hold), refused unless the matrix can derive it."""
    if torch == reporter:
        return Stack("reporter", REPORTER_ENV, torch)
    if torch == newest:
        return Stack("newest", NEWEST_ENV, torch)
    try:
        version = torch_release(torch)
        env = matrix.derive(REPORTER_ENV, torch=version, deepspeed=matrix.get(NEWEST_ENV).deepspeed)
    except (UsageError, MatrixError, PythonVersionError) as exc:
        raise UsageError(
            f"TORCHES: torch {torch} cannot be verified here",
            why=exc.what + (f" ({exc.why})" if exc.why else ""),
            fix=exc.fix or "give torch releases the matrix can install, e.g. TORCHES=2.10.0",
        ) from None
    return Stack(f"torch{version}", env.id, version, role=UPSTREAM_CI)


def pypi_torches() -> tuple[str, ...]:
    """torch's releases on PyPI with wheels for the reporter's env's Python."""
    from repro.matrix.schema import load_matrix
    from repro.matrix.versions import VersionIndex, VersionQuery

    python = load_matrix().get(REPORTER_ENV).python
    return VersionIndex().available(VersionQuery("torch", python=python, binary_only=True))


def with_oldest(
    chosen: list[Stack],
    matrix: Any,
    pr: Mapping[str, Any],
    folder: Path,
    args: VerifyRequest,
    probe: pr_verify.ProbeRunner | None,
    releases: Callable[[], Sequence[str]],
) -> tuple[list[Stack], pr_verify.OldestJSON]:
    """The stacks with the oldest torch REF imports with added after the reporter's (when it is
    older than every other taken), and what the search saw (verify.json's `oldest_torch`)."""
    reporter, newest = matrix.get(REPORTER_ENV).torch, matrix.get(NEWEST_ENV).torch

    def env_for(torch: str) -> str:
        return REPORTER_ENV if torch == reporter else _stack(matrix, torch, reporter, newest).env

    search = pr_oldest.OldestTorch(
        pr["ref_sha"], args.ds_repo, folder / "verify", env_for, probe or pr_verify.front_door_probe,
        pr_verify.CellCache("pr-verify"), args.engine,
    )  # fmt: skip
    taken = min((s.torch for s in chosen if s.torch != reporter), key=Version, default=newest)
    found = search.run(reporter, taken, releases())
    if found["torch"] is None:
        return chosen, found
    stack = replace(_stack(matrix, found["torch"], reporter, newest), suite=False)
    at = next((i + 1 for i, s in enumerate(chosen) if s.torch == reporter), 0)
    return [*chosen[:at], stack, *chosen[at:]], found


def columns(matrix: Any, given: str | None) -> list[pr_range.Column]:
    """The range's torch columns: RANGE_TORCH= (each checked, duplicates dropped with a note) or
    the default, torch 2.0.1, 2.1.0, 2.3.1 and the matrix's newest."""
    newest = matrix.get(NEWEST_ENV).torch
    if given is None:
        return [_column(matrix, t, newest) for t in (*pr_range.OLDER_TORCHES, newest)]
    chosen: dict[Version, pr_range.Column] = {}
    for text in (t.strip() for t in given.split(",") if t.strip()):
        column = _column(matrix, text, newest)
        same = chosen.setdefault(Version(column.torch), column)
        if same is not column:
            console.warn(f"RANGE_TORCH: torch {text} is given twice ({same.torch}): one column")
    if not chosen:
        raise UsageError(f"RANGE_TORCH={given} names no torch", fix="e.g. RANGE_TORCH=2.1.0,2.3.1")
    return list(chosen.values())


def _column(matrix: Any, text: str, newest: str) -> pr_range.Column:
    """One torch of the range, refused unless the matrix can derive the column's env with it
    (a version, no local label, wheels for that env's Python: what the range's probes need)."""
    try:
        version = torch_release(text)
        env = NEWEST_ENV if Version(version) == Version(newest) else REPORTER_ENV
        matrix.derive(env, torch=version)
    except (UsageError, MatrixError, PythonVersionError) as exc:
        raise UsageError(
            f"RANGE_TORCH={text!r} cannot be a column of the range",
            why=exc.what + (f" ({exc.why})" if exc.why else ""),
            fix=exc.fix or "give torch releases the matrix can install, e.g. RANGE_TORCH=2.1.0,2.3.1",
        ) from None
    return pr_range.Column(newest if env == NEWEST_ENV else version, env)


def torch_release(text: str) -> str:
    """`text` as a torch release this lab can derive an env with (a version without a local label
    or pre-release part, whose minor repro/matrix/compat.py lists); a UsageError says why not."""
    try:
        version = Version(text)
    except InvalidVersion:
        version = None
    if version is None or version.local is not None or version.is_prerelease or version.is_devrelease:
        raise UsageError(f"{text!r} is not a torch release", fix="give release numbers such as 2.1.0")
    if compat.torch_pythons(str(version)) is None:
        raise UsageError(
            f"torch {version} is not a release repro/matrix/compat.py knows",
            why="its table of torch releases and the Pythons their wheels cover does not list "
            f"torch {compat.minor(str(version))}, so no env can be derived with it",
            fix=f"give a listed release ({', '.join(compat.TORCH_PYTHONS)}), or add it there",
        )
    return str(version)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def ref_file(ds_repo: str, sha: str, path: str) -> str | None:
    """A file of DS_REPO at `sha` (None when the commit has no such file)."""
    from repro.upstream.pr.git import Checkout

    shown = Checkout(ds_repo).try_git("show", f"{sha}:{path}")
    return shown.stdout if shown.ok else None


def tag_reader(ds_repo: str) -> Any:
    from repro.upstream.pr.branch import read_at
    from repro.upstream.pr.git import Checkout

    checkout = Checkout(ds_repo)
    targets = sorted({t.path for t in fix.TARGETS})

    def read(tag: str) -> dict[str, str | None]:
        if not checkout.try_git("rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}").ok:
            return {p: None for p in targets}
        return {p: (b.text if b else None) for p, b in read_at(checkout, tag, targets).items()}

    return read, checkout


def releases_for(ds_repo: str, pr: dict[str, Any], given: str | None) -> list[str]:
    if given:
        return [v.strip() for v in given.split(",") if v.strip()]
    from repro.matrix.versions import VersionIndex, VersionQuery

    read, checkout = tag_reader(ds_repo)
    tags = checkout.try_git("tag", "--list", "v*").stdout.split()
    first = pr_range.first_mics_release(
        tags, lambda tag: bool(checkout.try_git("cat-file", "-e", f"{tag}:{MICS}").ok)
    )
    last = checkout.try_git("show", f"{pr['ref_sha']}:version.txt").stdout.strip()
    if not first or not last:
        raise UsageError(
            "cannot tell which releases have MiCS from DS_REPO",
            why=f"first release with mics.py: {first or 'none found'}; REF's version.txt: {last or 'none'}",
            fix="give the releases: RELEASES=0.9.2,0.13.1,...",
        )
    index = VersionIndex().available(VersionQuery("deepspeed"))
    return pr_range.release_rows(index, first, last)


@dataclass(frozen=True)
class VerifyRequest:
    """What `make pr-verify` was asked (the CLI's options, typed)."""

    ds_repo: str
    engine: str = "venv"  # the probes' engine (the CPU twin)
    verify: bool = True
    range: bool = False
    range_torch: str | None = None  # RANGE_TORCH=: the torch columns of the range
    releases: str | None = None  # RELEASES=: the range's rows (default: every release with MiCS)
    parallel: int = 1
    torches: str | None = None  # TORCHES=: the torches to verify with (default: see `stacks`)


def run(folder: Path, args: VerifyRequest, runners: Mapping[str, Any] | None = None) -> bool | None:
    """Verification (when asked), range (when asked), the description again. Returns whether the
    branch verified (None when no verification ran). `runners`: stand-ins for the probe, the
    regression test, DeepSpeed's own tests ("suite": not run unless given) and the survey (tests),
    by the names Verification and AffectedRange use."""
    given = dict(runners or {})
    from repro.matrix.schema import load_matrix

    pr = pr_verify.read_pr(folder)
    matrix = load_matrix()
    verified: bool | None = None
    verification: Mapping[str, Any] | None = _read_json(folder / "verify.json")
    if args.verify:
        # DeepSpeed's own tests run for a user; stand-ins (tests) run them only when given one.
        suite = given.get("suite") if runners is not None else pr_suite.front_door_session
        upstream = pr_suite.workflow_torches(ref_file(args.ds_repo, pr["ref_sha"], pr_suite.WORKFLOW))
        chosen, oldest = stacks(matrix, upstream, args.torches), None
        # Without TORCHES=, the oldest torch REF imports with (probed; stand-ins: only when given one).
        releases = given.get("releases") if runners is not None else pypi_torches
        if args.torches is None and releases is not None:
            chosen, oldest = with_oldest(chosen, matrix, pr, folder, args, given.get("probe"), releases)
        verification = pr_verify.Verification(
            pr, chosen, folder, args.ds_repo, args.engine,
            **{k: v for k, v in given.items() if k in ("probe", "regression")}, suite=suite, oldest=oldest,
        ).run()  # fmt: skip
        verified = bool(verification["verified"])
        console.result(f"verified:   {'yes' if verified else 'NO'} (verify.json)")
    ranged: Mapping[str, Any] | None = _read_json(folder / "range.json")
    if args.range:
        read, _ = tag_reader(args.ds_repo)
        found = pr_range.AffectedRange(
            pr, columns(matrix, args.range_torch), releases_for(args.ds_repo, pr, args.releases),
            folder, args.ds_repo, read, verification, args.parallel,
            **{k: v for k, v in given.items() if k in ("probe", "survey")},
        ).run()  # fmt: skip
        console.result(f"range:      {len(found['rows'])} rows x {len(found['columns'])} torch (range.json)")
        ranged = found
    record = pr_description.record_from(pr)
    # The lab's reasons are quoted from run records: the text passes the same gate as ISSUE.md
    # (host paths, user and host names, secrets scrubbed; refused if one survives).
    text = pr_description.render(record, verification, ranged)
    text = hand_out(text, Scrubber.from_host(), "PR_DESCRIPTION.md")
    safe_write.write_file(folder, "PR_DESCRIPTION.md", text.encode(), replace=True)
    return verified
