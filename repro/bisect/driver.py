"""One driver for `bisect` and `survey`: resolve the range, open the results folder, probe the
candidates the search asks for, save the JSON after every probe, and on Ctrl-C save what is
known and say how to go on. The two commands differ only in their `Mode` (what a probe's
observation means to the search, what is saved, what the make line is).

Input is a typed `WalkRequest` (the CLI parses options once, in repro/cli/bisect_commands.py);
the decisions live in repro/bisect/search.py (pure) and repro/bisect/probe.py (outcome -> verdict).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from packaging.version import InvalidVersion, Version

from repro.bisect.output import ProbeLog, bisect_data, bisect_summary, survey_data, survey_summary
from repro.bisect.probe import BadIf, Judge, Observation, OrchestratedProbe, ProbeSpec
from repro.bisect.search import Bisection, Survey
from repro.bisect.source_overlay import SourceOverlay
from repro.core.errors import Interrupted, UsageError
from repro.core.makeline import make_line
from repro.core.results import InvocationDir, invocation_meta, new_invocation_dir, point_latest
from repro.matrix.versions import VersionIndex, VersionQuery, order_versions, select_range
from repro.workload.record import write_json_atomic

if TYPE_CHECKING:
    from repro.engines.base import Engine
    from repro.matrix.model import Matrix

AXES = ("torch", "deepspeed")


@dataclass(frozen=True)
class ProbeOptions:
    """How each candidate is run (shared by bisect, survey and probe)."""

    env: str | None = None
    scenario: str = "mics"
    patch: str = "stock"
    engine: str | None = None
    dtype: str | None = None
    transport: str = "async"
    timeout_s: float | None = None
    steps: int | None = None
    world_size: int | None = None
    command: str | None = None  # CMD=: probe the user's command instead of the suite's scenario
    workdir: str | None = None
    loss_regex: str | None = None

    def spec_fields(self) -> dict[str, Any]:
        return dict(
            scenario=self.scenario,
            patch=self.patch,
            dtype=self.dtype,
            transport=self.transport,
            timeout_s=self.timeout_s,
            steps=self.steps,
            world_size=self.world_size,
            command=self.command,
            workdir=self.workdir,
            loss_regex=self.loss_regex,
        )

    def make_pairs(self, env_id: str) -> list[tuple[str, object]]:
        return [
            ("ENV", env_id),
            ("ENGINE", self.engine),
            ("SCENARIO", self.scenario),
            ("PATCH", self.patch),
            ("DTYPE", self.dtype),
            ("TRANSPORT", None if self.transport == "async" else self.transport),
            ("STEPS", self.steps),
            ("WORLD_SIZE", self.world_size),
            ("TIMEOUT", self.timeout_s),
            ("CMD", self.command),
            ("WORKDIR", self.workdir),
            ("LOSS_REGEX", self.loss_regex),
        ]


@dataclass(frozen=True)
class Folder:
    """Where results go: OUT (never overwritten) or a fresh timestamped folder under the root."""

    results_root: Path
    out: Path | None = None
    argv: tuple[str, ...] = ()  # recorded in results.json

    def open(self, label: str, marker: str) -> tuple[Path, bool]:
        """(folder, is_new_default)."""
        if self.out:
            for name in ("results.json", marker):
                if (self.out / name).exists():
                    raise UsageError(
                        f"OUT={self.out} already holds {name}",
                        why="results are never overwritten",
                        fix="choose a new OUT= folder (or leave OUT unset for a fresh one)",
                    )
            self.out.mkdir(parents=True, exist_ok=True)
            return self.out, False
        return new_invocation_dir(self.results_root, [label]), True

    def invocation(self, folder: Path, make_command: str) -> InvocationDir:
        inv = InvocationDir(folder, invocation_meta(list(self.argv), make_command))
        inv.save()
        return inv


@dataclass(frozen=True)
class WalkRequest:
    """A bisect or survey over the releases of one package."""

    axis: str
    probe: ProbeOptions
    folder: Folder
    torch: str | None = None  # the other axis's pin (giving the walked one is an error)
    deepspeed: str | None = None
    start: str | None = None  # FROM (or GOOD for bisect)
    end: str | None = None  # TO (or BAD for bisect)
    good: str | None = None
    bad: str | None = None
    bad_if: str = BadIf.REPRODUCED.value  # bisect only
    every: bool = False  # survey only
    versions: str | None = None
    prereleases: bool = False
    refresh_versions: bool = False
    dry_run: bool = False
    matrix: str | None = None


@dataclass(frozen=True)
class Services:
    """What a command needs from the outside world; tests pass fakes."""

    matrix: Any = None
    engine: Any = None
    index: VersionIndex | None = None
    say: Callable[[str], None] = print


def load_matrix(path: str | None, services: Services) -> Matrix:
    if services.matrix is not None:
        return services.matrix  # type: ignore[no-any-return]
    from repro.matrix.schema import load_matrix as load

    return load(path) if path else load()


def engine_for(choice: str | None, services: Services, deepspeed_src: str | None = None) -> Engine:
    """The engine, with the checkout overlay when a DeepSpeed source is given (checked before any
    results folder is made, so a bad option leaves nothing behind)."""
    if services.engine is not None:
        engine = services.engine
    else:
        from repro.engines.select import choose_engine

        engine = choose_engine(choice or os.environ.get("ENGINE") or None)
    if deepspeed_src:
        engine = SourceOverlay(engine, Path(deepspeed_src))
    services.say(f"engine: {engine.describe()}")
    return engine  # type: ignore[no-any-return]


# -- the range -----------------------------------------------------------------------------------
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

    def make_pairs(self, req: WalkRequest, start: str, end: str) -> list[tuple[str, object]]:
        return [("AXIS", self.axis), ("FROM", start), ("TO", end)]

    def tail_pairs(self, req: WalkRequest) -> list[tuple[str, object]]:
        return [
            ("TORCH", self.fixed.get("torch")),
            ("DEEPSPEED", self.fixed.get("deepspeed")),
            ("VERSIONS", req.versions),
            *req.probe.make_pairs(self.env_id),
        ]


def resolve_walk(req: WalkRequest, services: Services, matrix: Matrix) -> Walk:
    env_id = req.probe.env or matrix.default_id
    env = matrix.get(env_id)
    if req.axis not in AXES:
        raise UsageError(f"AXIS={req.axis} is not valid", fix=f"use one of: {', '.join(AXES)}")
    other = "deepspeed" if req.axis == "torch" else "torch"
    pins = {"torch": req.torch, "deepspeed": req.deepspeed}
    if pins[req.axis]:
        raise UsageError(
            f"--{req.axis} pins the axis being walked",
            fix=f"drop it, or pin the other package with --{other}",
        )
    if (req.good and req.start) or (req.bad and req.end):
        raise UsageError("give GOOD/BAD or FROM/TO, not both", fix="they name the same two ends")
    start, end = req.good or req.start, req.bad or req.end
    if not start:
        raise UsageError("the range has no start", fix="give GOOD= (bisect) or FROM= (both commands)")
    if req.versions:
        listed = explicit_versions(req.versions)
    else:
        index = services.index or VersionIndex()
        query = VersionQuery(
            req.axis,
            env.torch_index if req.axis == "torch" else None,
            env.python,
            binary_only=req.axis == "torch",
        )
        listed = index.available(query, prereleases=req.prereleases, refresh=req.refresh_versions)
    if not end:
        if not listed:
            raise UsageError(f"no {req.axis} releases are known", fix="give BAD=/TO= and VERSIONS=")
        end = listed[-1]
    base = ProbeSpec(env_id=env_id, **req.probe.spec_fields())
    return Walk(req.axis, env_id, select_range(listed, start, end), {other: pins[other]}, base)


def explicit_versions(text: str) -> tuple[str, ...]:
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


# -- the two modes -------------------------------------------------------------------------------
class Mode(Protocol):
    """What makes a walk a bisection or a survey."""

    name: str
    marker: str  # the JSON file next to results.json

    def headline(self, walk: Walk) -> str: ...
    def make_command(self, start: str, end: str) -> str: ...
    def next_probe(self) -> int | None: ...
    def record(self, index: int, obs: Observation, log: ProbeLog) -> None: ...
    def data(self, log: ProbeLog, done: bool, interrupted: bool) -> dict[str, Any]: ...
    def summary(self, data: dict[str, Any]) -> list[str]: ...
    def interrupted(self, folder: Path, probes: int) -> Interrupted: ...


def _header(req: WalkRequest, walk: Walk) -> dict[str, Any]:
    return {
        "axis": walk.axis,
        "env": walk.env_id,
        "fixed": walk.fixed,
        "scenario": req.probe.scenario,
        "patch": req.probe.patch,
    }


class BisectMode:
    """Adjacent releases where the verdict flips; resumable from the narrowed range."""

    name, marker = "bisect", "bisect.json"

    def __init__(self, req: WalkRequest, walk: Walk) -> None:
        self.req, self.walk = req, walk
        self.judge = Judge(BadIf(req.bad_if))
        self.state = Bisection(len(walk.candidates))
        self.resume: str | None = None

    def headline(self, walk: Walk) -> str:
        names, n = walk.candidates, len(walk.candidates)
        bound = 2 + math.ceil(math.log2(n - 1)) if n > 1 else n
        return (
            f"bisect: {walk.axis} {names[0]} .. {names[-1]} ({n} candidates, at most {bound} probes without "
            f"unknowns) on {walk.env_id}, {self.req.probe.scenario}/{self.req.probe.patch}, "
            f"BAD_IF={self.req.bad_if}"
        )

    def make_command(self, start: str, end: str) -> str:
        walk = self.walk
        return make_line(
            "bisect",
            [*walk.make_pairs(self.req, start, end), ("BAD_IF", self.req.bad_if), *walk.tail_pairs(self.req)],
        )

    def next_probe(self) -> int | None:
        return self.state.next_probe()

    def record(self, index: int, obs: Observation, log: ProbeLog) -> None:
        verdict = self.judge(obs)
        self.state.record(index, verdict)
        log.add(obs, verdict)

    def data(self, log: ProbeLog, done: bool, interrupted: bool) -> dict[str, Any]:
        if interrupted:
            lo, hi = self.state.bounds()
            self.resume = self.make_command(self.walk.candidates[lo], self.walk.candidates[hi])
        header = {
            **_header(self.req, self.walk),
            "bad_if": self.req.bad_if,
            "reference": list(self.judge.reference) if self.judge.reference else None,
        }
        return bisect_data(
            header,
            self.walk.candidates,
            self.state.result(),
            log,
            done=done,
            resume=self.resume,
            repro_for=lambda v: self.walk.spec(v).repro_command(),
        )

    def summary(self, data: dict[str, Any]) -> list[str]:
        return bisect_summary(data)

    def interrupted(self, folder: Path, probes: int) -> Interrupted:
        return Interrupted(
            "bisection interrupted",
            why=f"{probes} probes done; saved in {folder}/bisect.json",
            fix=f"resume from the narrowed range: {self.resume}",
        )


def _survey_key(obs: Observation) -> tuple[str, str] | None:
    # An env that could not be built says nothing about the bug: stepped around, listed apart.
    return None if obs.outcome in ("env-error", "interrupted") else obs.key


class SurveyMode:
    """Every change of outcome or signature across the range."""

    name, marker = "survey", "survey.json"

    def __init__(self, req: WalkRequest, walk: Walk) -> None:
        self.req, self.walk = req, walk
        self.state: Survey[tuple[str, str]] = Survey(len(walk.candidates), every=req.every)
        names = walk.candidates
        self.command = self.make_command(names[0], names[-1])

    def headline(self, walk: Walk) -> str:
        names, n = walk.candidates, len(walk.candidates)
        return (
            f"survey: {walk.axis} {names[0]} .. {names[-1]} ({n} candidates"
            f"{', every one probed' if self.req.every else ''}) on {walk.env_id}, "
            f"{self.req.probe.scenario}/{self.req.probe.patch}"
        )

    def make_command(self, start: str, end: str) -> str:
        walk = self.walk
        return make_line(
            "survey",
            [
                *walk.make_pairs(self.req, start, end),
                ("EVERY", 1 if self.req.every else None),
                *walk.tail_pairs(self.req),
            ],
        )

    def next_probe(self) -> int | None:
        return self.state.next_probe()

    def record(self, index: int, obs: Observation, log: ProbeLog) -> None:
        self.state.record(index, _survey_key(obs))
        log.add(obs, None)

    def data(self, log: ProbeLog, done: bool, interrupted: bool) -> dict[str, Any]:
        header = {**_header(self.req, self.walk), "every": self.req.every, "command": self.command}
        return survey_data(
            header, self.walk.candidates, self.state.result(), log, done=done, interrupted=interrupted
        )

    def summary(self, data: dict[str, Any]) -> list[str]:
        return survey_summary(data)

    def interrupted(self, folder: Path, probes: int) -> Interrupted:
        return Interrupted(
            "survey interrupted",
            why=f"{probes} probes saved in {folder}/survey.json",
            fix=f"run it again ({self.command}); environments already built are reused",
        )


# -- the driver ----------------------------------------------------------------------------------
def run_walk(req: WalkRequest, services: Services, mode_of: Callable[[WalkRequest, Walk], Mode]) -> int:
    say = services.say
    matrix = load_matrix(req.matrix, services)
    walk = resolve_walk(req, services, matrix)
    mode = mode_of(req, walk)
    say(mode.headline(walk))
    if req.dry_run:
        say("candidates: " + ", ".join(walk.candidates))
        return 0
    engine = engine_for(req.probe.engine, services)
    folder, fresh = req.folder.open(f"{mode.name}-{walk.axis}", mode.marker)
    inv = req.folder.invocation(folder, mode.make_command(walk.candidates[0], walk.candidates[-1]))
    if fresh:
        point_latest(req.folder.results_root, folder)
    evaluate = OrchestratedProbe(matrix, engine, inv, say=say)
    log = ProbeLog(walk.axis, say)
    say(f"results: {folder}")

    def save(done: bool, interrupted: bool = False) -> dict[str, Any]:
        data = mode.data(log, done, interrupted)
        write_json_atomic(str(folder / mode.marker), data)
        return data

    try:
        while (i := mode.next_probe()) is not None:
            mode.record(i, evaluate(walk.spec(walk.candidates[i])), log)
            save(done=False)
    except (KeyboardInterrupt, Interrupted):
        save(done=False, interrupted=True)
        raise mode.interrupted(folder, len(log.rows)) from None
    for line in mode.summary(save(done=True)):
        say(line)
    return 0


def run_bisect(req: WalkRequest, services: Services) -> int:
    return run_walk(req, services, BisectMode)


def run_survey(req: WalkRequest, services: Services) -> int:
    return run_walk(req, services, SurveyMode)
