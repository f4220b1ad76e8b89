"""Where a round of probes runs (PARALLEL=k, RUNNER=local|slurm): the search asks for up to k
candidates at once and a runner answers one Observation per candidate, in the same order.

- InProcess: one probe after another in this process (the default, PARALLEL=1), into the shared
  results folder.
- Processes: k `python -m repro probe` side by side on this host, each into its own folder under
  OUT/probes/, each pinned to its own devices (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES subsets
  on a GPU host) and its own DeepSpeed work tree (--slot).
- Slurm: one array job of k tasks per round, each a `python -m repro probe` (inside the env's
  Apptainer image when IMAGE= is given); `sbatch --wait` until the array is done. A task that
  left no probe.json (cancelled, failed, timed out) is `unknown`.
Both process runners read each probe's OUT/probes/<n>-<label>/probe.json; the verdict is made by
the driver's Judge from outcome and signature, not by the child.
"""

from __future__ import annotations

import re
import shlex
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from repro.bisect.probe import Observation, OrchestratedProbe, ProbeSpec
from repro.bisect.worktree_layer import ImportChecked, WorktreeLayer
from repro.core import cmd, console, records, shapes, templating
from repro.core.errors import MissingToolError, RunError, UsageError

if TYPE_CHECKING:
    from repro.bisect.commits import DsRepo
    from repro.core.results import InvocationDir
    from repro.engines.base import Engine
    from repro.matrix.model import Matrix

TEMPLATES = Path(__file__).resolve().parent / "templates"
RUNNERS = ("local", "slurm")


class RoundRunner(Protocol):
    slots: int

    def __call__(self, specs: Sequence[ProbeSpec]) -> list[Observation]: ...


Overlay = Callable[["Engine", Path], "Engine"]


class InProcess:
    """Probes one after another in this process (a DeepSpeed commit is checked out into work tree 0
    and layered over the env's venv by `overlay`)."""

    slots = 1

    def __init__(
        self,
        matrix: Matrix,
        engine: Engine,
        invocation: InvocationDir,
        say: Callable[[str], None],
        overlay: Overlay,
        repo: DsRepo | None = None,
    ) -> None:
        self.matrix, self.engine, self.invocation, self.say = matrix, engine, invocation, say
        self.overlay, self.repo = overlay, repo

    def __call__(self, specs: Sequence[ProbeSpec]) -> list[Observation]:
        return [self.one(spec) for spec in specs]

    def one(self, spec: ProbeSpec, slot: int = 0) -> Observation:
        if not spec.deepspeed_commit:
            return OrchestratedProbe(self.matrix, self.engine, self.invocation, say=self.say)(spec)
        assert self.repo is not None, "a commit probe needs its repository"
        layer = self.overlay(self.engine, self.repo.checkout(spec.deepspeed_commit, slot))
        probe = OrchestratedProbe(self.matrix, layer, self.invocation, say=self.say)
        return (ImportChecked(probe, layer) if isinstance(layer, WorktreeLayer) else probe)(spec)


@dataclass(frozen=True)
class ProbeCommand:
    """How a child probe is started: the interpreter and the options every probe shares."""

    python: str = sys.executable
    engine: str | None = None
    matrix: str | None = None
    module: str = "repro"  # tests start a stand-in that shares `probe`'s front door (probe_main)
    # Only for the child's own log and exit code (the driver judges its probe.json itself);
    # `differs` is left out: its reference is the driver's.
    bad_if: str | None = None

    def argv(self, spec: ProbeSpec, out: Path, slot: int) -> list[str]:
        pairs: list[tuple[str, object]] = [
            ("--env", spec.env_id),
            ("--engine", self.engine),
            ("--matrix", self.matrix),
            ("--torch", spec.torch),
            ("--deepspeed", spec.deepspeed),
            ("--deepspeed-commit", spec.deepspeed_commit),
            ("--ds-repo", spec.deepspeed_repo if spec.deepspeed_commit else None),
            ("--slot", slot if spec.deepspeed_commit else None),
            ("--scenario", spec.scenario),
            ("--patch", spec.patch),
            ("--dtype", spec.dtype),
            ("--transport", spec.transport),
            ("--timeout", spec.timeout_s),
            ("--steps", spec.steps),
            ("--world-size", spec.world_size),
            ("--cmd", spec.command),
            ("--workdir", spec.workdir),
            ("--loss-regex", spec.loss_regex),
            ("--requirements", spec.requirements),
            ("--packages", spec.packages),
            ("--bad-if", self.bad_if if self.bad_if != "differs" else None),
            ("--label", spec.label),
            ("--out", out),
        ]
        args = [self.python, "-m", self.module, "probe"]
        for flag, value in pairs:
            if value is not None and value != "":
                args += [flag, str(value)]
        return args


def probe_folder(root: Path, number: int, label: str) -> Path:
    return root / "probes" / f"{number:03d}-{re.sub(r'[^A-Za-z0-9_.+-]', '_', label)[:40]}"


def read_observation(folder: Path, spec: ProbeSpec, results: Path, why_missing: str) -> Observation:
    """The probe's observation from its probe.json; a probe that left none is unknown (env-error)."""
    path = folder / "probe.json"
    try:
        row = records.load(path, shapes.WALK, "probe file")["probes"][0]
    except (UsageError, KeyError, IndexError, TypeError):
        return Observation(spec.label, "env-error", "none", why_missing, 0.0, spec.env_id)
    record = row.get("record")
    rel = folder.relative_to(results)
    return Observation(
        label=spec.label,
        outcome=str(row.get("outcome")),
        signature=str(row.get("signature")),
        reason=str(row.get("reason") or ""),
        seconds=float(row.get("seconds") or 0.0),
        env_id=row.get("env"),
        reused_env=row.get("reused_env"),
        record=f"{rel}/{record}" if record else None,
        versions=dict(row.get("versions") or {}),
        layered_on=row.get("layered_on"),
    )


class Processes:
    """k child probes side by side on this host, each on its own devices."""

    def __init__(
        self,
        results: Path,
        command: ProbeCommand,
        slots: int,
        devices: Sequence[str] = (),
        device_var: str = "CUDA_VISIBLE_DEVICES",
        launch: Callable[..., cmd.CmdResult] = cmd.run,
    ) -> None:
        self.results, self.command, self.slots = results, command, slots
        self.groups = device_groups(devices, slots)
        self.device_var, self.launch = device_var, launch
        self.count = 0

    def __call__(self, specs: Sequence[ProbeSpec]) -> list[Observation]:
        folders = []
        for spec in specs:
            self.count += 1
            folders.append(probe_folder(self.results, self.count, spec.label))
        codes: dict[int, int] = {}

        def one(slot: int) -> None:
            extra = {self.device_var: self.groups[slot]} if self.groups else None
            folders[slot].parent.mkdir(parents=True, exist_ok=True)
            result = self.launch(
                self.command.argv(specs[slot], folders[slot], slot),
                extra_env=extra,
                tee=folders[slot].with_suffix(".log"),
            )
            codes[slot] = result.returncode

        threads = [threading.Thread(target=one, args=(slot,)) for slot in range(len(specs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [
            read_observation(
                folder, spec, self.results, f"the probe exited {codes.get(slot)} without probe.json"
            )
            for slot, (spec, folder) in enumerate(zip(specs, folders))
        ]


def device_groups(devices: Sequence[str], slots: int) -> list[str]:
    """`devices` split into `slots` equal, disjoint groups ("0,1", "2,3"); [] when none are given."""
    if not devices:
        return []
    per = len(devices) // slots
    if per < 1:
        raise RunError(
            f"PARALLEL={slots} probes need at least {slots} devices; {len(devices)} are visible",
            fix="lower PARALLEL=, or run them on Slurm (RUNNER=slurm)",
        )
    return [",".join(devices[i * per : (i + 1) * per]) for i in range(slots)]


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    time_limit: str = "1:00:00"
    gpus_per_task: int | None = None
    image: str | None = None  # an Apptainer image (.sif) each probe runs in
    extra: tuple[str, ...] = ()  # more #SBATCH lines' options, e.g. --account=...


class Slurm:
    """One Slurm array job per round, k tasks, each a child probe; waits on the scheduler."""

    def __init__(
        self,
        results: Path,
        command: ProbeCommand,
        slots: int,
        options: SlurmOptions = SlurmOptions(),
        launch: Callable[..., cmd.CmdResult] = cmd.run,
        say: Callable[[str], None] = console.result,
    ) -> None:
        self.results, self.command, self.slots = results, command, slots
        self.options, self.launch, self.say = options, launch, say
        self.count = 0
        self.rounds = 0

    def script(self, specs: Sequence[ProbeSpec], folders: Sequence[Path]) -> str:
        lines = []
        for slot, (spec, folder) in enumerate(zip(specs, folders)):
            argv = self.command.argv(spec, folder, slot)
            if self.options.image:
                argv = ["apptainer", "exec", "--nv", "--cleanenv", self.options.image, *argv]
            lines.append(shlex.join(argv))
        env = templating.environment(TEMPLATES)
        return env.get_template("probe-array.sbatch.j2").render(
            commands=lines,
            options=self.options,
            job_name=f"mics-probe-r{self.rounds}",
            log_pattern=str(self.results / "slurm" / f"round-{self.rounds:02d}-%a.out"),
            workdir=shlex.quote(str(Path.cwd())),
        )

    def __call__(self, specs: Sequence[ProbeSpec]) -> list[Observation]:
        self.rounds += 1
        folders = []
        for spec in specs:
            self.count += 1
            folders.append(probe_folder(self.results, self.count, spec.label))
        (self.results / "slurm").mkdir(parents=True, exist_ok=True)
        (self.results / "probes").mkdir(parents=True, exist_ok=True)
        path = self.results / "slurm" / f"round-{self.rounds:02d}.sbatch"
        path.write_text(self.script(specs, folders))
        # --wait: returns when every task has ended; its exit code is the worst task's (a bad
        # verdict exits 1), so only a missing job id means the submission itself failed.
        result = self.launch(["sbatch", "--parsable", "--wait", str(path)], capture=True)
        job = str(result.stdout).strip().split(";")[0]
        if not job.isdigit():
            raise MissingToolError(
                f"sbatch did not accept {path} (exit {result.returncode})",
                why=result.tail(5) or "no job id printed",
                fix="check that a Slurm controller answers (sinfo) and the #SBATCH options fit the cluster",
            )
        self.say(f"slurm: round {self.rounds}: array job {job} of {len(specs)} probes done")
        return [
            read_observation(
                folder,
                spec,
                self.results,
                f"Slurm array task {job}_{slot} left no probe.json (cancelled or failed)",
            )
            for slot, (spec, folder) in enumerate(zip(specs, folders))
        ]


def data_of(runner: Any) -> dict[str, Any]:
    """What bisect.json says about where the probes ran."""
    kind = {InProcess: "in-process", Processes: "local", Slurm: "slurm"}.get(
        type(runner), type(runner).__name__
    )
    return {"runner": kind, "parallel": runner.slots}
