"""Outcome classification: every branch, driven by literal records."""

from __future__ import annotations

from typing import Any

import pytest

from repro.workload import classify as cls
from repro.workload import ladder
from repro.workload.record import OUTCOMES, SIGNATURES, empty_record

CONTROL_LOSSES = [4.0, 3.5, 3.1, 2.8]


def control(**kw: Any) -> dict[str, Any]:
    rec = empty_record(
        scenario="zero3",
        patch="stock",
        dtype="fp32",
        run_name="zero3-stock-fp32-async-w4",
        losses=list(CONTROL_LOSSES),
        exit_codes={"launcher": 0, "0": 0},
    )
    rec.update(kw)
    verdict = cls.classify(rec, None)
    rec.update(outcome=verdict.outcome, signature=verdict.signature)
    return rec


def run(**kw: Any) -> dict[str, Any]:
    rec = empty_record(
        scenario="mics",
        patch="stock",
        dtype="fp32",
        losses=list(CONTROL_LOSSES),
        exit_codes={"launcher": 0, "0": 0, "1": 0},
    )
    rec.update(kw)
    return rec


def test_control_is_clean_when_finite() -> None:
    c = control()
    assert (c["outcome"], c["signature"]) == ("clean", "none")


def test_control_with_nan_is_crashed() -> None:
    c = control(losses=[4.0, None, None, None])
    assert c["outcome"] == "crashed"


def test_matching_run_is_clean() -> None:
    v = cls.classify(run(), control())
    assert (v.outcome, v.signature, v.first_divergent_step) == ("clean", "none", None)


def test_illegal_work_and_nan_is_reproduced_with_divergence() -> None:
    v = cls.classify(run(losses=[None] * 4, illegal_work_messages=336), control())
    assert (v.outcome, v.signature, v.first_divergent_step) == ("reproduced", "illegal-work-divergence", 0)
    assert "336 IllegalWork messages" in v.reason


def test_illegal_work_but_matching_losses_is_warnings_only() -> None:
    v = cls.classify(run(illegal_work_messages=12, transport="sync"), control())
    assert (v.outcome, v.signature) == ("reproduced", "illegal-work-warnings")


def test_divergence_without_messages() -> None:
    v = cls.classify(run(losses=[4.0, 3.5, 3.3, 2.9]), control())
    assert (v.outcome, v.signature, v.first_divergent_step) == ("reproduced", "divergence", 2)


def test_within_tolerance_is_not_divergence() -> None:
    v = cls.classify(run(losses=[4.0, 3.5 + 1e-6, 3.1, 2.8]), control())
    assert v.outcome == "clean"


def test_shorter_run_diverges_where_it_stops() -> None:
    assert cls.first_divergent_step([1.0, 2.0], [1.0, 2.0, 3.0], "fp32") == 2


def test_crash_from_illegal_work() -> None:
    exc = {
        "type": "RuntimeError",
        "message": "Illegal to call wait on IllegalWork object",
        "rank": 1,
        "traceback": "...",
    }
    v = cls.classify(run(scenario="mics-hier", exception=exc, losses=[]), control())
    assert (v.outcome, v.signature) == ("reproduced", "illegal-work-crash")
    assert "rank 1" in v.reason


def test_other_crash() -> None:
    exc = {"type": "AssertionError", "message": "boom", "rank": 0, "traceback": "..."}
    v = cls.classify(run(exception=exc), control())
    assert (v.outcome, v.signature) == ("crashed", "crash")


def test_nonzero_exit_without_exception_is_crash() -> None:
    v = cls.classify(run(exit_codes={"launcher": 1}), control())
    assert v.outcome == "crashed"


def test_fp16_overflow_storm() -> None:
    c = control(dtype="fp16", skipped_steps=1)
    v = cls.classify(run(dtype="fp16", skipped_steps=1 + ladder.OVERFLOW_STORM_EXTRA), c)
    assert (v.outcome, v.signature) == ("reproduced", "overflow-storm")
    v2 = cls.classify(run(dtype="fp16", skipped_steps=2), c)
    assert v2.outcome == "clean"


def test_storm_with_illegal_work_counts_as_divergence_signature() -> None:
    c = control(dtype="fp16", skipped_steps=0)
    v = cls.classify(run(dtype="fp16", skipped_steps=10, illegal_work_messages=5), c)
    assert v.signature == "illegal-work-divergence"


@pytest.mark.parametrize(
    "status,outcome,signature",
    [
        ("hung", "hung", "hang"),
        ("interrupted", "interrupted", "none"),
        ("unsupported", "unsupported", "none"),
        ("env-error", "env-error", "none"),
    ],
)
def test_runner_status_decides(status: str, outcome: str, signature: str) -> None:
    v = cls.classify(run(illegal_work_messages=3), control(), status)
    assert (v.outcome, v.signature) == (outcome, signature)


def test_no_usable_control_nan_is_reproduced() -> None:
    broken = control(losses=[None] * 4)
    v = cls.classify(run(losses=[None] * 4), broken)
    assert v.outcome == "reproduced" and "no usable control" in v.reason


def test_results_stay_in_closed_sets() -> None:
    cases = [run(), run(losses=[None] * 4, illegal_work_messages=1), run(exit_codes={"x": 2})]
    for case in cases:
        v = cls.classify(case, control())
        assert v.outcome in OUTCOMES and v.signature in SIGNATURES


LOST_WORK_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/v/deepspeed/comm/torch.py", line 241, in all_gather_coalesced\n'
    "    with get_coalescing_manager(group, input_tensors[0].device, reqs, async_op):\n"
    '  File "/usr/lib/python3.11/contextlib.py", line 144, in __exit__\n'
    "    next(self.gen)\n"
    '  File "/v/torch/distributed/distributed_c10d.py", line 2041, in _coalescing_manager\n'
    "    work.wait()\n"
    "AttributeError: 'NoneType' object has no attribute 'wait'\n"
)


def test_crash_on_the_lost_coalesced_work_is_the_bug() -> None:
    # torch 2.3 on NCCL (and the twin modelling it) loses the block's work: DeepSpeed's synchronous
    # hierarchical gather dies in torch's manager before it reaches the _IllegalWork.
    exc = {
        "type": "AttributeError",
        "message": "'NoneType' object has no attribute 'wait'",
        "rank": 0,
        "traceback": LOST_WORK_TRACEBACK,
    }
    v = cls.classify(run(scenario="mics-hier", exception=exc, losses=[]), control())
    assert (v.outcome, v.signature) == ("reproduced", "lost-work-crash")
    assert "pytorch#122807" in v.reason


def test_the_same_attribute_error_elsewhere_is_another_crash() -> None:
    exc = {
        "type": "AttributeError",
        "message": "'NoneType' object has no attribute 'wait'",
        "rank": 0,
        "traceback": LOST_WORK_TRACEBACK.replace("_coalescing_manager", "my_loop"),
    }
    v = cls.classify(run(scenario="mics-hier", exception=exc, losses=[]), control())
    assert (v.outcome, v.signature) == ("crashed", "crash")


def test_one_ladder_decides_for_suite_runs_and_own_jobs() -> None:
    """The outcome thresholds and the divergence rule are defined once (ladder.py): the suite's
    classifier and the own-job judge take them from there and keep no copy of their own."""
    import ast
    from pathlib import Path

    from repro.workload import judge

    root = Path(cls.__file__).parent
    for name in ("classify.py", "judge.py"):
        tree = ast.parse((root / name).read_text())
        assigned = {
            t.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        assert not assigned & {"OVERFLOW_STORM_EXTRA"}, name
        literal_tolerance = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "TOLERANCE" for t in node.targets)
            and not isinstance(node.value, ast.Attribute)
        ]
        assert not literal_tolerance, f"{name} defines its own TOLERANCE"
    assert judge.TOLERANCE == max(ladder.TOLERANCE.values())
    # The same evidence gets the same rung from both: IllegalWork and losses that part.
    record = {"scenario": "mics", "dtype": "bf16", "losses": [None, None], "illegal_work_messages": 4}
    suite = cls.classify(record, {"outcome": "clean", "losses": [1.0, 0.9], "skipped_steps": 0})
    own = judge.parse("step 0 loss: nan\nstep 1 loss: nan\n")
    own.illegal_work_messages = 4
    fixed = judge.parse("step 0 loss: 1.0\nstep 1 loss: 0.9\n")
    job = judge.judge(
        own, patch="stock", exit_code=0, status=None, used_deepspeed=True, other=fixed, other_clean=True
    )
    assert (
        (suite.outcome, suite.signature, suite.first_divergent_step)
        == (
            job.outcome,
            job.signature,
            job.first_divergent_step,
        )
        == ("reproduced", "illegal-work-divergence", 0)
    )
