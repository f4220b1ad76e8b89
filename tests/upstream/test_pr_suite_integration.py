"""pr-verify's DeepSpeed-harness session for real (issue #43 item 4): pr_suite.front_door_session
runs a DeepSpeed-shaped tree's tests as DeepSpeed's CPU CI does (`cd tests && python -m pytest
--forked ...`, DeepSpeed's pytest pin < 8.4 and pytest-forked installed into a job layer, the tree's
own `deepspeed/` first on sys.path through its tests/conftest.py), once on plain gloo (no lab
adapter, as upstream's CI) and once on the lab's adapter, through `python -m repro run` on torch
2.1 and DeepSpeed 0.13.1. The test module is tests/fixtures/ds_harness_job.py's (4 ranks in a
forkserver Pool, MiCS fp16), inside pytest-forked's forked child.

What must hold: each session's record names the one test id with pytest's outcome, the plain
session ran without the adapter and the adapter session with it, and on the adapter the stock
tree shows the bug (IllegalWork counted by the hook), and each session's DeepSpeed was pip-installed
from the tree into a layer (`--deepspeed-src`), the job's packages in a layer over that one. DeepSpeed's
real tests on master are the closing note's (minutes per session).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from repro.upstream.pr import suite as pr_suite
from repro.upstream.pr.suite import SuiteCall
from tests.envpython import env_python
from tests.fixtures.ds_harness_job import TEST_NAME, installed_deepspeed, write_harness_project

pytestmark = pytest.mark.integration

# DeepSpeed's tests/conftest.py does the same: the checkout's root first on sys.path.
CONFTEST = "import os, sys\nsys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\n"
# What `pip install .` needs of the tree (DeepSpeed's own setup.py needs its op builders); the local
# version label shows that the layer's DeepSpeed is the tree's, not the env's release.
TREE_VERSION = "0.13.1+labtree"
SETUP = """from setuptools import find_packages, setup

setup(
    name="deepspeed",
    version=open("version.txt").read().strip(),
    packages=find_packages(include=["deepspeed", "deepspeed.*"]),
    package_data={"deepspeed": ["**/*"]},
)
"""


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[SuiteCall, dict[str, Any]]]:
    python = env_python("cpu")  # skips (or fails in CI) when the env's venv is not built
    package = installed_deepspeed(python)
    tree = tmp_path_factory.mktemp("ds-tree")
    write_harness_project(tree / "tests", None)
    (tree / "tests" / "conftest.py").write_text(CONFTEST)
    # DeepSpeed's tests/pytest.ini makes tests/ pytest's rootdir (else setup.py would: ids "tests/...")
    (tree / "tests" / "pytest.ini").write_text("[pytest]\n")
    shutil.copytree(package, tree / "deepspeed", ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "setup.py").write_text(SETUP)
    (tree / "version.txt").write_text(TREE_VERSION + "\n")
    out = tmp_path_factory.mktemp("suite")
    seen = {}
    for transport in pr_suite.TRANSPORTS:
        call = SuiteCall(
            env="cpu", torch="2.1.0", side="ref", commit="0" * 40, transport=transport, tree=tree,
            argv=("--forked", "-p", "no:cacheprovider", TEST_NAME, "-q"),
            packages=("pytest>=7.2.0,<8.4.0", "pytest-forked"), out=out / transport,
        )  # fmt: skip
        seen[transport] = (call, pr_suite.front_door_session(call))
    return seen


def _record(call: SuiteCall) -> dict[str, Any]:
    return dict(json.loads((call.out / "results.json").read_text())["runs"][0])


def test_each_session_names_its_test_with_pytests_outcome(sessions: dict[str, Any]) -> None:
    for transport, (call, seen) in sessions.items():
        assert list(seen["tests"]) == [f"{TEST_NAME}::test_mics_fp16"], (transport, seen)
        outcome = seen["tests"][f"{TEST_NAME}::test_mics_fp16"]["outcome"]
        assert outcome in ("passed", "failed") and seen["counts"] == {outcome: 1}, seen
        record = _record(call)
        assert record["versions"]["torch"].startswith("2.1.") and record["transport"] == transport
        assert "--forked" in record["job"]["command"] and record["patch"] == "stock"


def _adapters(call: SuiteCall) -> list[bool]:
    """For each hooked process that set up DeepSpeed's CPU side: whether it installed the adapter."""
    hooks = [json.loads(p.read_text()) for p in Path(call.out).glob("*/custom-stock/job/hook/*.json")]
    return [h["transport_info"].get("adapter") is not None for h in hooks if h.get("transport_info")]


def test_plain_runs_without_the_adapter_and_the_adapter_shows_the_bug(sessions: dict[str, Any]) -> None:
    plain_call, _ = sessions["plain"]
    adapter_call, adapter = sessions["async"]
    plain, lab = _adapters(plain_call), _adapters(adapter_call)
    assert plain and not any(plain), "a plain session's hooked process installed the adapter"
    assert lab and all(lab), "an adapter session's hooked process ran without it"
    assert _record(plain_call)["transport"] == "plain"
    assert adapter["illegal_work_messages"] and adapter["illegal_work_messages"] > 0, adapter
    assert adapter["outcome"] == "reproduced", adapter["reason"]


def test_each_session_ran_on_deepspeed_installed_from_the_tree(sessions: dict[str, Any]) -> None:
    for transport, (call, _) in sessions.items():
        env = json.loads((call.out / "results.json").read_text())["envs"]["cpu"]
        label = env["venv"]
        # the job layer over the checkout's layer, which holds the tree's build (SourceOverlay's label)
        assert "the job's packages over" in label and "+dssrc-" in label, (transport, label)
        assert f"DeepSpeed {TREE_VERSION} from {call.tree}" in label, (transport, label)
        assert env["job_layer"]["added"].get("pytest"), (transport, env["job_layer"])
