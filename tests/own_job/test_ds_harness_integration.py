"""DeepSpeed's own test harness on the CPU twin (issue #43, item 2): a pytest module that runs its
MiCS test as DeepSpeed's `DistributedTest` does (tests/fixtures/ds_harness_job.py: 4 ranks in a
forkserver Pool, fp16 only if the accelerator supports it, skipped unless it counts 4 devices),
through `make run ENV=cpu PACKAGES=pytest` on torch 2.1 and DeepSpeed 0.13.1. On a 2-core host
the session gets 8 devices, fp16 through the Half kernels adapter, a current stream for 0.13.1's
no-gather handle; every rank of the Pool signs its record; pytest's own report is compared per
test. (The same as measured with DeepSpeed's own test_mics_optimizer.py: docs/own-job.md.)
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.envpython import env_python
from tests.fixtures.classifier_job import run_job
from tests.fixtures.ds_harness_job import (
    COMMAND,
    TEST_NAME,
    WORLD,
    installed_deepspeed,
    write_harness_project,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def harness_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, dict[str, Any]]]:
    python = env_python("cpu")  # skips (or fails in CI) when the env's venv is not built
    package = installed_deepspeed(python)
    project = write_harness_project(tmp_path_factory.mktemp("harness-project"), package)
    out = tmp_path_factory.mktemp("harness-job") / "results"
    stdout, results = run_job(project, out, COMMAND, "PACKAGES=pytest")
    return stdout, {r["patch"]: r for r in results["runs"]}


Runs = tuple[str, dict[str, dict[str, Any]]]


def test_every_test_runs_in_fp16_on_enough_devices(harness_runs: Runs) -> None:
    _, runs = harness_runs
    ids = {f"{TEST_NAME}::test_mics_fp16"}
    for record in runs.values():
        session = record["job"]["pytest"]
        assert set(session["tests"]) == ids, session
        assert session["counts"].get("skipped", 0) == 0 and session["ran"] == 1, session
        assert session["harness_devices"] >= WORLD
        assert record["dtype"] == "fp16" and record["world_size"] == WORLD
        assert record["versions"]["torch"].startswith("2.1.") and record["versions"]["deepspeed"] == "0.13.1"
        assert record["transport_info"]["cpu_shims"]["fp16_claimed"] is True
        assert not record["job"]["notes"] or not any("forged" in n for n in record["job"]["notes"])


def test_stock_reproduces_and_every_test_passes_with_the_fix(harness_runs: Runs) -> None:
    stdout, runs = harness_runs
    stock, fixed = runs["stock"], runs["fixed"]
    # each rank of each test's Pool counted its own IllegalWork messages and signed its record
    assert stock["outcome"] == "reproduced" and stock["illegal_work_messages"] > 0, stock["reason"]
    assert fixed["outcome"] == "clean" and fixed["illegal_work_messages"] == 0, fixed["reason"]
    assert fixed["job"]["pytest"]["counts"] == {"passed": 1}, fixed["job"]["pytest"]
    assert "pytest: 1 passed" in fixed["reason"]
    assert "cpu (your command): REPRODUCED; fix resolves it" in stdout


def test_the_fix_goes_to_the_deepspeed_the_tests_import_from_their_own_tree(harness_runs: Runs) -> None:
    """As in a DeepSpeed checkout: the project's deepspeed/ shadows the env's, the fix is applied to
    it, and the record says so (the IllegalWork counted came from that tree's code)."""
    _, runs = harness_runs
    fixed = runs["fixed"]
    assert (
        fixed["fix"]["package_dir"].endswith("/deepspeed")
        and "harness-project" in fixed["fix"]["package_dir"]
    )
    assert any(
        "applied to the DeepSpeed the job imports from its own folder (deepspeed/" in n
        for n in fixed["job"]["notes"]
    )
