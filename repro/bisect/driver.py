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
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Union

from packaging.version import InvalidVersion, Version

from repro.bisect import rounds
from repro.bisect.commits import UPSTREAM_URL, CommitInfo, DsRepo, tag_for
from repro.bisect.output import (
    ProbeLog,
    bisect_data,
    bisect_summary,
    commit_fields,
    commit_summary,
    no_transition_next,
    survey_data,
    survey_summary,
)
from repro.bisect.probe import BadIf, Judge, Observation, ProbeSpec
from repro.bisect.search import Bisection, BisectStatus, Survey, round_bound
from repro.bisect.source_overlay import SourceOverlay
from repro.bisect.worktree_layer import WorktreeLayer
from repro.core import console, safe_write
from repro.core.errors import Interrupted, UsageError
from repro.core.jobname import walk_subject
from repro.core.make_options import checked_pairs
from repro.core.makeline import make_line
from repro.core.results import (
    InvocationDir,
    check_latest,
    invocation_meta,
    new_invocation_dir,
    note_written,
    point_latest,
)
from repro.core.runs import RunFinding
from repro.core.walk_files import Change, WalkData
from repro.matrix.versions import VersionIndex, VersionQuery, order_versions, select_range
from repro.run import usecase
from repro.run.job import inherited_environment
from repro.workload.record import write_json_atomic

if TYPE_CHECKING:
    from repro.engines.base import Engine
    from repro.matrix.model import Matrix

COMMIT_AXIS = "deepspeed-commit"
# The last torch release line without `_IllegalWork` (torch 2.1 changed the coalescing manager's
# contract, docs/background.md §2): the good end a torch-axis bisect starts from when every DeepSpeed was bad.
TORCH_BEFORE_ILLEGAL_WORK = "2.0.1"
AXES = ("torch", "deepspeed", COMMIT_AXIS)


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
            # New or empty: the walk's folders and files never mix with (or overwrite) the user's.
            folder = safe_write.claim_folder(self.out, option="OUT", owned_by=())
            note_written(self.results_root, folder)  # make report/issue find it without RESULTS=
            return folder, False
        check_latest(self.results_root)  # before the folder is made: results/latest is moved to it
        folder = new_invocation_dir(self.results_root, [label])
        note_written(self.results_root, folder)
        return folder, True

    def start(self, label: str, marker: str, make_command: str) -> InvocationDir:
        """The folder opened, its results.json begun, and results/latest pointed at a fresh one."""
        folder, fresh = self.open(label, marker)
        inv = InvocationDir(folder, invocation_meta(list(self.argv), make_command))
        inv.save()
        if fresh:
            point_latest(self.results_root, folder)
        return inv


@dataclass(frozen=True)
class WalkRequest:
    """A bisect or survey over the releases of one package."""

    axis: str
    probe: ProbeSpec  # how each candidate is run: no pins yet, ENV= or "" (the matrix default)
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
    ds_repo: str | None = None  # AXIS=deepspeed-commit / COMMITS=1: a DeepSpeed checkout or git URL
    commits: bool = False  # COMMITS=1: go on from the releases into the commits between them
    parallel: int = 1  # PARALLEL=k: candidates probed side by side per round (0: auto, auto_parallel)
    runner: str = "local"  # local | slurm
    devices: tuple[str, ...] = ()  # DEVICES=0,1,2,3: split between the PARALLEL probes
    slurm: rounds.SlurmOptions = rounds.SlurmOptions()


@dataclass(frozen=True)
class Services:
    """What a command needs from the outside world; tests pass fakes."""

    matrix: Matrix | None = None
    engine: Engine | None = None
    index: VersionIndex | None = None
    say: Callable[[str], None] = console.result
    repo: Callable[[str], DsRepo] = DsRepo  # the cached clone of DS_REPO
    overlay: rounds.Overlay | None = None  # how a commit is layered over the env (SourceOverlay)
    runner: Callable[..., rounds.RoundRunner] | None = None  # tests: replaces the round runner


def load_matrix(path: str | None, services: Services) -> Matrix:
    return services.matrix if services.matrix is not None else usecase.load_matrix(path)


def engine_for(choice: str | None, services: Services, deepspeed_src: str | None = None) -> Engine:
    """The engine, with the checkout overlay when a DeepSpeed source is given (checked before any
    results folder is made, so a bad option leaves nothing behind)."""
    engine = services.engine if services.engine is not None else usecase.choose_engine(choice)
    if deepspeed_src:
        engine = SourceOverlay(engine, Path(deepspeed_src))
    services.say(f"engine: {engine.describe()}")
    return engine


# -- the range -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Walk:
    """A resolved range: the candidates and how to turn one into a probe."""

    axis: str
    env_id: str
    candidates: tuple[str, ...]
    fixed: dict[str, str | None]  # the other axis's pin (None: the env's own)
    base: ProbeSpec
    commits: dict[str, CommitInfo] = field(default_factory=dict)  # AXIS=deepspeed-commit: label -> commit
    repo: DsRepo | None = None
    # Releases the index lists outside the range (oldest first) and the env's own pins: where a
    # bisect without a transition tells the user to look next.
    earlier: tuple[str, ...] = ()
    later: tuple[str, ...] = ()
    env_pins: dict[str, str] = field(default_factory=dict)

    def spec(self, version: str) -> ProbeSpec:
        if self.axis == COMMIT_AXIS:
            return replace(
                self.base,
                torch=self.fixed.get("torch"),
                deepspeed_commit=self.commits[version].sha,
                label=version,
            )
        pins = dict(self.fixed, **{self.axis: version})
        return replace(self.base, torch=pins.get("torch"), deepspeed=pins.get("deepspeed"), label=version)


def resolve_walk(req: WalkRequest, services: Services, matrix: Matrix) -> Walk:
    env_id = req.probe.env_id or matrix.default_id
    env = matrix.get(env_id)
    if req.axis not in AXES:
        raise UsageError(f"AXIS={req.axis} is not valid", fix=f"use one of: {', '.join(AXES)}")
    other = "deepspeed" if req.axis == "torch" else "torch"
    pins = {"torch": req.torch, "deepspeed": req.deepspeed}
    if pins.get(req.axis):
        raise UsageError(
            f"--{req.axis} pins the axis being walked",
            fix=f"drop it, or pin the other package with --{other}",
        )
    if (req.good and req.start) or (req.bad and req.end):
        raise UsageError("give GOOD/BAD or FROM/TO, not both", fix="they name the same two ends")
    start, end = req.good or req.start, req.bad or req.end
    if not start:
        raise UsageError("the range has no start", fix="give GOOD= (bisect) or FROM= (both commands)")
    if req.commits and req.axis != "deepspeed":
        raise UsageError("COMMITS=1 goes on from DeepSpeed releases", fix="use it with AXIS=deepspeed")
    inherited = inherited_environment(dict(os.environ), env.platform.value) if req.probe.command else ()
    if req.axis == COMMIT_AXIS:
        return resolve_commits(req, services, env_id, start, end, inherited)
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
    base = replace(req.probe, env_id=env_id, inherited=inherited)
    candidates = select_range(listed, start, end)
    lo, hi = sorted((Version(candidates[0]), Version(candidates[-1])))
    return Walk(
        req.axis,
        env_id,
        candidates,
        {other: pins[other]},
        base,
        earlier=tuple(v for v in listed if Version(v) < lo),
        later=tuple(v for v in listed if Version(v) > hi),
        env_pins={"torch": str(env.torch), "deepspeed": str(env.deepspeed)},
    )


def resolve_commits(
    req: WalkRequest,
    services: Services,
    env_id: str,
    start: str,
    end: str | None,
    inherited: tuple[tuple[str, str], ...] = (),
) -> Walk:
    """AXIS=deepspeed-commit: the first-parent commits from GOOD/FROM to BAD/TO (default the mirror's
    HEAD) of DS_REPO's cached clone, labelled by short SHA."""
    if not req.ds_repo:
        raise UsageError(
            f"AXIS={COMMIT_AXIS} needs DS_REPO=",
            fix="give a DeepSpeed checkout (DS_REPO=~/DeepSpeed) or its git URL",
        )
    if req.deepspeed:
        raise UsageError("--deepspeed pins the axis being walked", fix="drop it; --torch may stay")
    repo = services.repo(req.ds_repo)
    repo.sync()
    good, bad = repo.resolve(start), repo.resolve(end or "HEAD")
    if good == bad or not repo.is_ancestor(good, bad):
        # `rev-list GOOD..BAD` of a reversed pair is empty: the "range" would be GOOD alone, and
        # the bisection would answer without a probe that could tell anything.
        same = good == bad
        raise UsageError(
            f"GOOD={start} and BAD={end or 'HEAD'} "
            + ("are the same commit" if same else "are not in order: GOOD is not an ancestor of BAD"),
            why="the commit axis walks the first-parent commits from GOOD (older) to BAD (newer)",
            fix="give two different commits" if same else "swap them (GOOD= the older), or check the refs",
        )
    shas = repo.first_parent_range(good, bad)
    infos = repo.describe(shas)
    commits = {infos[sha].short: infos[sha] for sha in shas}
    base = replace(req.probe, env_id=env_id, deepspeed_repo=req.ds_repo, inherited=inherited)
    return Walk(COMMIT_AXIS, env_id, tuple(commits), {"torch": req.torch}, base, commits, repo)


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
class _Mode:
    """What a bisection and a survey share; each says what makes it one (its state, what it saves
    and prints, the option its make line adds)."""

    name: str
    marker: str  # the JSON file next to results.json
    state: Bisection | Survey[tuple[str, str]]

    def __init__(self, req: WalkRequest, walk: Walk, option: tuple[str, object]) -> None:
        self.req, self.walk, self.option = req, walk, option

    def make_command(self, start: str, end: str) -> str:
        # The bisect and survey lines keep the order they were printed in before the table existed
        # (the walk's own variables around the probe's): checked_pairs checks the names only.
        req, walk = self.req, self.walk
        pairs = [
            ("AXIS", walk.axis),
            ("FROM", start),
            ("TO", end),
            # DS_REPO leads on the commit axis (the commits are its); COMMITS=1 goes on from releases
            ("DS_REPO", req.ds_repo) if walk.axis == COMMIT_AXIS else ("COMMITS", 1 if req.commits else None),
            self.option,
            ("TORCH", walk.fixed.get("torch")),
            ("DEEPSPEED", walk.fixed.get("deepspeed")),
            ("VERSIONS", req.versions),
            ("DS_REPO", req.ds_repo if req.commits else None),
            *req.probe.make_pairs(walk.env_id),
            ("PARALLEL", req.parallel if req.parallel > 1 else None),
            ("RUNNER", req.runner if req.runner != "local" else None),
        ]
        return make_line(self.name, checked_pairs(pairs))

    def next_round(self, k: int) -> list[int]:
        return self.state.next_round(k)

    def header(self) -> WalkData:
        walk = self.walk
        return {"axis": walk.axis, "env": walk.env_id, "fixed": walk.fixed, **self.req.probe.subject()}

    def subject(self) -> str:
        return walk_subject(self.req.probe.subject())


class BisectMode(_Mode):
    """Adjacent releases where the verdict flips; resumable from the narrowed range."""

    name, marker = "bisect", "bisect.json"

    def __init__(self, req: WalkRequest, walk: Walk) -> None:
        super().__init__(req, walk, ("BAD_IF", req.bad_if))
        self.judge = Judge(BadIf(req.bad_if))
        self.state: Bisection = Bisection(len(walk.candidates))
        self.resume: str | None = None

    def headline(self) -> str:
        walk = self.walk
        names, n, k = walk.candidates, len(walk.candidates), self.req.parallel
        bound = 2 + math.ceil(math.log2(n - 1)) if n > 1 else n
        cost = f"at most {bound} probes without unknowns"
        if k > 1 and n > 2:
            cost = f"{k} probes a round, at most {round_bound(n, k)} rounds without unknowns"
        return (
            f"bisect: {walk.axis} {names[0]} .. {names[-1]} ({n} candidates, {cost}) on {walk.env_id}, "
            f"{self.subject()}, BAD_IF={self.req.bad_if}"
        )

    def record(self, index: int, obs: Observation, log: ProbeLog) -> None:
        verdict = self.judge(obs)
        self.state.record(index, verdict)
        log.add(obs, verdict)

    def data(self, log: ProbeLog, done: bool, interrupted: bool) -> WalkData:
        walk, names = self.walk, self.walk.candidates
        if interrupted:
            lo, hi = self.state.bounds()
            self.resume = self.make_command(names[lo], names[hi])
        header: WalkData = {
            **self.header(),
            "bad_if": self.req.bad_if,
            "reference": list(self.judge.reference) if self.judge.reference else None,
            "command": self.make_command(names[0], names[-1]),
        }
        data = bisect_data(
            header,
            names,
            self.state.result(),
            log,
            done=done,
            resume=self.resume,
            repro_for=lambda v: walk.spec(v).repro_command(),
        )
        if walk.repo is not None:
            data.update(commit_fields(data, walk.commits, walk.repo, walk.spec, done=done))
        if done and data["status"] == BisectStatus.NO_TRANSITION.value:
            data["next"] = no_transition_next(
                data, walk.earlier, walk.later, self.make_command, self._other_axis
            )
        return data

    def _other_axis(self, at: str, toward: str) -> str | None:
        """The same job bisected over torch at the DeepSpeed release `at` (for a DeepSpeed walk):
        the bug lives in torch's coalescing manager as much as in DeepSpeed (docs/background.md §1-2)."""
        if self.walk.axis != "deepspeed":
            return None
        torch = self.walk.fixed.get("torch") or self.walk.env_pins.get("torch")
        if not torch or torch == TORCH_BEFORE_ILLEGAL_WORK:
            return None
        good, bad = (TORCH_BEFORE_ILLEGAL_WORK, torch) if toward == "older" else (torch, None)
        return make_line(
            "bisect" if bad else "survey",
            checked_pairs(
                [
                    ("AXIS", "torch"),
                    ("GOOD" if bad else "FROM", good),
                    ("BAD", bad),
                    ("BAD_IF", self.req.bad_if if bad else None),
                    ("DEEPSPEED", at),
                    *self.req.probe.make_pairs(self.walk.env_id),
                ]
            ),
        )

    def summary(self, data: WalkData) -> list[str]:
        return bisect_summary(data) + commit_summary(data)

    def interrupted(self, folder: Path, probes: int) -> Interrupted:
        return Interrupted(
            "bisection interrupted",
            why=f"{probes} probes done; saved in {folder}/bisect.json",
            fix=f"resume from the narrowed range: {self.resume}",
        )


class SurveyMode(_Mode):
    """Every change of outcome or signature across the range."""

    name, marker = "survey", "survey.json"

    def __init__(self, req: WalkRequest, walk: Walk) -> None:
        super().__init__(req, walk, ("EVERY", 1 if req.every else None))
        self.state: Survey[tuple[str, str]] = Survey(len(walk.candidates), every=req.every)
        self.command = self.make_command(walk.candidates[0], walk.candidates[-1])

    def headline(self) -> str:
        names, n = self.walk.candidates, len(self.walk.candidates)
        return (
            f"survey: {self.walk.axis} {names[0]} .. {names[-1]} ({n} candidates"
            f"{', every one probed' if self.req.every else ''}) on {self.walk.env_id}, {self.subject()}"
        )

    def record(self, index: int, obs: Observation, log: ProbeLog) -> None:
        # An env that could not be built, or a run that said nothing about the bug (no-evidence):
        # stepped around, listed apart.
        self.state.record(index, None if obs.finding is RunFinding.NO_OUTCOME else obs.key)
        log.add(obs, None)

    def data(self, log: ProbeLog, done: bool, interrupted: bool) -> WalkData:
        header: WalkData = {**self.header(), "every": self.req.every, "command": self.command}
        return survey_data(
            header, self.walk.candidates, self.state.result(), log, done=done, interrupted=interrupted
        )

    def summary(self, data: WalkData) -> list[str]:
        return survey_summary(data)

    def interrupted(self, folder: Path, probes: int) -> Interrupted:
        return Interrupted(
            "survey interrupted",
            why=f"{probes} probes saved in {folder}/survey.json",
            fix=f"run it again ({self.command}); environments already built are reused",
        )


Mode = Union[BisectMode, SurveyMode]


# -- the driver ----------------------------------------------------------------------------------
def make_runner(
    req: WalkRequest, services: Services, matrix: Matrix, engine: Engine, inv: InvocationDir, walk: Walk
) -> rounds.RoundRunner:
    """Where each round's probes run: in this process (PARALLEL=1), side by side on this host, or
    as a Slurm array job."""
    if services.runner is not None:
        return services.runner(req=req, matrix=matrix, engine=engine, invocation=inv, walk=walk)
    if req.runner not in rounds.RUNNERS:
        raise UsageError(f"RUNNER={req.runner} is not valid", fix=f"use one of: {', '.join(rounds.RUNNERS)}")
    command = rounds.ProbeCommand(engine=req.probe.engine, matrix=req.matrix, bad_if=req.bad_if)
    if walk.repo is not None and (req.parallel > 1 or req.runner == "slurm"):
        # Each child probe checks out into its own slot; adding the work trees here, one after
        # another, keeps k children from racing on the clone's worktree list.
        for slot in range(max(req.parallel, 1)):
            walk.repo.checkout(walk.commits[walk.candidates[0]].sha, slot)
    if req.runner == "slurm":
        return rounds.Slurm(inv.folder, command, req.parallel, req.slurm, say=services.say)
    if req.parallel > 1:
        rocm = (
            getattr(getattr(matrix.get(walk.env_id.split("+")[0]), "platform", None), "value", "") == "rocm"
        )
        var = "HIP_VISIBLE_DEVICES" if rocm else "CUDA_VISIBLE_DEVICES"
        return rounds.Processes(inv.folder, command, req.parallel, req.devices, device_var=var)
    overlay = services.overlay or WorktreeLayer
    return rounds.InProcess(matrix, engine, inv, services.say, overlay, walk.repo)


def auto_parallel(
    req: WalkRequest, matrix: Matrix, gpus: int | None = None, cores: int | None = None
) -> WalkRequest:
    """PARALLEL=auto: on a GPU host with G GPUs (after *_VISIBLE_DEVICES) and probes of g ranks
    (WORLD_SIZE=, else all of them), k = G / g, each probe on its own g of DEVICES (default 0..G-1);
    on CPU, k = cores / ranks (WORLD_SIZE=, else the suite's 4), at least 1. On Slurm the nodes
    are the scheduler's: auto means 2."""
    if req.runner == "slurm":
        return replace(req, parallel=2)
    if gpus is None:
        from repro.engines.preflight import gpu_count

        gpus = gpu_count(matrix.get(req.probe.env_id or matrix.default_id))
    if gpus:
        per = req.probe.world_size or gpus
        devices = req.devices or tuple(str(i) for i in range(gpus))
        return replace(req, parallel=max(1, len(devices) // per), devices=devices)
    per_cpu = req.probe.world_size or 4
    return replace(req, parallel=max(1, (cores or os.cpu_count() or 1) // per_cpu))


# PARALLEL= is capped here whatever the host: each probe of a round is a process (and, on the
# commit axis, a work tree of the clone) of its own.
MAX_PARALLEL = 64


def bounded_parallel(
    req: WalkRequest, candidates: int, say: Callable[[str], None], cores: int | None = None
) -> WalkRequest:
    """PARALLEL=k, at most: the candidates (a round never probes more), this host's cores for
    local probes (Slurm's nodes are the scheduler's), and MAX_PARALLEL. The preamble says so."""
    limits = [(candidates, f"{candidates} candidates"), (MAX_PARALLEL, f"at most {MAX_PARALLEL}")]
    if req.runner != "slurm":
        host = cores or os.cpu_count() or 1
        limits.append((host, f"{host} cores here"))
    k = max(1, min([req.parallel, *(n for n, _ in limits)]))
    if k >= req.parallel:
        return req
    why = ", ".join(text for n, text in limits if n == k)
    say(f"PARALLEL={req.parallel}: {k} probes a round ({why})")
    return replace(req, parallel=k)


@dataclass(frozen=True)
class _Walker:
    """What the stages of one walk share: a release walk and, with COMMITS=1, its commit stages."""

    services: Services
    matrix: Matrix
    engine: Engine
    inv: InvocationDir

    def stage(self, mode: Mode) -> _Stage:
        runner = make_runner(mode.req, self.services, self.matrix, self.engine, self.inv, mode.walk)
        return _Stage(mode, runner, self.services.say)

    def chain_all(
        self, req: WalkRequest, data: WalkData, chained: WalkData, save: Callable[..., object]
    ) -> None:
        """COMMITS=1: a bisect goes on between its boundary releases (`commits`: one commit bisect); a
        survey between the releases of each change point (`commits`: a list in change-point order),
        where `bad` means behaving differently from the older release (BAD_IF=differs)."""
        if data["kind"] == "survey":
            stages: list[WalkData] = []
            chained["commits"] = stages
            for point in data["change_points"]:
                stages.append({})
                publish = partial(stages.__setitem__, len(stages) - 1)
                self.chain_commits(replace(req, bad_if=BadIf.DIFFERS.value), point, publish, save)
        elif data["status"] != "found":
            chained["commits"] = {"kind": "skipped", "why": "the releases showed no good/bad boundary"}
        else:
            publish = partial(chained.__setitem__, "commits")
            self.chain_commits(req, data["change_points"][0], publish, save)

    def chain_commits(
        self,
        req: WalkRequest,
        point: Change,
        publish: Callable[[WalkData], None],
        save: Callable[..., object],
    ) -> None:
        """Bisect the first-parent commits between the two releases of `point` (their v<version> tags),
        in the same folder and with the same runner settings; `publish` puts the data where the
        releases' JSON holds it, saved after every round like the releases."""
        sub = replace(
            req,
            axis=COMMIT_AXIS,
            good=tag_for(point["before"]),
            bad=tag_for(point["after"]),
            start=None,
            end=None,
            versions=None,
            deepspeed=None,
            commits=False,
            ds_repo=req.ds_repo or UPSTREAM_URL,
        )
        walk = resolve_walk(sub, self.services, self.matrix)
        mode = BisectMode(bounded_parallel(sub, len(walk.candidates), self.services.say), walk)
        self.services.say(mode.headline())
        stage = self.stage(mode)

        def save_commits(done: bool, interrupted: bool = False) -> None:
            publish(stage.data(done, interrupted))
            save(done=True, interrupted=interrupted)

        try:
            stage.run(save_commits)
        except (KeyboardInterrupt, Interrupted):
            save_commits(done=False, interrupted=True)
            raise
        save_commits(done=True)


class _Stage:
    """One walk's probes, a round at a time: its mode, its runner and the log of what they saw."""

    def __init__(self, mode: Mode, runner: rounds.RoundRunner, say: Callable[[str], None]) -> None:
        self.mode, self.runner = mode, runner
        self.log = ProbeLog(mode.walk.axis, say)
        self.rounds = 0  # counted once the search is done

    def data(self, done: bool, interrupted: bool = False) -> WalkData:
        mode_data = self.mode.data(self.log, done, interrupted)
        return {**mode_data, **rounds.data_of(self.runner), "rounds": self.rounds}

    def run(self, save: Callable[..., object]) -> None:
        """Probe what the search asks for, saving after every round."""
        mode, walk, count = self.mode, self.mode.walk, 0
        while batch := mode.next_round(mode.req.parallel):
            count += 1
            observations = self.runner([walk.spec(walk.candidates[i]) for i in batch])
            for i, obs in zip(batch, observations, strict=True):
                mode.record(i, obs, self.log)
            save(done=False)
        self.rounds = count


def run_walk(req: WalkRequest, services: Services, mode_of: Callable[[WalkRequest, Walk], Mode]) -> int:
    say = services.say
    if req.parallel < 0:
        raise UsageError(
            f"PARALLEL={req.parallel} is not valid", fix="give a number of probes per round, or auto"
        )
    matrix = load_matrix(req.matrix, services)
    if req.parallel == 0:
        req = auto_parallel(req, matrix)
        say(
            f"PARALLEL=auto: {req.parallel} probes a round"
            + (f" on devices {req.devices}" if req.devices else "")
        )
    if req.commits and req.axis == "deepspeed":
        # COMMITS=1: a DS_REPO that cannot serve the commit stage is refused before the first
        # release probe (a dry run checks what needs no network), not after all of them.
        repo = services.repo(req.ds_repo or UPSTREAM_URL)
        if req.dry_run:
            repo.check()
        else:
            repo.sync()
    walk = resolve_walk(req, services, matrix)
    asked, req = req, bounded_parallel(req, len(walk.candidates), say)
    mode = mode_of(req, walk)
    say(mode.headline())
    if req.dry_run:
        say("candidates: " + ", ".join(walk.candidates))
        return 0
    engine = engine_for(req.probe.engine, services)
    command = mode.make_command(walk.candidates[0], walk.candidates[-1])
    inv = req.folder.start(f"{mode.name}-{walk.axis}", mode.marker, command)
    walker = _Walker(services, matrix, engine, inv)
    stage = walker.stage(mode)
    say(f"results: {inv.folder}")
    chained: WalkData = {}  # COMMITS=1: the commit stage(s)

    def save(done: bool, interrupted: bool = False) -> WalkData:
        data: WalkData = {**stage.data(done, interrupted), **chained}
        write_json_atomic(str(inv.folder / mode.marker), data)
        return data

    try:
        stage.run(save)
        data = save(done=True)
        if req.commits:
            # the commit stage caps PARALLEL= by its own candidates, not by the releases'
            walker.chain_all(replace(req, parallel=asked.parallel), data, chained, save)
    except (KeyboardInterrupt, Interrupted):
        save(done=False, interrupted=True)
        raise mode.interrupted(inv.folder, len(stage.log.rows)) from None
    data = save(done=True)
    for line in mode.summary(data):
        say(line)
    stages = chained.get("commits") or []
    for commits in stages if isinstance(stages, list) else [stages]:
        if commits.get("kind") == "bisect":
            names = commits["candidates"]
            say("")
            say(f"commits {names[0]} .. {names[-1]} between the two releases:")
            for line in bisect_summary(commits) + commit_summary(commits):
                say(line)
    return 0


def run_bisect(req: WalkRequest, services: Services) -> int:
    return run_walk(req, services, BisectMode)


def run_survey(req: WalkRequest, services: Services) -> int:
    return run_walk(req, services, SurveyMode)
