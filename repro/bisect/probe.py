"""One probe: one env (a matrix env, a derived one, or one with a DeepSpeed checkout), one
scenario and one patch, run through the normal orchestration; its record becomes a verdict.

Outcome -> verdict, the one place this mapping is defined (BAD_IF / --bad-if picks the column):

  outcome       reproduced (default)  failed    differs (from the reference: GOOD's observation)
  reproduced    bad                   bad       bad if outcome or signature differ, else good
  clean         good                  good      same rule
  crashed       unknown (bad when it  bad       same rule
                died of an IllegalWork:
                the env verdict's bug)
  hung          unknown               bad       same rule
  unsupported   unknown               unknown   same rule ("MiCS removed" is a real answer there)
  env-error     unknown               unknown   unknown
  interrupted   unknown               unknown   unknown

Why crashed/hung are unknown for `reproduced`: a run that dies of something else before MiCS
gathers anything cannot show whether the missing wait is there. Why unsupported is unknown
except for `differs`: "where does MiCS break" has no answer where MiCS does not exist, but "where
does the behaviour change" does. An environment that cannot be built (install failure, an
incompatible torch/DeepSpeed pair, a Python the wheels do not support) is env-error: unknown.
"""

from __future__ import annotations

import enum
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from repro.bisect.search import ProbeVerdict
from repro.core import console
from repro.core.errors import BuildError, MatrixError, PythonVersionError, RunError, UsageError
from repro.core.evidence import as_evidence
from repro.core.jobname import job_identity
from repro.core.make_options import reproduce_pairs
from repro.core.makeline import make_line
from repro.core.results import InvocationDir
from repro.core.runs import RunFinding, run_finding
from repro.core.walk_files import ProbeRow, WalkData
from repro.engines.base import Delegating
from repro.run.orchestrate import Request, execute, plan
from repro.workload.closed import assert_never
from repro.workload.record import CUSTOM_SCENARIO, Outcome, RunRecord, Signature

if TYPE_CHECKING:
    from repro.engines.base import Engine, Prepared
    from repro.matrix.model import Env, Matrix

# Errors that belong to one candidate, not to the host or the command line: the probe is unknown.
CANDIDATE_ERRORS: tuple[type[Exception], ...] = (BuildError, PythonVersionError, RunError, MatrixError)
# Raised while deriving the env: the matrix cannot pair this release with the env at all.
DERIVE_ERRORS: tuple[type[Exception], ...] = (*CANDIDATE_ERRORS, UsageError)


class BadIf(enum.Enum):
    REPRODUCED = "reproduced"
    FAILED = "failed"
    DIFFERS = "differs"


def verdict_for(
    outcome: str, signature: str, bad_if: BadIf, reference: tuple[str, str] | None = None
) -> ProbeVerdict:
    """The table above, from the env verdict's reading of the run (repro.core.runs.run_finding)."""
    finding = run_finding(Outcome(outcome), Signature(signature))
    if finding is RunFinding.NO_OUTCOME:
        return ProbeVerdict.UNKNOWN
    if bad_if is BadIf.DIFFERS:
        if reference is None:
            raise ValueError("BAD_IF=differs needs the reference observation")
        return ProbeVerdict.GOOD if (outcome, signature) == tuple(reference) else ProbeVerdict.BAD
    if finding is RunFinding.BUG:
        return ProbeVerdict.BAD
    if finding is RunFinding.CLEAN:
        return ProbeVerdict.GOOD
    if finding is RunFinding.OTHER_FAILURE:
        return ProbeVerdict.BAD if bad_if is BadIf.FAILED else ProbeVerdict.UNKNOWN
    if finding is RunFinding.UNSUPPORTED:
        return ProbeVerdict.UNKNOWN
    assert_never(finding)


@dataclass(frozen=True)
class Observation:
    """What one probe saw. `seconds` is the whole probe, env preparation included."""

    label: str
    outcome: str
    signature: str
    reason: str
    seconds: float
    env_id: str | None = None
    reused_env: bool | None = None
    record: str | None = None  # record.json path, relative to the results folder
    versions: dict[str, str | None] = field(default_factory=dict)
    layered_on: str | None = None  # the cached venv a layered probe venv stands on (venv engine)

    @property
    def key(self) -> tuple[str, str]:
        return self.outcome, self.signature

    @property
    def finding(self) -> RunFinding:
        """What the run says about the bug, read as the env verdict reads it."""
        return run_finding(Outcome(self.outcome), Signature(self.signature))

    def as_dict(self, verdict: ProbeVerdict | None = None) -> ProbeRow:
        data: ProbeRow = {
            "version": self.label,
            "outcome": self.outcome,
            "signature": self.signature,
            "reason": self.reason,
            "seconds": round(self.seconds, 1),
            "env": self.env_id,
            "reused_env": self.reused_env,
            "record": self.record,
            "versions": dict(self.versions),
            "layered_on": self.layered_on,
        }
        if verdict is not None:
            data["verdict"] = verdict.value
        return data


class Judge:
    """Turns observations into verdicts. For `differs`, the first decisive observation (the one
    the bisection makes at the GOOD end) becomes the reference unless one is given."""

    def __init__(self, bad_if: BadIf, reference: tuple[str, str] | None = None) -> None:
        self.bad_if = bad_if
        self.reference = reference

    def __call__(self, obs: Observation) -> ProbeVerdict:
        if self.bad_if is BadIf.DIFFERS and self.reference is None:
            if obs.finding is RunFinding.NO_OUTCOME:  # env-error, interrupted, no-evidence
                return ProbeVerdict.UNKNOWN
            self.reference = obs.key
        return verdict_for(obs.outcome, obs.signature, self.bad_if, self.reference)


@dataclass(frozen=True)
class ProbeSpec:
    """One candidate's probe; without pins, how every candidate of a walk is run (its options)."""

    env_id: str
    scenario: str = "mics"
    patch: str = "stock"
    torch: str | None = None
    deepspeed: str | None = None
    deepspeed_src: str | None = None
    # AXIS=deepspeed-commit: the commit (full SHA) of DS_REPO built over the env's venv.
    deepspeed_commit: str | None = None
    deepspeed_repo: str | None = None
    dtype: str | None = None
    transport: str = "async"
    timeout_s: float | None = None
    steps: int | None = None
    world_size: int | None = None
    label: str = ""
    # A custom command (`CMD=`, repro/run/job.py) probed instead of our suite's scenario.
    command: str | None = None
    workdir: str | None = None
    loss_regex: str | None = None
    requirements: str | None = None  # the command's own packages, a layer over each candidate env
    packages: str | None = None
    engine: str | None = None  # ENGINE= as given, so the printed line runs where this probe ran
    # A custom command's inherited environment (PYTHONPATH, GPU/NCCL settings): it goes before
    # `make` in the printed line, as in `make run`'s (repro.run.job.reproduce_line).
    inherited: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        """Bad options (WORLD_SIZE=3, STEPS=0, TIMEOUT=nan) are refused here, at the front door,
        by `make repro`'s own checks (repro/run/orchestrate.py Request): else every candidate's
        probe would fail the same way and look like an unknown candidate (exit 125, skipped)."""
        self.request()

    def request(self) -> Request:
        return Request(
            env_ids=(self.env_id,),
            torch=self.torch,
            deepspeed=self.deepspeed,
            scenarios=(self.scenario,),
            patches=(self.patch,),
            dtype=self.dtype,
            transports=(self.transport,),
            steps=self.steps,
            world_size=self.world_size,
            timeout_s=self.timeout_s,
            sync_proof=False,
        )

    def make_values(self) -> dict[str, object]:
        """This probe's make variables (None: unset), for the lines that run it again."""
        return {
            "ENV": self.env_id,
            "TORCH": self.torch,
            "DEEPSPEED": self.deepspeed,
            "DS_REPO": self.deepspeed_repo if self.deepspeed_commit else None,
            "DEEPSPEED_COMMIT": self.deepspeed_commit,
            "ENGINE": "venv" if self.deepspeed_commit else self.engine,
            "SCENARIO": None if self.command else self.scenario,  # CMD= runs no scenario of ours
            "PATCH": self.patch,
            "DTYPE": self.dtype,
            "TRANSPORT": None if self.transport == "async" else self.transport,
            "STEPS": self.steps,
            "WORLD_SIZE": self.world_size,
            "CMD": self.command,
            "WORKDIR": self.workdir,
            "LOSS_REGEX": self.loss_regex,
            "REQUIREMENTS": self.requirements,
            "PACKAGES": self.packages,
        }

    def subject(self) -> WalkData:
        """What is probed, as bisect.json, survey.json and probe.json say it: the user's command is
        scenario `custom` (as in its records), never the suite's default this spec still carries."""
        return {
            "scenario": CUSTOM_SCENARIO if self.command else self.scenario,
            "patch": self.patch,
            "job": job_identity(self.command, self.workdir) if self.command else None,
        }

    def make_pairs(self, env_id: str) -> list[tuple[str, object]]:
        """The walk lines' probe options: this probe's variables in `env_id`, and its TIMEOUT=."""
        return reproduce_pairs({**replace(self, env_id=env_id).make_values(), "TIMEOUT": self.timeout_s})

    def repro_command(self) -> str:
        """The `make repro` line that runs exactly this probe's env, scenario and patch (for a
        custom command or a DeepSpeed commit, the `make probe` line: `make run` takes no release
        pins and builds no commits)."""
        values = self.make_values()
        if self.command or self.deepspeed_commit:
            prefix = "".join(f"{name}={shlex.quote(value)} " for name, value in self.inherited)
            return prefix + make_line("probe", reproduce_pairs(values))
        # `make repro` runs the suite's scenarios (SCENARIOS=), and takes none of a probe's own options
        plain = ("ENV", "TORCH", "DEEPSPEED", "PATCH", "DTYPE", "TRANSPORT", "STEPS", "WORLD_SIZE")
        values = {"SCENARIOS": self.scenario, **{name: values[name] for name in plain}}
        return make_line("repro", reproduce_pairs(values))


Evaluate = Callable[[ProbeSpec], Observation]


class _Watch(Delegating):
    """Wraps the engine to learn whether `prepare` reused a cached env (execute does not say)."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.reused: bool | None = None
        self.layered_on: str | None = None

    def prepare(self, env: Env) -> Prepared:
        prepared = self.inner.prepare(env)
        self.reused = prepared.reused
        self.layered_on = prepared.details.get("layered_on")
        return prepared


class OrchestratedProbe:
    """The real evaluator: `plan` + `execute` into one shared results folder."""

    def __init__(
        self,
        matrix: Matrix,
        engine: Engine,
        invocation: InvocationDir,
        say: Callable[[str], None] = console.result,
    ) -> None:
        self.matrix, self.engine, self.invocation, self.say = matrix, engine, invocation, say

    def __call__(self, spec: ProbeSpec) -> Observation:
        started = time.monotonic()
        label = spec.label or spec.torch or spec.deepspeed or spec.env_id
        watch = _Watch(self.engine)
        before = len(self.invocation.runs)

        def unknown(reason: str, env_id: str | None = None) -> Observation:
            return Observation(
                label, "env-error", "none", reason, time.monotonic() - started, env_id, watch.reused
            )

        try:
            # A release the matrix cannot pair with this env (no wheel index, no wheels for its
            # Python, not a version) is a fact about the candidate, not a broken command.
            steps = plan(self.matrix, spec.request())
        except DERIVE_ERRORS as exc:
            return unknown(_one_line(exc))
        env_id = steps[0].env.id
        try:
            if spec.command:
                runs = self._custom(spec, steps[0].env, watch)
                before = 0
            else:
                runs = execute(steps, watch, self.invocation, say=self.say)
        except CANDIDATE_ERRORS as exc:
            return unknown(_one_line(exc), env_id)
        scenario = CUSTOM_SCENARIO if spec.command else spec.scenario
        mine = [
            r
            for r in runs[before:]
            if r.get("scenario") == scenario and r.get("patch") == spec.patch and r.get("transport") != "sync"
        ]
        if not mine:
            info = self.invocation.data["envs"].get(env_id or "", {})
            return unknown(
                f"the suite produced no {spec.scenario}/{spec.patch} record "
                f"(suite exit code {info.get('suite_exit_code')})",
                env_id,
            )
        # The run as evidence (repro/core/evidence.py, the one platform check the env verdict
        # uses too): a run of a rocm env that ran on CPU, or a custom job that never joined a
        # process group on a GPU, is env-error here, so no BAD_IF rule can count it.
        record = as_evidence([mine[-1]], {env_id: steps[0].env.platform.value})[0]
        log = record.get("logs") or {}
        return Observation(
            label,
            str(record.get("outcome")),
            str(record.get("signature")),
            str(record.get("reason") or ""),
            time.monotonic() - started,
            env_id,
            watch.reused,
            _record_path(log),
            dict(record.get("versions") or {}),
            watch.layered_on,
        )

    def _custom(self, spec: ProbeSpec, env: Env, watch: _Watch) -> list[RunRecord]:
        """One patch of the user's command in this candidate's env (its records land in the
        shared results folder like the suite's)."""
        from repro.engines import jobdeps
        from repro.run.job import JobRequest, execute_job

        request = JobRequest(
            env_id=env.id,
            command=spec.command or "",
            patches=(spec.patch,),
            workdir=Path(spec.workdir or "."),
            transport=spec.transport,
            loss_regex=spec.loss_regex,
            timeout_s=spec.timeout_s or JobRequest.timeout_s,
            deps=jobdeps.parse(spec.requirements, spec.packages),
        )
        return execute_job(request, env, watch, self.invocation, say=self.say)


def _record_path(logs: dict[str, str]) -> str | None:
    # The suite writes record.json next to the launcher log, in the run's folder; a custom run
    # leaves job.json next to its job log.
    if isinstance(logs.get("job"), str) and "/" in logs["job"]:
        return str(logs["job"]).rsplit("/", 1)[0] + "/job.json"
    path = logs.get("launcher")
    return path.rsplit("/", 1)[0] + "/record.json" if isinstance(path, str) and "/" in path else None


def _one_line(exc: Exception) -> str:
    what = getattr(exc, "what", str(exc))
    why = (getattr(exc, "why", "") or "").strip().splitlines()
    return f"{type(exc).__name__}: {what}" + (f" ({why[-1][:200]})" if why else "")
