"""Benchmarks (speed, not correctness): `make bench [ENV=cpu] [ENGINE=venv]`.

Times, for one env with its image/venv already built (warm):
  suite   the full set (control + the three MiCS scenarios, stock and fixed, + the sync proof)
          run by `python -m repro repro` end to end (`python -m repro bench` runs this);
  prepare reusing the prepared image/venv (should be seconds).
Figures are printed and appended to results/bench.jsonl with the host facts, so a change in
speed can be traced. Cold figures (fresh machine) come from timing `.ci/run` itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from repro.core import console, paths
from repro.core.results import host_info, utc_now

REPO = paths.REPO_ROOT


def _timed(argv: list[str]) -> tuple[float, int]:
    start = time.monotonic()
    code = subprocess.run(argv, cwd=REPO).returncode
    return time.monotonic() - start, code


def bench(env: str = "cpu", engine: str = "venv") -> int:
    """Time one env's warm build and full suite; returns the exit code of the failing step, or 0."""
    base = [sys.executable, "-m", "repro"]
    prepare_s, code = _timed([*base, "build", "--env", env, "--engine", engine])
    if code:
        console.error(f"bench: build failed (exit {code})")
        return code
    with tempfile.TemporaryDirectory(prefix="mics-bench-") as tmp:
        suite_s, code = _timed(
            [*base, "repro", "--env", env, "--engine", engine, "--out", str(Path(tmp) / "out")]
        )
        runs = json.loads((Path(tmp) / "out" / "results.json").read_text())["runs"] if code == 0 else []
    figure = {
        "at": utc_now(),
        "env": env,
        "engine": engine,
        "prepare_warm_s": round(prepare_s, 1),
        "full_suite_s": round(suite_s, 1),
        "runs": len(runs),
        "per_run_s": {r["run_name"]: (r.get("durations") or {}).get("total_s") for r in runs},
        "host": host_info(),
        "exit_code": code,
    }
    out = REPO / "results" / "bench.jsonl"
    out.parent.mkdir(exist_ok=True)
    with out.open("a") as fh:
        fh.write(json.dumps(figure) + "\n")
    console.result(json.dumps(figure, indent=2))
    return code
