"""Where a round of probes runs (PARALLEL=k, RUNNER=local|slurm): the search asks for up to k
candidates at once and a runner answers one Observation per candidate, in the same order.

- InProcess: one probe after another in this process (the default, PARALLEL=1), into the shared
  results folder.
- Processes: k `python -m repro probe` side by side on this host, each into its own folder under
  OUT/probes/, each pinned to its own devices (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES subsets
  on a GPU host) and its own DeepSpeed work tree (--slot).
- Slurm: one array job of k tasks per round, each a `python -m repro probe` (inside the env's
  Apptainer image when IMAGE= is given), watched with squeue until the array is done, and
  cancelled (scancel) when the round is interrupted or fails. A task that left no probe.json
  (cancelled, failed, timed out) is `unknown`.
Both process runners read each probe's OUT/probes/<n>-<label>/probe.json; the verdict is made by
the driver's Judge from outcome and signature, not by the child.
"""

from __future__ import annotations

import getpass
import re
import secrets
import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from repro.bisect.probe import Observation, OrchestratedProbe, ProbeSpec
from repro.bisect.worktree_layer import ImportChecked, WorktreeLayer
from repro.core import cmd, console, records, script_values, shapes, templating
from repro.core.errors import MissingToolError, RunError, UsageError
from repro.core.walk_files import WalkData

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
        folders = [probe_folder(self.results, self.count + n, spec.label) for n, spec in enumerate(specs, 1)]
        self.count += len(specs)
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

    def check(self) -> SlurmOptions:
        """These options, or a UsageError naming the one that would not be a single #SBATCH value
        (the template refuses them too; this says so before anything is built)."""
        script_values.slurm_time(self.time_limit)
        if self.partition:
            script_values.slurm_partition(self.partition)
        script_values.positive(self.gpus_per_task, "SLURM_GPUS_PER_TASK= (--slurm-gpus-per-task)")
        for option in self.extra:
            script_values.sbatch_option(option)
        return self


# How often the array job is looked at while it runs: soon at first (a round of quick probes),
# then less often, but never more than 5 s apart: a probe takes 20-70 s, so a longer gap would add
# a large share to every round; `squeue` for one job is cheap. And how many failed looks in a row
# end the wait.
POLL_FIRST_S = 1.0
POLL_MAX_S = 5.0
POLL_FAILURES = 10


class Slurm:
    """One Slurm array job per round, k tasks, each a child probe; waits on the scheduler.

    The job is submitted without `--wait` so that its id is known before anything can interrupt
    the wait: Ctrl-C, SIGTERM (repro/core/signals.py) or an error while the round runs cancels
    exactly the jobs this runner submitted (`scancel <id>`), as local probes are stopped, instead
    of leaving the array running. Ids are kept in `submitted` and in OUT/slurm/round-NN.job.
    """

    def __init__(
        self,
        results: Path,
        command: ProbeCommand,
        slots: int,
        options: SlurmOptions = SlurmOptions(),
        launch: Callable[..., cmd.CmdResult] | None = None,
        say: Callable[[str], None] = console.result,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.results, self.command, self.slots = results, command, slots
        self.options, self.say, self.sleep = options.check(), say, sleep
        # Looked up at call time: tests fake the one subprocess door, repro.core.cmd.run.
        self.launch: Callable[..., cmd.CmdResult] = launch or (lambda *a, **kw: cmd.run(*a, **kw))
        self.count = 0
        self.rounds = 0
        # A random part makes the job name this run's own: if Ctrl-C comes while sbatch is still
        # submitting (no id printed yet), only a job of this name can be the one it submitted.
        self.token = secrets.token_hex(4)
        self.submitted: list[str] = []  # every array job this runner submitted, in order
        self.live: str | None = None  # the one still running (this round's), until it ended

    @property
    def job_name(self) -> str:
        return f"mics-probe-{self.token}-r{self.rounds}"

    def script(self, specs: Sequence[ProbeSpec], folders: Sequence[Path]) -> str:
        commands = []
        for slot, (spec, folder) in enumerate(zip(specs, folders)):
            argv = self.command.argv(spec, folder, slot)
            if self.options.image:
                argv = ["apptainer", "exec", "--nv", "--cleanenv", self.options.image, *argv]
            commands.append(argv)
        env = templating.environment(TEMPLATES, filters=script_values.script_filters())
        slurm_dir = script_values.slurm_filename(self.results / "slurm")
        return env.get_template("probe-array.sbatch.j2").render(
            commands=commands,
            options=self.options,
            job_name=self.job_name,
            log_pattern=f"{slurm_dir}/round-{self.rounds:02d}-%a.out",
            workdir=str(Path.cwd()),
        )

    def __call__(self, specs: Sequence[ProbeSpec]) -> list[Observation]:
        self.rounds += 1
        folders = [probe_folder(self.results, self.count + n, spec.label) for n, spec in enumerate(specs, 1)]
        self.count += len(specs)
        (self.results / "slurm").mkdir(parents=True, exist_ok=True)
        (self.results / "probes").mkdir(parents=True, exist_ok=True)
        path = self.results / "slurm" / f"round-{self.rounds:02d}.sbatch"
        path.write_text(self.script(specs, folders))
        self.live = None
        try:
            job = self.submit(path)
            self.wait(job)
        except BaseException:
            # Ctrl-C, SIGTERM or an error: the array must not go on running without us.
            if self.live is not None:
                self.cancel(["scancel", self.live], f"array job {self.live}")
            raise
        self.live = None
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

    def submit(self, path: Path) -> str:
        """Submit the round's script; its job id, recorded before anything else happens."""
        try:
            result = self.launch(["sbatch", "--parsable", str(path)], capture=True)
            job = str(result.stdout).strip().split(";")[0]
            if result.ok and job.isdigit():
                self.live = job
        except KeyboardInterrupt:
            if self.live is None:
                # sbatch was stopped mid-submission: a job may exist whose id we never saw. Its
                # name carries this runner's random token, so cancelling by name is still exact.
                mine = [f"--user={user}"] if (user := _user()) else []
                self.cancel(["scancel", f"--name={self.job_name}", *mine], f"any job named {self.job_name}")
            raise
        if self.live is None:
            raise MissingToolError(
                f"sbatch did not accept {path} (exit {result.returncode})",
                why=result.tail(5) or "no job id printed",
                fix="check that a Slurm controller answers (sinfo) and the #SBATCH options fit the cluster",
            )
        self.submitted.append(job)
        path.with_suffix(".job").write_text(job + "\n")
        return job

    def wait(self, job: str) -> None:
        """Until no task of `job` is pending or running (squeue lists none, or no longer knows
        the job: Slurm forgets ended jobs after MinJobAge)."""
        delay, failures = POLL_FIRST_S, 0
        while True:
            result = self.launch(
                ["squeue", "--noheader", "--jobs", job, "--format", "%i %T"], capture=True, echo=False
            )
            if result.ok and not result.stdout.strip():
                return
            if not result.ok and "invalid job id" in result.stderr.lower():
                return
            failures = 0 if result.ok else failures + 1
            if failures >= POLL_FAILURES:
                raise MissingToolError(
                    f"squeue failed {failures} times in a row while array job {job} ran",
                    why=result.tail(5) or f"exit {result.returncode}",
                    fix="check that the Slurm controller answers (sinfo); the job was cancelled",
                )
            self.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)

    def cancel(self, argv: list[str], what: str) -> None:
        """scancel, best effort: a failure is reported with the command to run by hand, and never
        hides the interrupt or error that led here."""
        try:
            result = self.launch(argv, capture=True)
        except Exception as exc:  # noqa: BLE001 - the original exception is what must propagate
            why = str(exc)
        else:
            if result.ok:
                self.say(f"slurm: cancelled {what}")
                return
            why = result.tail(3) or f"exit {result.returncode}"
        console.warn(f"! could not cancel {what} ({why}); cancel it by hand: {shlex.join(argv)}")


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return None


def data_of(runner: RoundRunner) -> WalkData:
    """What bisect.json says about where the probes ran."""
    kind = {InProcess: "in-process", Processes: "local", Slurm: "slurm"}.get(
        type(runner), type(runner).__name__
    )
    return {"runner": kind, "parallel": runner.slots}
