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
  commit    with DS_REPO= and DEEPSPEED_COMMIT=: the same probe of a DeepSpeed commit layered from
            its work tree (AXIS=deepspeed-commit), three times after one warm-up; the median.
Figures are printed as a table and appended to results/bench.jsonl with the host facts, so a
change in speed can be traced. Cold figures (fresh machine) come from timing `.ci/run` itself.
Outcomes are compared too, as a sanity line (the parity test, tests/test_launcher_parity.py,
is what checks that the launchers agree).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from repro.core import cmd, console, paths, safe_write
from repro.core.results import host_info, utc_now

REPO = paths.REPO_ROOT
LAUNCHERS = ("torchrun", "prefork")


def _timed(argv: list[str]) -> tuple[float, int]:
    done = cmd.run(argv, cwd=REPO)
    return done.duration_s, done.returncode


def _suite(base: list[str], env: str, engine: str, launcher: str, out: Path) -> dict[str, Any]:
    seconds, code = _timed(
        [*base, "repro", "--env", env, "--engine", engine, "--launcher", launcher, "--out", str(out)]
    )
    runs = json.loads((out / "results.json").read_text())["runs"] if code == 0 else []
    return {
        "seconds": round(seconds, 1),
        "exit_code": code,
        "runs": len(runs),
        "per_run_s": {r["run_name"]: (r.get("durations") or {}).get("total_s") for r in runs},
        "outcomes": {r["run_name"]: [r.get("outcome"), r.get("signature")] for r in runs},
    }


def bench(
    env: str = "cpu", engine: str = "venv", ds_repo: str | None = None, commit: str | None = None
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
        probe_s, probe_code = _timed(
            [*base, "probe", "--env", env, "--engine", engine, "--out", str(Path(tmp) / "probe")]
        )
        commit_runs: list[tuple[float, int]] = []
        if ds_repo and commit:
            source = ["--deepspeed-commit", commit, "--ds-repo", ds_repo]
            # The first run may make the layer (a venv) and the work tree: not a warm figure.
            for i in range(4):
                commit_runs.append(
                    _timed(
                        [
                            *base,
                            "probe",
                            "--env",
                            env,
                            "--engine",
                            "venv",
                            *source,
                            "--out",
                            f"{tmp}/commit{i}",
                        ]
                    )
                )
        commit_runs = commit_runs[1:]
    slow, fast = suites["torchrun"], suites["prefork"]
    ratio = round(fast["seconds"] / slow["seconds"], 2) if slow["seconds"] else None
    figure = {
        "at": utc_now(),
        "env": env,
        "engine": engine,
        "prepare_warm_s": round(prepare_s, 1),
        "full_suite_s": {name: s["seconds"] for name, s in suites.items()},
        "ratio_prefork_to_torchrun": ratio,
        "same_outcomes": slow["outcomes"] == fast["outcomes"],
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


def _table(figure: dict[str, Any]) -> str:
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
    lines.append(f"  ratio prefork / torchrun: {figure['ratio_prefork_to_torchrun']}")
    same = "same" if figure["same_outcomes"] else "DIFFERENT (see results/bench.jsonl)"
    lines.append(f"  outcomes and signatures under both launchers: {same}")
    lines.append("  appended to results/bench.jsonl")
    return "\n".join(lines)
