"""`python -m repro gpu-check` (`make gpu-check`): prove a GPU host end to end in one command.

    check = gpu_check(out_dir, HostDevice(), matrix, env_id=None)   # env: cuda on NVIDIA, ROCm by arch

The host facts decide the env (unless one is named) and the GPU count; `gpu_check_plan.plan()`
gives the steps; this module walks them, asks `gpu_check_judge` for each verdict, and writes
gpu-check.json (every step's verdict, summary and facts) and gpu-check.txt (one line per step).
A step whose prerequisite did not succeed is skipped, never run half-prepared.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from repro import __version__
from repro.core import console, safe_write, shapes
from repro.core import records as rec_files
from repro.core.errors import DeviceUnavailableError, ReproError, UsageError
from repro.core.results import RESULTS_FILE, utc_now
from repro.matrix import compat
from repro.run import gpu_check_judge as judge
from repro.run.gpu_check_plan import (
    RESULT_FILE,
    STEPS_PER_RUN,
    TEXT_FILE,
    Step,
    StepKind,
    StepResult,
    Verdict,
)
from repro.run.gpu_check_plan import plan as plan_steps
from repro.workload import ds_config
from repro.workload.closed import assert_never

if TYPE_CHECKING:
    from repro.engines.base import Prepared
    from repro.matrix.model import Env, Matrix
    from repro.run.gpu_check_device import Device, HostFacts
    from repro.workload.record import RunRecord

# Only the repro step's runs are read here (its whole results.json is checked when a report reads it).
_RUNS_OF = rec_files.Shape((dict,), fields={"runs": shapes.RUNS})


@dataclass(frozen=True)
class GpuCheck:
    env_id: str
    gpus: int
    results: tuple[StepResult, ...]
    folder: Path

    @property
    def ok(self) -> bool:
        return all(r.verdict.ok for r in self.results)

    def text(self) -> str:
        width = max(len(v.value) for v in Verdict)
        lines = [f"gpu-check: env {self.env_id}, {self.gpus} GPU(s): {'PASSED' if self.ok else 'FAILED'}"]
        lines += [f"  {r.verdict.value:<{width}}  {r.kind.value:<16} {r.summary}" for r in self.results]
        return "\n".join(lines)


def choose_env(facts: HostFacts, matrix: Matrix, env_id: str | None) -> Env:
    """The named env, else `cuda` on NVIDIA hosts, else the first ROCm env whose torch wheel has
    kernels for every GPU arch here (MI100/MI200: rocm56; MI300: a ROCm 6 env)."""
    if env_id:
        return matrix.get(env_id)
    platform = facts.get("platform")
    if platform is None:
        raise DeviceUnavailableError(
            "gpu-check found no GPU on this host",
            why="neither `nvidia-smi` nor /sys/class/kfd lists a GPU",
            fix="run it on a GPU host (driver loaded: `nvidia-smi` or `rocminfo` lists the GPUs)",
        )
    envs = [matrix.get(i) for i in matrix.ids()]
    if platform == "cuda":
        return next(e for e in envs if e.platform is compat.Platform.CUDA)
    arches = {str(g.get("arch")) for g in facts.get("gpus") or []}
    rocm = [e for e in envs if e.platform is compat.Platform.ROCM]
    for env in rocm:
        wheel = compat.rocm_wheel_arches(env.torch, env.torch_index)
        if wheel is None or arches <= set(wheel):
            return env
    raise UsageError(f"no ROCm env of the matrix has torch kernels for {', '.join(sorted(arches))}")


class _Runner:
    def __init__(
        self, env: Env, gpus: int, device: Device, folder: Path, matrix: Path, say: Callable[[str], None]
    ) -> None:
        self.env, self.gpus, self.device, self.folder, self.say = env, gpus, device, folder, say
        # `repro` and `check-fix` load the matrix again: the one this check's env came from
        # (MATRIX=), or they would look the env up in env_matrix/envs.toml.
        self.matrix = matrix
        self.prepared: Prepared | None = None

    def run(self, step: Step, facts: HostFacts) -> StepResult:
        kind = step.kind
        if kind is StepKind.HOST:
            return judge.host(facts)
        if kind is StepKind.BUILD:
            self.prepared = self.device.prepare(self.env)
            how = "reused" if self.prepared.reused else "built"
            details = {"venv": self.prepared.handle, "reused": self.prepared.reused, **self.prepared.details}
            return StepResult(kind, Verdict.PROVEN, f"venv {self.prepared.label} ({how})", details)
        if kind is StepKind.RAW_TORCH or kind is StepKind.DS_GATHER:
            return self._probe(step)
        if kind is StepKind.REPRO or kind is StepKind.HIDDEN:
            out = self.folder / kind.value
            args = [*step.cli, "--matrix", str(self.matrix), "--out", str(out)]
            code = self.device.cli(args, step.hide_gpus, step.timeout_s)
            results = out / RESULTS_FILE
            found = rec_files.load(results, _RUNS_OF, "results file") if results.is_file() else {}
            runs = found.get("runs", [])
            if kind is StepKind.HIDDEN:
                return judge.hidden(runs, code)
            return judge.repro(runs, code, self.gpus)
        if kind is StepKind.MICS_SMOKE:
            return self._smoke(step)
        assert_never(kind)

    def _probe(self, step: Step) -> StepResult:
        assert self.prepared is not None
        out = self.folder / f"{step.kind.value}.json"
        code = self.device.probe(self.prepared, step.kind.value, out, step.timeout_s)
        if code != 0 or not out.is_file():
            return StepResult(
                step.kind,
                Verdict.FAILED,
                f"the probe exited {code} (log: {out.with_suffix('.log')})",
                {"exit_code": code},
            )
        facts = rec_files.read(out, "probe facts")
        return judge.raw_torch(facts) if step.kind is StepKind.RAW_TORCH else judge.ds_gather(facts)

    def _smoke(self, step: Step) -> StepResult:
        assert self.prepared is not None
        shape = ds_config.ScenarioShape("mics", 1, 1, False, 1)
        config = ds_config.build_config(shape, dtype="fp16").config  # the GPU default, the reporter's
        records: dict[str, RunRecord | None] = {}  # rank 0's record of each patch
        codes: dict[str, int] = {}
        for patch in ("stock", "fixed"):
            run_dir = safe_write.make_folders(self.folder, f"mics-smoke-{patch}")
            text = json.dumps(config, indent=2) + "\n"
            safe_write.write_file(
                self.folder, f"mics-smoke-{patch}/ds_config.json", text.encode(), replace=True
            )
            argv = ["--run-dir", str(run_dir), "--ds-config", str(run_dir / "ds_config.json")]
            argv += ["--scenario", "mics", "--patch", patch, "--steps", str(STEPS_PER_RUN), "--device", "gpu"]
            codes[patch] = self.device.smoke(self.prepared, argv, run_dir, step.timeout_s / 2)
            record = run_dir / "rank0.json"
            records[patch] = rec_files.read(record, "run record") if record.is_file() else None
        return judge.mics_smoke(records, codes)


def gpu_check(
    folder: Path,
    device: Device,
    matrix: Matrix,
    env_id: str | None = None,
    say: Callable[[str], None] = console.result,
) -> GpuCheck:
    # OUT= new, empty or an earlier gpu-check's: its files never mix with (or overwrite) the user's.
    folder = safe_write.claim_folder(folder, option="OUT", owned_by=(RESULT_FILE,))
    facts = device.host_facts()
    env = choose_env(facts, matrix, env_id)
    gpus = int(facts.get("visible") or 0)
    if gpus < 1:
        raise DeviceUnavailableError(
            f"gpu-check: env {env.id} sees no GPU here",
            why=f"found {len(facts.get('gpus') or [])} GPU(s), *_VISIBLE_DEVICES leave none",
            fix="unset or widen CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES",
        )
    runner = _Runner(env, gpus, device, folder, matrix.path, say)
    done: dict[StepKind, StepResult] = {}
    started_at = utc_now()
    for step in plan_steps(env.id, gpus):
        blocked = [n.value for n in step.needs if n not in done or done[n].verdict is not Verdict.PROVEN]
        say(f"== gpu-check {step.kind.value}: {step.title}")
        started = time.monotonic()
        if blocked:
            result = StepResult(step.kind, Verdict.SKIPPED, f"needs {', '.join(blocked)}", {})
        else:
            try:
                result = runner.run(step, facts)
            except ReproError as exc:  # a typed failure of this step (a build error...) is its verdict
                result = StepResult(step.kind, Verdict.FAILED, exc.what, {"why": exc.why, "fix": exc.fix})
        done[step.kind] = replace(result, duration_s=time.monotonic() - started)
        say(f"   {done[step.kind].verdict.value}: {result.summary}")
    check = GpuCheck(env.id, gpus, tuple(done.values()), folder)
    data = {
        "tool_version": __version__,
        "env": env.id,
        "gpus": gpus,
        "host": facts,
        "started_at": started_at,
        "finished_at": utc_now(),
        "ok": check.ok,
        "steps": [r.to_dict() for r in check.results],
    }
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    safe_write.write_file(folder, RESULT_FILE, text.encode(), replace=True)
    safe_write.write_file(folder, TEXT_FILE, (check.text() + "\n").encode(), replace=True)
    return check
