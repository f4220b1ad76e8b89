"""`bisect`, `survey` and `probe`: find where a release changes MiCS's behaviour.

bisect   the adjacent pair of releases where the verdict flips (GOOD/BAD or FROM/TO, BAD_IF=...)
survey   every change of outcome or signature across a range, with as few probes as it can
probe    one candidate, with `git bisect run` exit codes (0 good, 1 bad, 125 skip); with
         --deepspeed-src it builds a DeepSpeed checkout into the probe env

The decisions live in repro/bisect/search.py (pure) and repro/bisect/probe.py (outcome -> verdict); this
module parses options, prints progress and writes OUT/bisect.json or OUT/survey.json next to
results.json, so `make report RESULTS=OUT` shows the probes' runs and the timeline.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from repro.bisect.output import ProbeLog, bisect_data, bisect_summary, survey_data, survey_summary
from repro.bisect.probe import BadIf, Evaluate, Judge, Observation, OrchestratedProbe, ProbeSpec
from repro.bisect.search import Bisection, Survey, Verdict
from repro.bisect.source_overlay import SourceOverlay
from repro.cli.main import DEFAULT_RESULTS_ROOT, command
from repro.core.errors import Interrupted, ReproError, UsageError
from repro.core.results import InvocationDir, invocation_meta, new_invocation_dir, point_latest
from repro.matrix.versions import VersionIndex, VersionQuery, order_versions, select_range
from repro.workload.record import PATCHES, SCENARIOS, TRANSPORT_MODES, write_json_atomic

AXES = ("torch", "deepspeed")
# `git bisect run`: 0 good, 1 bad, 125 skip; anything above 127 stops the bisection, which is
# what a broken probe (bad options, no engine) must do instead of marking commits bad.
EXIT_FOR = {Verdict.GOOD: 0, Verdict.BAD: 1, Verdict.UNKNOWN: 125}
EXIT_ABORT = 128


# -- options -------------------------------------------------------------------------------------
def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, help="base env id (default: the matrix default, cpu)")
    p.add_argument("--scenario", default="mics", choices=SCENARIOS, help="scenario to probe (default mics)")
    p.add_argument("--patch", default="stock", choices=PATCHES, help="stock or fixed (default stock)")
    p.add_argument("--engine", default=None, help="docker|venv|auto (default: $ENGINE or auto)")
    p.add_argument("--dtype", default=None, help="fp32|bf16|fp16 (default fp32)")
    p.add_argument("--transport", default="async", choices=TRANSPORT_MODES, help="CPU adapter mode")
    p.add_argument("--timeout", type=float, default=None, help="per-run time limit in seconds")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--out", default=None, help="results folder (default: a new one under results/)")
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))
    p.add_argument("--matrix", default=None, help="env matrix TOML (default env_matrix/envs.toml)")


def _range_options(p: argparse.ArgumentParser, *, bisecting: bool) -> None:
    _common(p)
    p.add_argument("--axis", required=True, choices=AXES, help="the package whose releases are walked")
    p.add_argument("--torch", default=None, help="pin torch while walking the deepspeed axis")
    p.add_argument("--deepspeed", default=None, help="pin DeepSpeed while walking the torch axis")
    p.add_argument("--from", dest="start", default=None, help="first release of the range")
    p.add_argument("--to", dest="end", default=None, help="last release (default: the newest on the index)")
    if bisecting:
        p.add_argument("--good", default=None, help="a release expected good (same as --from)")
        p.add_argument("--bad", default=None, help="a release expected bad (same as --to)")
        p.add_argument(
            "--bad-if",
            default="reproduced",
            choices=[b.value for b in BadIf],
            help="what counts as bad (see repro/bisect/probe.py for the outcome -> verdict table)",
        )
    else:
        p.add_argument("--every", action="store_true", help="probe every release, not only where ends differ")
    p.add_argument("--versions", default=None, help="comma-separated candidates instead of the index's list")
    p.add_argument("--prereleases", action="store_true", help="include pre-releases from the index")
    p.add_argument("--refresh-versions", action="store_true", help="ignore the cached release list")
    p.add_argument("--dry-run", action="store_true", help="print the candidates and exit")


def _probe_options(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--torch", default=None, help="torch release for the probe env (derived env)")
    p.add_argument("--deepspeed", default=None, help="DeepSpeed release for the probe env (derived env)")
    p.add_argument(
        "--deepspeed-src",
        default=None,
        help="a DeepSpeed checkout to build into the probe env instead of a release (venv engine)",
    )
    p.add_argument("--bad-if", default="reproduced", choices=[b.value for b in BadIf])
    p.add_argument(
        "--reference", default=None, help="OUTCOME/SIGNATURE of the good state, needed by --bad-if differs"
    )


# -- shared plumbing -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Services:
    """What a command needs from the outside world; tests pass fakes."""

    matrix: Any = None
    engine: Any = None
    index: VersionIndex | None = None
    say: Callable[[str], None] = print


def _load_matrix(args: argparse.Namespace, services: Services) -> Any:
    if services.matrix is not None:
        return services.matrix
    from repro.matrix.schema import load_matrix

    return load_matrix(args.matrix) if args.matrix else load_matrix()


def _engine(args: argparse.Namespace, services: Services) -> Any:
    if services.engine is not None:
        return services.engine
    from repro.engines.select import choose_engine

    return choose_engine(args.engine or os.environ.get("ENGINE") or None)


def _open_folder(args: argparse.Namespace, label: str, marker: str) -> tuple[Path, bool]:
    """OUT (must not hold earlier results) or a fresh timestamped folder; (folder, is_new_default)."""
    if args.out:
        folder = Path(args.out)
        for name in ("results.json", marker):
            if (folder / name).exists():
                raise UsageError(
                    f"OUT={folder} already holds {name}",
                    why="results are never overwritten",
                    fix="choose a new OUT= folder (or leave OUT unset for a fresh one)",
                )
        folder.mkdir(parents=True, exist_ok=True)
        return folder, False
    return new_invocation_dir(Path(args.results_root), [label]), True


def _invocation(args: argparse.Namespace, folder: Path, make_command: str) -> InvocationDir:
    inv = InvocationDir(folder, invocation_meta(list(getattr(args, "argv", sys.argv[1:])), make_command))
    inv.save()
    return inv


def _make_line(target: str, pairs: Sequence[tuple[str, Any]]) -> str:
    parts = [f"make {target}"]
    parts += [f"{k}={shlex.quote(str(v))}" for k, v in pairs if v not in (None, "", False)]
    return " ".join(parts)


def _probe_fields(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        scenario=args.scenario,
        patch=args.patch,
        dtype=args.dtype,
        transport=args.transport,
        timeout_s=args.timeout,
        steps=args.steps,
        world_size=args.world_size,
    )


def _run_pairs(args: argparse.Namespace, env_id: str) -> list[tuple[str, Any]]:
    return [
        ("ENV", env_id),
        ("ENGINE", args.engine),
        ("SCENARIO", args.scenario),
        ("PATCH", args.patch),
        ("DTYPE", args.dtype),
        ("TRANSPORT", None if args.transport == "async" else args.transport),
        ("STEPS", args.steps),
        ("WORLD_SIZE", args.world_size),
        ("TIMEOUT", args.timeout),
    ]


# -- the walk over releases ----------------------------------------------------------------------
@dataclass(frozen=True)
class Walk:
    """A resolved range: the candidates and how to turn one into a probe."""

    axis: str
    env_id: str
    candidates: tuple[str, ...]
    fixed: dict[str, str | None]  # the other axis's pin (None: the env's own)
    base: ProbeSpec

    def spec(self, version: str) -> ProbeSpec:
        pins = dict(self.fixed, **{self.axis: version})
        return replace(self.base, torch=pins.get("torch"), deepspeed=pins.get("deepspeed"), label=version)


def _resolve_walk(args: argparse.Namespace, services: Services, matrix: Any) -> Walk:
    env_id = args.env or matrix.default_id
    env = matrix.get(env_id)
    other = "deepspeed" if args.axis == "torch" else "torch"
    if getattr(args, args.axis):
        raise UsageError(
            f"--{args.axis} pins the axis being walked",
            fix=f"drop it, or pin the other package with --{other}",
        )
    good, bad = getattr(args, "good", None), getattr(args, "bad", None)
    if (good and args.start) or (bad and args.end):
        raise UsageError("give GOOD/BAD or FROM/TO, not both", fix="they name the same two ends")
    start, end = good or args.start, bad or args.end
    if not start:
        raise UsageError("the range has no start", fix="give GOOD= (bisect) or FROM= (both commands)")
    if args.versions:
        listed = _explicit_versions(args.versions)
    else:
        index = services.index or VersionIndex()
        query = VersionQuery(
            args.axis,
            env.torch_index if args.axis == "torch" else None,
            env.python,
            binary_only=args.axis == "torch",
        )
        listed = index.available(query, prereleases=args.prereleases, refresh=args.refresh_versions)
    if not end:
        if not listed:
            raise UsageError(f"no {args.axis} releases are known", fix="give BAD=/TO= and VERSIONS=")
        end = listed[-1]
    base = ProbeSpec(env_id=env_id, **_probe_fields(args))
    return Walk(args.axis, env_id, select_range(listed, start, end), {other: getattr(args, other)}, base)


def _explicit_versions(text: str) -> tuple[str, ...]:
    """VERSIONS=a,b,c replaces the index's list (offline hosts, or a hand-picked subset)."""
    given = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in given if not _is_version(v)]
    if bad:
        raise UsageError(
            f"VERSIONS= holds {', '.join(bad)}, which are not versions", fix="list releases like 2.1.0"
        )
    return order_versions(given, prereleases=True)


def _is_version(text: str) -> bool:
    try:
        Version(text)
        return True
    except InvalidVersion:
        return False


def _probe_engine(args: argparse.Namespace, services: Services) -> Any:
    """The engine, with the checkout overlay when --deepspeed-src is given (checked before any
    results folder is made, so a bad option leaves nothing behind)."""
    engine = _engine(args, services)
    src = getattr(args, "deepspeed_src", None)
    if src:
        engine = SourceOverlay(engine, Path(src))
    services.say(f"engine: {engine.describe()}")
    return engine


# -- bisect --------------------------------------------------------------------------------------
def _bisect_options(p: argparse.ArgumentParser) -> None:
    _range_options(p, bisecting=True)


@command(
    "bisect",
    "find the adjacent releases where MiCS turns bad (AXIS, GOOD/BAD or FROM/TO, BAD_IF)",
    _bisect_options,
)
def cmd_bisect(args: argparse.Namespace) -> int:
    return run_bisect(args, Services())


def run_bisect(args: argparse.Namespace, services: Services) -> int:
    say = services.say
    matrix = _load_matrix(args, services)
    walk = _resolve_walk(args, services, matrix)
    names, n = walk.candidates, len(walk.candidates)
    bound = 2 + math.ceil(math.log2(n - 1)) if n > 1 else n
    say(
        f"bisect: {walk.axis} {names[0]} .. {names[-1]} ({n} candidates, at most {bound} probes without "
        f"unknowns) on {walk.env_id}, {args.scenario}/{args.patch}, BAD_IF={args.bad_if}"
    )
    if args.dry_run:
        say("candidates: " + ", ".join(names))
        return 0
    engine = _probe_engine(args, services)
    folder, fresh = _open_folder(args, f"bisect-{walk.axis}", "bisect.json")
    inv = _invocation(args, folder, _bisect_make(args, walk, names[0], names[-1]))
    if fresh:
        point_latest(Path(args.results_root), folder)
    evaluate = OrchestratedProbe(matrix, engine, inv, say=say)
    judge = Judge(BadIf(args.bad_if))
    state = Bisection(n)
    log = ProbeLog(walk.axis, say)
    say(f"results: {folder}")

    def save(done: bool, resume: str | None = None) -> dict[str, Any]:
        header = {
            **_header(args, walk),
            "bad_if": args.bad_if,
            "reference": list(judge.reference) if judge.reference else None,
        }
        data = bisect_data(
            header,
            names,
            state.result(),
            log,
            done=done,
            resume=resume,
            repro_for=lambda v: walk.spec(v).repro_command(),
        )
        write_json_atomic(str(folder / "bisect.json"), data)
        return data

    try:
        while (i := state.next_probe()) is not None:
            obs = evaluate(walk.spec(names[i]))
            verdict = judge(obs)
            state.record(i, verdict)
            log.add(obs, verdict)
            save(done=False)
    except (KeyboardInterrupt, Interrupted):
        lo, hi = state.bounds()
        resume = _bisect_make(args, walk, names[lo], names[hi])
        save(done=False, resume=resume)
        raise Interrupted(
            "bisection interrupted",
            why=f"{len(log.rows)} probes done; saved in {folder}/bisect.json",
            fix=f"resume from the narrowed range: {resume}",
        ) from None
    for line in bisect_summary(save(done=True)):
        say(line)
    return 0


def _header(args: argparse.Namespace, walk: Walk) -> dict[str, Any]:
    return {
        "axis": walk.axis,
        "env": walk.env_id,
        "fixed": walk.fixed,
        "scenario": args.scenario,
        "patch": args.patch,
    }


def _bisect_make(args: argparse.Namespace, walk: Walk, start: str, end: str) -> str:
    pairs = [
        ("AXIS", walk.axis),
        ("FROM", start),
        ("TO", end),
        ("BAD_IF", args.bad_if),
        ("TORCH", walk.fixed.get("torch")),
        ("DEEPSPEED", walk.fixed.get("deepspeed")),
        ("VERSIONS", args.versions),
        *_run_pairs(args, walk.env_id),
    ]
    return _make_line("bisect", pairs)


# -- survey --------------------------------------------------------------------------------------
def _survey_options(p: argparse.ArgumentParser) -> None:
    _range_options(p, bisecting=False)


@command(
    "survey",
    "every change of outcome/signature across a range of releases (AXIS, FROM, TO, EVERY)",
    _survey_options,
)
def cmd_survey(args: argparse.Namespace) -> int:
    return run_survey(args, Services())


def _survey_key(obs: Observation) -> tuple[str, str] | None:
    # An env that could not be built says nothing about the bug: stepped around, listed apart.
    return None if obs.outcome in ("env-error", "interrupted") else obs.key


def run_survey(args: argparse.Namespace, services: Services) -> int:
    say = services.say
    matrix = _load_matrix(args, services)
    walk = _resolve_walk(args, services, matrix)
    names, n = walk.candidates, len(walk.candidates)
    say(
        f"survey: {walk.axis} {names[0]} .. {names[-1]} ({n} candidates"
        f"{', every one probed' if args.every else ''}) on {walk.env_id}, {args.scenario}/{args.patch}"
    )
    if args.dry_run:
        say("candidates: " + ", ".join(names))
        return 0
    engine = _probe_engine(args, services)
    folder, fresh = _open_folder(args, f"survey-{walk.axis}", "survey.json")
    make = _make_line(
        "survey",
        [
            ("AXIS", walk.axis),
            ("FROM", names[0]),
            ("TO", names[-1]),
            ("EVERY", 1 if args.every else None),
            ("TORCH", walk.fixed.get("torch")),
            ("DEEPSPEED", walk.fixed.get("deepspeed")),
            ("VERSIONS", args.versions),
            *_run_pairs(args, walk.env_id),
        ],
    )
    inv = _invocation(args, folder, make)
    if fresh:
        point_latest(Path(args.results_root), folder)
    evaluate = OrchestratedProbe(matrix, engine, inv, say=say)
    state: Survey[tuple[str, str]] = Survey(n, every=args.every)
    log = ProbeLog(walk.axis, say)
    say(f"results: {folder}")

    def save(done: bool, interrupted: bool = False) -> dict[str, Any]:
        header = {**_header(args, walk), "every": bool(args.every), "command": make}
        data = survey_data(header, names, state.result(), log, done=done, interrupted=interrupted)
        write_json_atomic(str(folder / "survey.json"), data)
        return data

    try:
        while (i := state.next_probe()) is not None:
            obs = evaluate(walk.spec(names[i]))
            state.record(i, _survey_key(obs))
            log.add(obs, None)
            save(done=False)
    except (KeyboardInterrupt, Interrupted):
        save(done=False, interrupted=True)
        raise Interrupted(
            "survey interrupted",
            why=f"{len(log.rows)} probes saved in {folder}/survey.json",
            fix=f"run it again ({make}); environments already built are reused",
        ) from None
    for line in survey_summary(save(done=True)):
        say(line)
    return 0


# -- probe ---------------------------------------------------------------------------------------
@command(
    "probe", "probe one candidate; exit 0 good, 1 bad, 125 unknown (for `git bisect run`)", _probe_options
)
def cmd_probe(args: argparse.Namespace) -> int:
    return run_probe(args, Services())


def probe_main(argv: Sequence[str], evaluate: Evaluate) -> int:
    """`python -m repro probe` with the evaluation step replaced (tests drive `git bisect run`)."""
    parser = argparse.ArgumentParser(prog="python -m repro probe")
    _probe_options(parser)
    args = parser.parse_args(list(argv))
    args.argv = ["probe", *argv]
    return run_probe(args, Services(), evaluate=evaluate)


def _reference(args: argparse.Namespace) -> tuple[str, str] | None:
    if args.bad_if != BadIf.DIFFERS.value:
        return None
    if not args.reference or "/" not in args.reference:
        raise UsageError(
            "--bad-if differs needs --reference OUTCOME/SIGNATURE",
            fix="use the good state's outcome and signature, e.g. clean/none",
        )
    outcome, signature = args.reference.split("/", 1)
    return outcome, signature


def _probe_label(torch: str | None, deepspeed: str | None, src: str | None) -> str:
    """What the probe line names: the release given, or both when torch and DeepSpeed are."""
    if torch and (deepspeed or src):
        return f"torch{torch}+" + (f"ds{deepspeed}" if deepspeed else f"src:{src}")
    return deepspeed or torch or (f"src:{src}" if src else "")


def run_probe(args: argparse.Namespace, services: Services, evaluate: Evaluate | None = None) -> int:
    """Never lets an error look like a verdict: errors exit EXIT_ABORT, Ctrl-C 130 (both stop git)."""
    say = services.say
    try:
        if args.deepspeed_src and args.deepspeed:
            raise UsageError("--deepspeed and --deepspeed-src both choose DeepSpeed", fix="give one of them")
        judge = Judge(BadIf(args.bad_if), _reference(args))
        src = str(Path(args.deepspeed_src).resolve()) if args.deepspeed_src else None
        spec = ProbeSpec(
            env_id=args.env or "",
            torch=args.torch,
            deepspeed=args.deepspeed,
            deepspeed_src=src,
            label=_probe_label(args.torch, args.deepspeed, src),
            **_probe_fields(args),
        )
        folder: Path | None = None
        if evaluate is None:
            matrix = _load_matrix(args, services)
            spec = replace(
                spec,
                env_id=spec.env_id or matrix.default_id,
                label=spec.label or spec.env_id or matrix.default_id,
            )
            engine = _probe_engine(args, services)
            folder, fresh = _open_folder(args, f"probe-{spec.env_id}", "probe.json")
            # `make repro` cannot build a checkout: a source probe is reproduced by its own command.
            again = spec.repro_command() if not src else shlex.join(["python", "-m", "repro", *args.argv])
            inv = _invocation(args, folder, again)
            if fresh:
                point_latest(Path(args.results_root), folder)
            evaluate = OrchestratedProbe(matrix, engine, inv, say=say)
        obs = evaluate(spec)
        verdict = judge(obs)
    except (KeyboardInterrupt, Interrupted):
        say("probe interrupted")
        return 130
    except ReproError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_ABORT
    say(
        f"probe: {obs.label} {obs.outcome} ({obs.signature}) -> {verdict.value} [BAD_IF={args.bad_if}] "
        f"in {obs.seconds:.0f} s: {obs.reason}"
    )
    if folder is not None:
        write_json_atomic(
            str(folder / "probe.json"),
            {
                "kind": "probe",
                "bad_if": args.bad_if,
                "exit_code": EXIT_FOR[verdict],
                "probes": [obs.as_dict(verdict)],
            },
        )
    return EXIT_FOR[verdict]
