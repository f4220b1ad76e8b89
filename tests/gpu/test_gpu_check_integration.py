"""gpu-check's in-env probes for real (integration tier): `repro.workload.gpucheck` run by the
cpu and cpu-latest envs' Pythons on gloo with the CPU transport adapter, and the judge reading
what they wrote. The command with its device layer faked is tests/gpu/test_gpu_check.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.run.gpu_check_plan import Verdict


@pytest.mark.integration
@pytest.mark.parametrize("env_id", ["cpu", "cpu-latest"])
def test_probes_run_in_the_env_and_the_judge_reads_them(
    env_id: str, tmp_path: Path, real_subprocess: None
) -> None:
    import os
    import subprocess

    from repro.core.paths import REPO_ROOT
    from repro.run import gpu_check_judge as judge
    from tests.envpython import env_python

    python = env_python(env_id)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    facts = {}
    for probe in ("raw-torch", "ds-gather"):
        out = tmp_path / f"{probe}.json"
        done = subprocess.run(
            [python, "-m", "repro.workload.gpucheck", probe, "--device", "cpu", "--out", str(out)],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        facts[probe] = json.loads(out.read_text())
    raw = judge.raw_torch(facts["raw-torch"])
    assert raw.verdict is Verdict.PROVEN and facts["raw-torch"]["placeholder_type"] == "_IllegalWork"
    ds = judge.ds_gather(facts["ds-gather"])
    assert ds.verdict is Verdict.PROVEN, ds.summary  # stock fails, fixed gathers async and sync
