"""Benchmarks (speed, not correctness): `make bench [ENV=cpu] [ENGINE=venv]`.

Times, for one env with its image/venv already built (warm), in one invocation:
  prepare   reusing the prepared image/venv (should be seconds);
  suite     the full set (control + the three MiCS scenarios, stock and fixed, + the sync proof)
            run end to end by `python -m repro repro`, once per launcher on the same plan:
            torchrun (one torchrun per run: every rank a new interpreter importing torch and
            DeepSpeed) and prefork (ranks forked from one process that imported them once).
            The ratio prefork/torchrun is the figure: absolute seconds depend on the host.
  probe     one bisect/survey probe of the env (`python -m repro probe`: the control and MiCS
            stock, as every bisection and survey step runs them), warm.
  bare      (venv engine) the bare start-up of the same torchrun jobs as the full set, one per
            run with its world size: import torch and DeepSpeed, join a gloo group, leave. The
            warm verdict (the prefork full set) over this is the verdict ratio: what the lab adds
            to the floor that any torchrun job pays.
  hang      (venv engine, CPU envs) a hung probe against a clean one: MiCS with replica groups,
            fixed, torch 2.13.0, DeepSpeed 0.19.3 (commit 02663d6e hangs it) and 0.19.2 (clean),
            each once to build its env, then timed. The hung probe ends when its collectives
            prove a deadlock, so the ratio hung / clean says what a hang costs a bisection.
  commit    with DS_REPO= and DEEPSPEED_COMMIT=: the same probe of a DeepSpeed commit layered from
            its work tree (AXIS=deepspeed-commit), three times after one warm-up; the median.
Figures are printed as a table and appended to results/bench.jsonl with the host facts, so a
change in speed can be traced. Cold figures (fresh machine) come from timing `.ci/run` itself.
Outcomes are compared too, as a sanity line (the parity test, tests/run/test_launcher_parity.py,
is what checks that the launchers agree).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import TypedDict

from repro.core import cmd, console, paths, safe_write
from repro.core.results import HostInfo, host_info, utc_now

REPO = paths.REPO_ROOT
LAUNCHERS = ("torchrun", "prefork")
# The replica-group hang of DeepSpeed 0.19.3 and the release before it (docs/bisect.md).
HANG_PAIR = {"torch": "2.13.0", "clean": "0.19.2", "hung": "0.19.3"}
HANG_PROBE = ["--scenario", "mics-replica", "--patch", "fixed", "--bad-if", "failed"]
# A torchrun job that does nothing but what every job of the suite must: import torch and
# DeepSpeed, join the gloo group, leave.
BARE_JOB = """import deepspeed, torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


# One launcher's full set, in bench.jsonl's `suites`.
class SuiteFigure(TypedDict):
    seconds: float
    exit_code: int
    runs: int
    per_run_s: dict[str, float | None]  # run name -> its total seconds
    world_sizes: list[int]
    outcomes: dict[str, list[str | None]]  # run name -> [outcome, signature]


# The bare start-up of the suite's torchrun jobs, in bench.jsonl's `bare`.
class BareFigure(TypedDict):
    seconds: float
    jobs: int
    exit_codes: list[int]


# One probe of the hang pair: its first (env-building) run and its timed one.
class ProbeFigure(TypedDict):
    first_s: float
    seconds: float
    exit_code: int
    outcome: str | None


# bench.jsonl's `hang`: the clean and the hung probe of HANG_PAIR.
class HangFigure(TypedDict):
    clean: ProbeFigure
    hung: ProbeFigure
    ratio_hung_to_clean: float | None


# One line of results/bench.jsonl (the module's docstring says what each step times).
class Figure(TypedDict):
    at: str
    env: str
    engine: str
    prepare_warm_s: float
    full_suite_s: dict[str, float]  # launcher -> seconds
    ratio_prefork_to_torchrun: float | None
    same_outcomes: bool
    bare_start_s: float | None
    bare: BareFigure | None
    ratio_verdict_to_bare: float | None
    hang: HangFigure | None
    probe_warm_s: float
    probe_exit_code: int
    commit: str | None
    commit_probe_warm_s: list[float]
    commit_probe_median_s: float | None
    suites: dict[str, SuiteFigure]  # launcher -> its full set
    host: HostInfo


def _timed(argv: list[str]) -> tuple[float, int]:
    done = cmd.run(argv, cwd=REPO)
    return done.duration_s, done.returncode


def _suite(base: list[str], env: str, engine: str, launcher: str, out: Path) -> SuiteFigure:
    seconds, code = _timed(
        [*base, "repro", "--env", env, "--engine", engine, "--launcher", launcher, "--out", str(out)]
    )
    runs = json.loads((out / "results.json").read_text())["runs"] if code == 0 else []
    return {
        "seconds": round(seconds, 1),
        "exit_code": code,
        "runs": len(runs),
        "per_run_s": {r["run_name"]: (r.get("durations") or {}).get("total_s") for r in runs},
        "world_sizes": [r.get("world_size") or 2 for r in runs],
        "outcomes": {r["run_name"]: [r.get("outcome"), r.get("signature")] for r in runs},
    }


def _env_python(base: list[str], env: str) -> str | None:
    done = cmd.run([*base, "venv-python", "--env", env], cwd=REPO, capture=True)
    lines = done.stdout.strip().splitlines()
    return lines[-1].strip() if done.returncode == 0 and lines else None


def _bare(python: str, world_sizes: list[int], tmp: Path) -> BareFigure:
    """The bare start-up of one torchrun job per world size, one after the other."""
    script = tmp / "bare_job.py"
    script.write_text(BARE_JOB)
    seconds, codes = 0.0, []
    for size in world_sizes:
        took, code = _timed(
            [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={size}", str(script)]
        )
        seconds += took
        codes.append(code)
    return {"seconds": round(seconds, 1), "jobs": len(world_sizes), "exit_codes": codes}


def _hang(base: list[str], env: str, tmp: Path) -> HangFigure:
    """Clean and hung probe of HANG_PAIR, each run once to build its env, then timed."""
    figures: dict[str, ProbeFigure] = {}
    for name in ("clean", "hung"):
        argv = [*base, "probe", "--env", env, "--engine", "venv", "--torch", HANG_PAIR["torch"]]
        argv += ["--deepspeed", HANG_PAIR[name], *HANG_PROBE]
        first_s, _ = _timed([*argv, "--out", str(tmp / f"hang-{name}-first")])
        seconds, code = _timed([*argv, "--out", str(tmp / f"hang-{name}")])
        outcome = None
        probe_json = tmp / f"hang-{name}" / "probe.json"
        if probe_json.is_file():
            probes = json.loads(probe_json.read_text()).get("probes") or [{}]
            outcome = probes[0].get("outcome")
        figures[name] = {
            "first_s": round(first_s, 1),
            "seconds": round(seconds, 1),
            "exit_code": code,
            "outcome": outcome,
        }
    clean, hung = figures["clean"], figures["hung"]
    ratio = round(hung["seconds"] / clean["seconds"], 2) if clean["seconds"] else None
    return {"clean": clean, "hung": hung, "ratio_hung_to_clean": ratio}


def bench(
    env: str = "cpu",
    engine: str = "venv",
    ds_repo: str | None = None,
    commit: str | None = None,
    hang: bool = True,
) -> int:
    """Time one env's warm build, its full suite under each launcher and a probe; returns the exit
    code of the first failing step, or 0."""
    base = [sys.executable, "-m", "repro"]
    prepare_s, code = _timed([*base, "build", "--env", env, "--engine", engine])
    if code:
        console.error(f"bench: build failed (exit {code})")
        return code
    with tempfile.TemporaryDirectory(prefix="mics-bench-") as tmp:
        suites = {name: _suite(base, env, engine, name, Path(tmp) / name) for name in LAUNCHERS}
        python = _env_python(base, env) if engine == "venv" else None
        sizes = [int(w) for w in suites["torchrun"]["world_sizes"]]
        bare = _bare(python, sizes, Path(tmp)) if python and sizes else None
        hung = _hang(base, env, Path(tmp)) if hang and engine == "venv" else None
        probe_s, probe_code = _timed(
            [*base, "probe", "--env", env, "--engine", engine, "--out", str(Path(tmp) / "probe")]
        )
        commit_runs: list[tuple[float, int]] = []
        if ds_repo and commit:
            probe = [*base, "probe", "--env", env, "--engine", "venv", "--deepspeed-commit", commit]
            probe += ["--ds-repo", ds_repo]
            # The first run may make the layer (a venv) and the work tree: not a warm figure.
            commit_runs = [_timed([*probe, "--out", f"{tmp}/commit{i}"]) for i in range(4)]
        commit_runs = commit_runs[1:]
    slow, fast = suites["torchrun"], suites["prefork"]
    ratio = round(fast["seconds"] / slow["seconds"], 2) if slow["seconds"] else None
    bare_ok = bare is not None and bare["seconds"] and not any(bare["exit_codes"])
    verdict_ratio = round(fast["seconds"] / bare["seconds"], 2) if bare is not None and bare_ok else None
    figure: Figure = {
        "at": utc_now(),
        "env": env,
        "engine": engine,
        "prepare_warm_s": round(prepare_s, 1),
        "full_suite_s": {name: s["seconds"] for name, s in suites.items()},
        "ratio_prefork_to_torchrun": ratio,
        "same_outcomes": slow["outcomes"] == fast["outcomes"],
        "bare_start_s": bare["seconds"] if bare is not None else None,
        "bare": bare,
        # the warm verdict (the prefork full set) over the bare start-up of the same jobs
        "ratio_verdict_to_bare": verdict_ratio,
        "hang": hung,
        # exit 0 good, 1 bad, 125 unknown: all are answers; 128 and up: the probe failed
        "probe_warm_s": round(probe_s, 1),
        "probe_exit_code": probe_code,
        "commit": commit,
        "commit_probe_warm_s": [round(s, 1) for s, _ in commit_runs],
        "commit_probe_median_s": round(statistics.median(s for s, _ in commit_runs), 1)
        if commit_runs
        else None,
        "suites": suites,
        "host": host_info(),
    }
    # One line per bench, appended to the tool's own log; never through a link below results/.
    (REPO / "results").mkdir(exist_ok=True)
    safe_write.append_file(REPO / "results", "bench.jsonl", (json.dumps(figure) + "\n").encode())
    console.result(_table(figure))
    failed = next((s["exit_code"] for s in suites.values() if s["exit_code"]), 0)
    failed = failed or next((code for _, code in commit_runs if code >= 128), 0)
    return failed or (probe_code if probe_code >= 128 else 0)


def _table(figure: Figure) -> str:
    suites = figure["suites"]
    lines = [
        f"bench: env {figure['env']}, engine {figure['engine']}, {figure['host'].get('cpu_count')} CPUs",
        f"  {'step':<44} {'seconds':>8}",
        f"  {'prepare (warm reuse)':<44} {figure['prepare_warm_s']:>8}",
    ]
    for name, data in suites.items():
        what = f"full set, {data['runs']} runs, launcher {name}"
        lines.append(f"  {what:<44} {data['seconds']:>8}")
    lines.append(f"  {'probe (control + mics stock), warm':<44} {figure['probe_warm_s']:>8}")
    if figure["commit_probe_median_s"] is not None:
        what = f"probe of commit {figure['commit']}, warm (median of 3)"
        lines.append(f"  {what:<44} {figure['commit_probe_median_s']:>8}")
    bare = figure["bare"]
    if bare is not None:
        what = f"bare start-up of the same {bare['jobs']} torchrun jobs"
        lines.append(f"  {what:<44} {bare['seconds']:>8}")
    hang = figure.get("hang")
    if hang is not None:
        for name, probe in (("clean", hang["clean"]), ("hung", hang["hung"])):
            what = f"probe {HANG_PAIR[name]} mics-replica fixed ({probe['outcome']})"
            lines.append(f"  {what:<44} {probe['seconds']:>8}")
    lines.append(f"  ratio prefork / torchrun: {figure['ratio_prefork_to_torchrun']}")
    if bare is not None:
        lines.append(f"  ratio warm verdict / bare start-up: {figure['ratio_verdict_to_bare']}")
    if hang is not None:
        lines.append(f"  ratio hung / clean probe: {hang['ratio_hung_to_clean']}")
    same = "same" if figure["same_outcomes"] else "DIFFERENT (see results/bench.jsonl)"
    lines.append(f"  outcomes and signatures under both launchers: {same}")
    lines.append("  appended to results/bench.jsonl")
    return "\n".join(lines)
