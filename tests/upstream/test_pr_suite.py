"""Issue #43 item 4: pr-verify runs DeepSpeed's own MiCS tests the way DeepSpeed's CPU CI runs them.

The pure parts (the skip's removal, the flags from REF's workflow, the pytest pins from REF's
requirements, which MiCS tests a tree holds) are checked on texts; the step itself runs on the
DeepSpeed-shaped repository of tests/fixtures/ds_pr_git.py with a stand-in session runner that
answers from the tree it is handed (the REF tree's mics.py still swallows the failed wait), so what
verify.json and PR_DESCRIPTION.md say comes from the trees, not from the stand-in's say-so. The
real sessions on DeepSpeed master are the closing note's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from repro.core.scrub import Scrubber, hand_out
from repro.upstream.pr import fix as pr_fix
from repro.upstream.pr import suite as pr_suite
from repro.upstream.pr.branch import PrRequest, make_pr
from repro.upstream.pr.checks import Stack
from repro.upstream.pr.description import record_from, render
from repro.upstream.pr.suite import SuiteCall, SuiteRow
from repro.upstream.pr.verify import CellCache, Verification
from repro.workload import pytest_outcomes
from tests.fixtures.ds_git import git
from tests.fixtures.ds_pr_git import FakeDeepSpeedPr
from tests.fixtures.pr_verify_standins import (
    STACKS,
    StandInProbe,
    ds,  # noqa: F401 - a fixture
    regression_stand_in,
)

pytestmark = pytest.mark.unit

SKIPPED_MODULE = """import pytest
from unit.common import DistributedTest

if not required_torch_version(max_version=2.0):
    pytest.skip("Skipping until we resolve problems with torch 2.1", allow_module_level=True)


class TestMiCSCheckpoint(DistributedTest):
    world_size = 4
"""
WORKFLOW = """    env:
      DEFAULT_TORCH_PRESET: '2.10.0-cpu'
          case "$selected_preset" in
            '2.9.1-cpu')
              torch_install_version='2.9.1'
              ;;
            '2.10.0-cpu')
              torch_install_version='2.10.0'
              ;;
      - name: Unit tests
        run: |
          cd tests
          HF_HOME=/tmp/hf_home/ pytest $PYTEST_OPTS --forked -n 4 unit/ --torch_ver="$TORCH_TEST_VERSION"
          HF_HOME=/tmp/hf_home/ pytest $PYTEST_OPTS --forked -m 'sequential' unit/ --torch_ver="$X"
"""
REQUIREMENTS = "accelerate\npytest>=7.2.0,<8.4.0\npytest-forked\npytest-randomly\npytest-xdist\nwandb\n"


def test_the_module_level_skip_is_removed_and_named() -> None:
    text, removed = pr_suite.remove_module_skip(SKIPPED_MODULE)
    assert removed is not None and removed.startswith("if not required_torch_version")
    assert "pytest.skip" not in text and "class TestMiCSCheckpoint" in text
    assert pr_suite.remove_module_skip(text) == (text, None)


# The shapes that matter, written for these tests: a helper whose data dtype defaults to
# preferred_dtype() (DeepSpeed #5206 on) or to `fp16=True` (before), and an fp16 test calling it.
HELPER_PREFERRED = """def checkpoint_correctness_verification(config_dict, models, hidden_dim, tmpdir,
                                        load_module_only=False, dtype=None):
    if dtype is None:
        dtype = preferred_dtype()
"""
HELPER_FP16_FLAG = """def checkpoint_correctness_verification(config_dict, models, hidden_dim, tmpdir,
                                        fp16=True):
    dtype = torch.half if fp16 else torch.float32
"""
FP16_TEST = """import deepspeed

from unit.checkpoint.common import *

CONFIG = {"fp16": {"enabled": True, "initial_scale_power": 8}}


def test_a(tmpdir):
    checkpoint_correctness_verification(CONFIG, [], 10, tmpdir,
                                        load_module_only=True)


def test_b(tmpdir):
    checkpoint_correctness_verification(CONFIG, [], 10, tmpdir, dtype=torch.bfloat16)


def test_c(tmpdir):
    checkpoint_correctness_verification(CONFIG, [], 10, tmpdir, load_optimizer_states=True, empty_tag=False)
"""


def test_the_fp16_tests_data_follows_its_config_where_the_helper_would_pick_bf16() -> None:
    import ast

    text, count = pr_suite.align_data_dtype(FP16_TEST, HELPER_PREFERRED)
    assert count == 2 and "import deepspeed\nimport torch\n" in text
    calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)]
    dtypes = [ast.unparse(k.value) for c in calls for k in c.keywords if k.arg == "dtype"]
    assert dtypes == ["torch.float16", "torch.bfloat16", "torch.float16"]  # a test's own dtype stays
    # Past DeepSpeed's 119 columns a call is written as its yapf writes it: one argument a line.
    assert max(len(line) for line in text.splitlines()) <= 119
    pad = " " * len("    checkpoint_correctness_verification(")
    assert f"empty_tag=False,\n{pad}dtype=torch.float16)\n" in text
    # Left alone: a helper that follows `fp16=True`, a test that does not train in fp16.
    assert pr_suite.align_data_dtype(FP16_TEST, HELPER_FP16_FLAG) == (FP16_TEST, 0)
    fp32 = FP16_TEST.replace('"enabled": True', '"enabled": False')
    assert pr_suite.align_data_dtype(fp32, HELPER_PREFERRED) == (fp32, 0)
    assert pr_suite.defaults_to_preferred_dtype(HELPER_PREFERRED)
    assert not pr_suite.defaults_to_preferred_dtype("def checkpoint_correctness_verification(:\n")


def test_flags_and_pins_come_from_ref() -> None:
    flags, source = pr_suite.pytest_flags(WORKFLOW)
    assert flags == ("--forked", "-n", "4") and "at REF" in source
    assert pr_suite.pytest_flags(None)[1].startswith("REF has no")
    packages, source = pr_suite.pytest_packages(REQUIREMENTS)
    assert packages == ("pytest>=7.2.0,<8.4.0", "pytest-forked", "pytest-randomly", "pytest-xdist")
    assert pr_suite.pytest_packages("accelerate\n")[0] == pr_suite.DEFAULT_PACKAGES
    assert pr_suite.torch_ver("2.13.0+cpu") == "2.13"
    assert pr_suite.workflow_torches(WORKFLOW) == {"default": "2.10.0", "presets": ["2.9.1", "2.10.0"]}
    assert pr_suite.workflow_torches(None) == {"default": None, "presets": []}


def test_node_ids_name_only_what_the_tree_holds(tmp_path: Path) -> None:
    (tmp_path / pr_suite.OPTIMIZER_TEST).parent.mkdir(parents=True)
    (tmp_path / pr_suite.OPTIMIZER_TEST).write_text(SKIPPED_MODULE)
    context = tmp_path / "tests/unit/runtime/zero/test_zero_context.py"
    context.parent.mkdir(parents=True)
    context.write_text("class TestZeroGatheredParametersFree:\n    pass\n")
    present, missing = pr_suite.node_ids(tmp_path)
    assert present == ["unit/checkpoint/test_mics_optimizer.py"]
    assert "tests/unit/runtime/zero/test_zero_context.py::TestMiCSGatheredParametersFree" in missing


def test_a_forked_failure_keeps_the_exceptions_own_words() -> None:
    """pytest-forked rebuilds a report whose crash line is only "pool.py:774: RuntimeError"."""

    class Crash:
        message = "/usr/lib/python3.11/multiprocessing/pool.py:774: RuntimeError"

    class Longrepr:
        reprcrash = Crash()

        def __str__(self) -> str:
            return "    raise self._value\nE   RuntimeError: mat1 and mat2 must have the same dtype\n"

    class Report:
        longrepr = Longrepr()

    assert pytest_outcomes._message(Report()) == "RuntimeError: mat1 and mat2 must have the same dtype"


class StandInSession:
    """Answers as DeepSpeed's harness would from the tree: the regression test fails where the
    tree's mics.py swallows the failed wait; the un-skipped optimizer test fails on plain gloo."""

    def __init__(self) -> None:
        self.calls: list[SuiteCall] = []

    def __call__(self, call: SuiteCall) -> dict[str, Any]:
        self.calls.append(call)
        tree = call.tree
        assert "pytest.skip" not in (tree / pr_suite.OPTIMIZER_TEST).read_text()
        assert (tree / str(pr_fix.TEST_REL)).is_file()  # REF's tree holds the branch's test
        # The export has no .git: DeepSpeed's setup.py versions the install from build.txt
        assert (tree / "build.txt").read_text() == f"+{call.commit[:7]}\n"
        assert call.argv[:3] == ("--forked", "-n", "4") and call.argv[-1] == "--torch_ver=" + ".".join(
            call.torch.split(".")[:2]
        )
        swallows = pr_fix.wait_swallows((tree / "deepspeed/runtime/zero/mics.py").read_text())
        regression = "unit/runtime/zero/test_mics_coalesced_wait.py::TestMiCS::test_failed_wait_is_raised"
        optimizer = "unit/checkpoint/test_mics_optimizer.py::TestMiCSCheckpoint::test_load[2]"
        plain_fails = call.transport == "plain"
        tests = {
            regression: {"outcome": "failed" if swallows else "passed", "message": ""},
            optimizer: {
                "outcome": "failed" if plain_fails else "passed",
                "message": "RuntimeError: no coalescing" if plain_fails else "",
            },
        }
        counts: dict[str, int] = {}
        for t in tests.values():
            counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
        return {"outcome": "crashed", "signature": "crash", "reason": "", "counts": counts, "tests": tests}


@pytest.fixture
def made_with_tests(ds: FakeDeepSpeedPr, tmp_path: Path) -> tuple[Path, dict[str, Any]]:  # noqa: F811
    """The fake repository with DeepSpeed's MiCS test, CPU workflow and pins, then `make pr`."""
    for rel, text in (
        (pr_suite.OPTIMIZER_TEST, SKIPPED_MODULE),
        (pr_suite.WORKFLOW, WORKFLOW),
        (pr_suite.REQUIREMENTS_DEV, REQUIREMENTS),
    ):
        (ds.path / rel).parent.mkdir(parents=True, exist_ok=True)
        (ds.path / rel).write_text(text)
    git(ds.path, "add", "-A")
    git(ds.path, "commit", "-q", "-m", "Add the MiCS checkpoint test (#4)")
    out = tmp_path / "pr"
    make_pr(PrRequest(ds_repo=str(ds.path), out=out))
    return out, json.loads((out / "pr.json").read_text())


def verify(
    pr: dict[str, Any],
    out: Path,
    ds: FakeDeepSpeedPr,  # noqa: F811
    cache: CellCache,
    suite: pr_suite.SuiteRunner,
    stacks: Sequence[Stack] = STACKS,
) -> dict[str, Any]:
    """A verification with the stand-in probe and regression runners and the given session runner."""
    return Verification(
        pr, stacks, out, str(ds.path), probe=StandInProbe(pr), regression=regression_stand_in,
        cache=cache, suite=suite,
    ).run()  # fmt: skip


def test_verification_runs_deepspeeds_own_tests_on_both_transports(
    made_with_tests: tuple[Path, dict[str, Any]],
    ds: FakeDeepSpeedPr,  # noqa: F811
    tmp_path: Path,
) -> None:
    out, pr = made_with_tests
    session = StandInSession()
    cache = CellCache("pr-verify", tmp_path / "cache" / "pr-verify")
    data = verify(pr, out, ds, cache, session)

    assert [(c.transport, c.side) for c in session.calls] == [
        ("plain", "ref"), ("plain", "branch"), ("async", "ref"), ("async", "branch"),
    ] * 2  # fmt: skip
    assert {c.packages for c in session.calls} == {pr_suite.pytest_packages(REQUIREMENTS)[0]}
    # REF's requirements bring pytest-randomly: every session is shuffled by one seed, REF's sha
    assert {c.argv[3] for c in session.calls} == {f"--randomly-seed={int(pr['ref_sha'][:8], 16)}"}
    newest = data["suite"][1]
    assert newest["torch"] == "2.13.0" and len(newest["sessions"]) == 4
    assert {t: r["ok"] for t, r in newest["regression"].items()} == {"plain": True, "async": True}
    assert any("skip at ref and branch (`if not required_torch_version" in e for e in newest["edits"])
    builds = f"(+{pr['ref_sha'][:7]}, +{pr['commit'][:7]})"
    assert f"`build.txt` in each tree {builds}: the install's version names its commit" in newest["edits"]
    rows = {r["test"].split("::")[-1]: r["cells"] for r in newest["rows"]}
    assert rows["test_failed_wait_is_raised"]["plain"] == {"ref": "failed", "branch": "passed"}
    assert rows["test_load[2]"]["plain"] == {"ref": "failed", "branch": "failed"}
    assert json.loads((out / "verify.json").read_text())["suite"] == data["suite"]

    text = render(record_from(pr), data)
    assert "## DeepSpeed's own MiCS tests, as its CPU CI runs them" in text
    assert "| torch 2.13.0, plain gloo | torch 2.13.0, lab adapter |" in text
    assert (
        "REF's CPU CI installs torch 2.10.0 by default (presets 2.9.1, 2.10.0); "
        "these sessions ran torch 2.1.0, 2.13.0." in text
    )
    assert "failed → passed" in text and "`RuntimeError: no coalescing`" in text
    assert "regression test fails at REF and passes on the branch in every column." in text
    assert (
        "un-skipped, torch 2.13.0, plain gloo: REF 1 failed (`RuntimeError: no coalescing`); "
        "branch 1 failed (`RuntimeError: no coalescing`)." in text
    )
    assert "un-skipped, torch 2.13.0, lab adapter: REF 1 passed; branch 1 passed." in text

    # Sessions that ran tests are cached: the same commits again run nothing.
    again = StandInSession()
    verify(pr, out, ds, cache, again)
    assert again.calls == []
    assert git(ds.path, "status", "--porcelain") == ""


def test_a_regression_test_that_passes_at_ref_is_said(
    made_with_tests: tuple[Path, dict[str, Any]],
    ds: FakeDeepSpeedPr,  # noqa: F811
    tmp_path: Path,
) -> None:
    out, pr = made_with_tests
    # An interrupted earlier session left its folder: `repro run` never writes over results.
    (out / "verify" / "suite" / "newest-plain-ref").mkdir(parents=True)
    folders = []

    def passes_everywhere(call: SuiteCall) -> dict[str, Any]:
        folders.append(call.out.name)
        test = "unit/runtime/zero/test_mics_coalesced_wait.py::TestMiCS::test_x"
        return {"counts": {"passed": 1}, "tests": {test: {"outcome": "passed", "message": ""}}}

    data = verify(
        pr, out, ds, CellCache("pr-verify", tmp_path / "c" / "pr-verify"), passes_everywhere, STACKS[1:]
    )
    assert folders[:2] == ["newest-plain-ref-2", "newest-plain-branch"]
    said = data["suite"][0]["regression"]["plain"]
    assert said == {"ok": False, "why": "1 of 1 do not fail at REF (TestMiCS::test_x passed)"}
    assert "torch 2.13.0, plain gloo: 1 of 1 do not fail at REF (TestMiCS::test_x passed)." in render(
        record_from(pr), data
    )


def test_a_stopped_session_keeps_what_pytests_output_showed() -> None:
    """A session the lab stopped (a hang past the stall limit) wrote no report: its verbose lines
    say which tests ended how, and which started and never ended."""
    log = (
        "unit/a.py::TestA::test_x \n"
        "unit/b.py::TestB::test_y[2] /usr/lib/python3.11/resource_tracker.py:224: UserWarning: leaked\n"
        "\x1b[36m[gw0]\x1b[0m [ 50%] \x1b[31mFAILED\x1b[0m unit/a.py::TestA::test_x \n"
        "[gw1] [ 60%] SKIPPED unit/c.py::TestC::test_z \n"
        "unit/d.py::TestD::test_w PASSED [ 70%]\n"
        "_______________ TestA.test_x _______________\n"
        "    raise self._value\n"
        "E           RuntimeError: Backend gloo does not implement startCoalescing\n"
        "/usr/lib/python3.11/multiprocessing/pool.py:774: RuntimeError\n"
    )
    got = pr_suite.outcomes_from_log(log)
    assert {t: v["outcome"] for t, v in got.items()} == {
        "unit/a.py::TestA::test_x": "failed",
        "unit/b.py::TestB::test_y[2]": "unfinished",
        "unit/c.py::TestC::test_z": "skipped",
        "unit/d.py::TestD::test_w": "passed",
    }
    assert (
        got["unit/a.py::TestA::test_x"]["message"]
        == "RuntimeError: Backend gloo does not implement startCoalescing"
    )


def test_a_test_pytest_never_reported_is_kept_as_unfinished(tmp_path: Path) -> None:
    """An interrupted pytest reports only the tests that ended: the one that hung is in its output."""
    run = tmp_path / "cpu-latest" / "custom-stock"
    run.mkdir(parents=True)
    ended = {"outcome": "failed", "message": "/usr/lib/pool.py:774: RuntimeError"}
    record = {
        "outcome": "hung",
        "job": {"pytest": {"counts": {"failed": 1}, "tests": {"unit/a.py::T::a": ended}}},
    }
    (tmp_path / "results.json").write_text(
        json.dumps({"schema": 1, "invocation": {}, "envs": {}, "runs": [record]})
    )
    (run / "job.log").write_text(
        "unit/a.py::T::a \nunit/b.py::T::b \n[gw0] [ 50%] FAILED unit/a.py::T::a \n"
        "____ T.a ____\nE   RuntimeError: x\n/usr/lib/pool.py:774: RuntimeError\n"
    )
    seen = pr_suite.read_session(tmp_path)
    assert seen is not None and seen["from_log"] is False
    assert seen["tests"]["unit/a.py::T::a"] == {"outcome": "failed", "message": "RuntimeError: x"}
    assert seen["tests"]["unit/b.py::T::b"]["outcome"] == "unfinished"
    assert seen["counts"] == {"failed": 1, "unfinished": 1}
    assert pr_suite.read_session(tmp_path / "nothing") is None


def test_a_rebuilt_report_without_a_crash_line_keeps_the_exceptions_words() -> None:
    class Longrepr:
        reprcrash = None

        def __str__(self) -> str:
            return "E   RuntimeError: mat1 and mat2\n\n/usr/lib/python3.11/pool.py:774: RuntimeError\n"

    class Report:
        longrepr = Longrepr()

    assert pytest_outcomes._message(Report()) == "RuntimeError: mat1 and mat2"


def test_parameters_that_fared_the_same_share_a_row() -> None:
    from repro.upstream.pr.description import _parametrized_once

    rows = [
        ("u.py::T::test_a[1]", ["failed → passed"]),
        ("u.py::T::test_a[2]", ["failed → passed"]),
        ("u.py::T::test_a[4]", ["passed → passed"]),
        ("u.py::T::test_b", ["failed → failed"]),
    ]
    assert _parametrized_once(rows) == [
        {"test": "u.py::T::test_a[1, 2]", "cells": ["failed → passed"]},
        {"test": "u.py::T::test_a[4]", "cells": ["passed → passed"]},
        {"test": "u.py::T::test_b", "cells": ["failed → failed"]},
    ]


def test_a_session_the_lab_stopped_says_why_beside_the_unskipped_tests(
    made_with_tests: tuple[Path, dict[str, Any]],
) -> None:
    """The branch's un-skipped test deadlocked (shard 2 of world 4 on master): the description
    quotes the lab's own reason for stopping the session, not only a tally."""
    from repro.upstream.pr.description import suite_table

    _, pr = made_with_tests
    optimizer = "unit/checkpoint/test_mics_optimizer.py::TestMiCSCheckpoint"
    reason = "deadlock: ranks 0,1 in all_reduce_coalesced on groups [0,2] #1, [1,3] #1"

    def session(side: str, outcome: str, tests: dict[str, str]) -> dict[str, Any]:
        said = {t: {"outcome": o, "message": ""} for t, o in tests.items()}
        return {"side": side, "transport": "plain", "outcome": outcome, "reason": reason, "tests": said}

    entry = {
        "torch": "2.13.0",
        "sessions": [
            session("ref", "failed", {f"{optimizer}::test_load[4]": "failed"}),
            session(
                "branch",
                "hung",
                {f"{optimizer}::test_load[4]": "passed", f"{optimizer}::test_load[2]": "unfinished"},
            ),
        ],
        "rows": [],
        "upstream_torches": {"default": None, "presets": []},
    }
    verification = {"suite": [entry], "checks": [], "regression": [], "complete": True, "verified": True}
    sides = suite_table(verification)["unskip"][0]["sides"]  # type: ignore[index]
    assert sides["branch"]["stopped"] == reason and sides["ref"]["stopped"] is None
    text = render(record_from(pr), verification)
    said = f"branch 1 passed, 1 unfinished (stopped by the lab, which found `{reason}`)."
    assert said in text
    # As pr-verify hands it out: the reason survives the secrets gate (it read `<secret>` there).
    assert said in hand_out(text, Scrubber.from_host(), "PR_DESCRIPTION.md")


def test_a_session_stopped_on_a_proven_deadlock_is_kept_and_one_stopped_for_silence_is_not() -> None:
    test = {"unit/x.py::T::t[2]": {"outcome": "unfinished", "message": "started, never ended"}}
    deadlock = "deadlock: ranks 0,1 in all_reduce_coalesced on groups [0,2] #1; 8 Python stacks recorded"
    quiet = "no output and no heartbeat for 730 s (stall limit 720 s); 8 Python stacks recorded"
    assert pr_suite.worth_caching({"tests": test, "from_log": False, "outcome": "failed"})
    assert pr_suite.worth_caching({"tests": test, "from_log": True, "outcome": "hung", "reason": deadlock})
    assert not pr_suite.worth_caching({"tests": test, "from_log": True, "outcome": "hung", "reason": quiet})
    assert not pr_suite.worth_caching({"tests": {}, "from_log": False, "outcome": "env-error"})


def test_the_session_key_follows_the_bytes_the_edits_wrote(tmp_path: Path) -> None:
    """The cache key changed when an edit's wording did, not when its written bytes did (session
    17: the dtype edit's formatting changed under one key)."""
    optimizer = tmp_path / pr_suite.OPTIMIZER_TEST
    optimizer.parent.mkdir(parents=True)
    optimizer.write_text("checkpoint_correctness_verification(config, models, dtype=torch.float16)\n")
    call = SuiteCall(
        "cpu", "2.13.0", "ref", "a" * 40, "plain", tmp_path, ("-q",), ("pytest",), tmp_path / "o"
    )
    edits = ["`dtype=torch.float16` given"]
    before = call.key(edits)
    assert call.key(edits) == before
    optimizer.write_text("checkpoint_correctness_verification(\n    config, models, dtype=torch.float16\n)\n")
    assert call.key(edits) != before


def _optimizer_sessions(branch_plain: dict[str, str], branch_async: dict[str, str]) -> list[dict[str, Any]]:
    optimizer = "unit/checkpoint/test_mics_optimizer.py::TestMiCSCheckpoint"

    def session(side: str, transport: str, tests: dict[str, str]) -> dict[str, Any]:
        said = {f"{optimizer}::{t}": {"outcome": o, "message": ""} for t, o in tests.items()}
        return {"side": side, "transport": transport, "outcome": "failed", "reason": "", "tests": said}

    return [
        session("ref", "plain", {"test_load[2]": "failed"}),
        session("branch", "plain", branch_plain),
        session("branch", "async", branch_async),
    ]


def test_the_description_says_whether_the_optimizer_tests_skip_can_go() -> None:
    """Issue #43 item 5: the skip can go only when every un-skipped test passed on the branch on
    plain gloo (upstream's CI) on every torch; a pass on the lab's adapter alone is not enough."""
    from repro.upstream.pr.description import skip_words

    def entry(torch: str, plain: dict[str, str], lab: dict[str, str]) -> dict[str, Any]:
        return {"torch": torch, "sessions": _optimizer_sessions(plain, lab)}

    passed = {"test_load[2]": "passed", "test_load[4]": "passed"}
    one_failed = {"test_load[2]": "passed", "test_load[4]": "failed"}
    can_go = skip_words([entry("2.10.0", passed, one_failed), entry("2.13.0", passed, passed)])
    assert can_go is not None and "supports removing its skip" in can_go and "2.10.0, 2.13.0" in can_go
    stays = skip_words([entry("2.10.0", passed, passed), entry("2.13.0", one_failed, passed)])
    assert stays is not None and "keeps its skip" in stays and "torch 2.13.0: 1 failed, 1 passed" in stays
    assert "2.10.0" not in stays  # only the torches where it did not pass are named
    assert skip_words([entry("2.10.0", {}, passed)]) is None  # the branch ran none on plain gloo


def test_the_regression_verdict_says_which_side_never_started_its_tests() -> None:
    """A stopped session never starts the tests after the hung one (master, plain gloo: the branch
    deadlocked in test_mics_optimizer.py first): the words name the side and how many, not a bare
    "did not run"."""
    test = "unit/runtime/zero/test_mics_coalesced_wait.py::TestMiCSFlatAllGather::test_"
    rows: list[SuiteRow] = [
        {
            "test": test + "a",
            "cells": {"plain": {"ref": "failed"}, "async": {"ref": "failed", "branch": "passed"}},
        },
        {
            "test": test + "b",
            "cells": {"plain": {"ref": "failed"}, "async": {"ref": "failed", "branch": "passed"}},
        },
    ]
    assert pr_suite.regression_words(rows, "plain") == (
        None,
        "not run on both sides (the branch's session never started 2 of 2)",
    )
    assert pr_suite.regression_words(rows, "async") == (True, "all 2 fail at REF and pass on the branch")
    assert pr_suite.regression_words([], "plain") == (None, "no session ran it")
