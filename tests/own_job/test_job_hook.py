"""The interpreter-start hook and the in-env job runner, with real processes of the host Python
(no torch needed): inert unless asked; a command without DeepSpeed is judged clean with a note;
a deadlocked command ends hung with every process's stack and no survivors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from repro.run.job import RawRun, build_records
from repro.workload import job
from tests.fixtures.job_main import job_argv, run_gpu_job

PROBE = textwrap.dedent("""\
    import builtins, json, sys
    print(json.dumps({"hook": "repro.workload.jobhook" in sys.modules,
                      "deepspeed": "deepspeed" in sys.modules,
                      "own_sitecustomize": getattr(builtins, "own_sitecustomize_ran", False)}))
""")


def _fake_deepspeed(root: Path) -> Path:
    pkg = root / "site" / "deepspeed"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.0.fake'\n")
    # The env's own sitecustomize, which the hook's shadows: it must still run.
    (root / "site" / "sitecustomize.py").write_text(
        "import builtins\nbuiltins.own_sitecustomize_ran = True\n"
    )
    return root / "site"


def _python(code: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_hook_is_inert_unless_asked(tmp_path: Path, real_subprocess: None) -> None:
    site = _fake_deepspeed(tmp_path)
    job_dir = tmp_path / "job"
    base = {k: v for k, v in os.environ.items() if not k.startswith("MICS_REPRO_")}
    asked = job.hook_environment(
        base, patch="fixed", device="gpu", transport="async", job_dir=str(job_dir), user_pythonpath=str(site)
    )
    not_asked = dict(asked)
    del not_asked["MICS_REPRO_HOOK"]
    # Not asked: the hook module is never imported, nothing is written, and an import of
    # DeepSpeed gets the module untouched (no fix attempted, so no report either).
    seen = _python(PROBE + "import deepspeed\n", not_asked, tmp_path)
    assert seen == {"hook": False, "deepspeed": False, "own_sitecustomize": True}
    assert not job_dir.exists()
    # Asked, but the command never imports DeepSpeed: the hook does not import it either.
    assert _python(PROBE, asked, tmp_path) == {"hook": True, "deepspeed": False, "own_sitecustomize": True}
    assert list((job_dir / "hook").iterdir()) == []  # only DeepSpeed users report
    assert len(list((job_dir / "pids").iterdir())) == 1
    # Asked and DeepSpeed imported: the hook acts (here the fake has nothing to patch: the fix
    # reports why, and the process goes on).
    _python("import deepspeed\nprint('{}')", asked, tmp_path)
    reports = [json.loads(p.read_text()) for p in (job_dir / "hook").iterdir()]
    assert len(reports) == 1 and reports[0]["deepspeed"] == "0.0.fake" and reports[0]["fix_error"]


def _run_job(tmp_path: Path, command: str, stall: float = 300.0) -> dict[str, object]:
    return run_gpu_job(tmp_path, command, stall=str(stall), timeout="600")


def test_command_without_deepspeed_runs_and_is_no_evidence(tmp_path: Path, real_subprocess: None) -> None:
    result = _run_job(tmp_path, f"{sys.executable} -c \"print('hello from the job')\"")
    assert result["exit_code"] == 0 and result["status"] is None
    text = (tmp_path / "out" / job.JOB_LOG).read_text()
    assert "hello from the job" in text
    [record] = build_records(
        "cpu", [RawRun("stock", result, text, "cpu/custom-stock/job.log")], None, "sha256:x", 600.0
    )
    assert (record["outcome"], record["scenario"]) == ("no-evidence", "custom")
    assert "never imported DeepSpeed" in record["reason"] and "no evidence either way" in record["reason"]


DEADLOCK = textwrap.dedent("""\
    import subprocess, sys, threading
    child = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
    print("child", child.pid, flush=True)
    lock = threading.Lock(); lock.acquire(); lock.acquire()
""")


@pytest.mark.parametrize("stall", [2.0])
def test_deadlocked_command_ends_hung_with_stacks_and_no_survivors(
    tmp_path: Path, real_subprocess: None, stall: float
) -> None:
    script = tmp_path / "deadlock.py"
    script.write_text(DEADLOCK)
    result = _run_job(tmp_path, f"{sys.executable} {script}", stall=stall)
    assert result["status"] == "hung"
    stacks = result["stacks"]
    assert isinstance(stacks, dict) and len(stacks) == 2  # the script and its child
    assert any("deadlock.py" in text for text in stacks.values())
    assert result["survivors"] == []
    processes = result["processes"]
    assert isinstance(processes, dict)
    for pid in processes:
        assert not job.alive(int(pid))
    text = (tmp_path / "out" / job.JOB_LOG).read_text()
    [record] = build_records("cpu", [RawRun("stock", result, text, None)], None, "sha256:x", 600.0)
    assert (record["outcome"], record["signature"]) == ("hung", "hang")
    assert record["stacks"] == stacks


FAKE_PY_SPY = """#!/bin/sh
echo "Thread 0x1 (idle): MainThread"
echo "    wait (threading.py:320) pid $3"
"""


@pytest.mark.parametrize("with_py_spy", [True, False])
def test_python_the_hook_cannot_reach_gets_py_spy_or_is_named(
    tmp_path: Path, real_subprocess: None, monkeypatch: pytest.MonkeyPatch, with_py_spy: bool
) -> None:
    """A child started with `python -I` ignores PYTHONPATH, so no hook: py-spy (when the env has
    it; a stand-in here) dumps its stack, else the record names it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if with_py_spy:
        (bin_dir / "py-spy").write_text(FAKE_PY_SPY)
        (bin_dir / "py-spy").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    script = tmp_path / "isolated.py"
    script.write_text(DEADLOCK.replace('[sys.executable, "-c"', '[sys.executable, "-I", "-c"'))
    result = _run_job(tmp_path, f"{sys.executable} {script}", stall=2.0)
    assert result["status"] == "hung" and result["survivors"] == []
    stacks = result["stacks"]
    assert isinstance(stacks, dict)
    spied = [pid for pid, text in stacks.items() if text.startswith("(py-spy dump)")]
    hooked = result["processes"]
    assert isinstance(hooked, dict) and len(hooked) == 1  # the script; its -I child is not hooked
    if with_py_spy:
        assert len(spied) == 1 and spied[0] not in hooked and f"pid {spied[0]}" in stacks[spied[0]]
    else:
        assert not spied and "the hook did not reach" in str(result["hang_detail"])


# What DeepSpeed prints when it is imported, so the log shows DeepSpeed at work.
FAKE_DS_INIT = (
    "print('[INFO] [real_accelerator.py:161:get_accelerator] Setting ds_accelerator to cuda', flush=True)\n"
    "__version__ = '0.0.fake'\n"
)


@pytest.mark.parametrize("pth", [True, False])
def test_a_job_that_replaces_pythonpath_is_still_hooked(
    tmp_path: Path, real_subprocess: None, pth: bool
) -> None:
    """`CMD="env PYTHONPATH=deps python ..."` drops the hook's folder from PYTHONPATH; the .pth the
    runner writes into the env's site-packages still hooks the process. Without it the fixed run
    is env-error (the fix was never applied), not a verdict on the fix."""
    venv = tmp_path / "envvenv"  # stands in for the env's venv: the runner writes into its site-packages
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    deps = tmp_path / "deps" / "deepspeed"
    deps.mkdir(parents=True)
    (deps / "__init__.py").write_text(FAKE_DS_INIT)
    out = tmp_path / "out"
    command = f"env PYTHONPATH={tmp_path / 'deps'} python -c 'import deepspeed, sys; print(sys.executable)'"
    argv = [
        str(venv / "bin" / "python"),
        "-m",
        "repro.workload.job",
        *job_argv(tmp_path, command, "--patch", "fixed", "--device", "gpu"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MICS_REPRO_", "PYTHON"))}
    env["PYTHONPATH"] = str(Path(job.REPO_ROOT))  # the runner's own import of repro, as the engines do
    if pth:
        env["MICS_REPRO_HOOK_PTH"] = "1"  # as the engines ask for it
    subprocess.run(argv, env=env, check=True, cwd=tmp_path)
    result = json.loads((out / job.JOB_JSON).read_text())
    text = (out / job.JOB_LOG).read_text()
    assert result["exit_code"] == 0 and str(venv / "bin" / "python") in text
    [record] = build_records("cpu", [RawRun("fixed", result, text, None)], None, "sha256:x", 600.0)
    if pth:
        [report] = result["hook_reports"]
        assert report["deepspeed"] == "0.0.fake" and report["patch"] == "fixed"
        assert "fix" in report or "fix_error" in report  # the fix was attempted in that process
        assert record["outcome"] == "unsupported"  # the fake has nothing to patch: said so
        assert result["hook_pth"].startswith(str(venv)) and Path(result["hook_pth"]).is_file()
    else:
        assert result["hook_reports"] == [] and result["hook_pth"] is None
        assert (record["outcome"], record["signature"]) == ("env-error", "none")
        assert "the fix could not be applied: no hooked process imported DeepSpeed" in record["reason"]


PORTS = (
    "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('MASTER_PORT', 'PET_MASTER_PORT')}))"
)


def test_each_run_gets_a_free_rendezvous_port_unless_the_command_sets_one(
    tmp_path: Path, real_subprocess: None
) -> None:
    import socket

    holder = socket.socket()
    try:  # another torchrun on this host: 29500 is taken (if something else already holds it, fine)
        holder.bind(("127.0.0.1", 29500))
        holder.listen()
    except OSError:
        pass
    try:
        result = _run_job(tmp_path, f'{sys.executable} -c "{PORTS}"')
        seen = json.loads((tmp_path / "out" / job.JOB_LOG).read_text().strip().splitlines()[-1])
        port = result["rendezvous"]
        assert isinstance(port, dict) and port["set_by"] == "repro"
        assert seen == {"MASTER_PORT": str(port["port"]), "PET_MASTER_PORT": str(port["port"])}
        assert port["port"] != 29500
        # The command names its own port: it keeps it, and nothing is added.
        own = tmp_path / "own"
        own.mkdir()
        result = _run_job(own, f'MASTER_PORT=29511 {sys.executable} -c "{PORTS}"')
        seen = json.loads((own / "out" / job.JOB_LOG).read_text().strip().splitlines()[-1])
        assert result["rendezvous"] == {"port": None, "set_by": "job"}
        assert seen == {"MASTER_PORT": "29511", "PET_MASTER_PORT": None}
    finally:
        holder.close()
