"""The custom job's judge (repro/workload/judge.py) on literal log texts of the tools it reads."""

from __future__ import annotations

import math

import pytest

from repro.workload import judge, ladder

DS_ILLEGAL = """\
[2024-01-05 10:00:01,000] [INFO] [logging.py:96:log_dist] [Rank 0] WARNING: Runtime Error while waiting \
the collective all-gather, possibly due to the _IllegalWork
[2024-01-05 10:00:01,000] [INFO] [logging.py:96:log_dist] [Rank 0] Error message: Illegal to call wait on \
IllegalWork object
[rank0]:step 0 loss 2.302585
[rank0]:step 1 loss nan
[rank1]:step 1 loss nan
"""

MEGATRON = """\
 iteration        1/      10 | consumed samples:           8 | elapsed time per iteration (ms): 812.3 | \
learning rate: 1.500E-04 | global batch size:     8 | lm loss: 1.096342E+01 | loss scale: 4096.0 | \
grad norm: 5.123 | number of skipped iterations:   0 | number of nan iterations:   0 |
 iteration        2/      10 | consumed samples:          16 | elapsed time per iteration (ms): 790.1 | \
learning rate: 1.500E-04 | global batch size:     8 | loss scale: 2048.0 | \
number of skipped iterations:   1 | number of nan iterations:   0 |
 iteration        3/      10 | consumed samples:          24 | elapsed time per iteration (ms): 790.1 | \
learning rate: 1.500E-04 | global batch size:     8 | lm loss: NAN | loss scale: 1024.0 | \
grad norm: 5.123 | number of skipped iterations:   1 | number of nan iterations:   1 |
"""

HF = """\
{'loss': 2.4512, 'grad_norm': 1.25, 'learning_rate': 5e-05, 'epoch': 0.1}
{'loss': 2.1, 'learning_rate': 4e-05, 'epoch': 0.2}
{'train_runtime': 12.0, 'train_loss': 2.27, 'epoch': 0.2}
"""

DS_OVERFLOW = """\
[2024-01-05 10:00:02,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping \
step. Attempted loss scale: 65536, reducing to 32768
[2024-01-05 10:00:02,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 1 Skipping \
step. Attempted loss scale: 65536, reducing to 32768
[2024-01-05 10:00:03,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping \
step. Attempted loss scale: 32768, reducing to 16384
[2024-01-05 10:00:03,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping \
step. Attempted loss scale: 16384, reducing to 8192
steps: 1 loss: 10.5 iter time (s): 0.5 samples/sec: 16.0
"""

CRASH = """\
step 0 loss 2.30
Traceback (most recent call last):
  File "train.py", line 30, in <module>
    engine.step()
  File "deepspeed/comm/torch.py", line 250, in all_gather_coalesced
    reqs[-1].wait()
ValueError: Illegal to call wait on IllegalWork object
[2024-01-05 10:00:04,000] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1)
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED
"""


def _judge(text: str, patch: str = "stock", exit_code: int = 0, **kw: object) -> ladder.Judgement:
    return judge.judge(
        judge.parse(text), patch=patch, exit_code=exit_code, status=None, used_deepspeed=True, **kw
    )  # type: ignore[arg-type]


def _against(
    parsed: judge.Parsed, other: judge.Parsed, patch: str = "stock", other_clean: bool = True
) -> ladder.Judgement:
    """The judgement of a DeepSpeed run that exited 0 (`parsed`), beside the other patch's run."""
    return judge.judge(
        parsed,
        patch=patch,
        exit_code=0,
        status=None,
        used_deepspeed=True,
        other=other,
        other_clean=other_clean,
    )


def test_deepspeed_illegal_work_messages_and_nan_losses() -> None:
    parsed = judge.parse(DS_ILLEGAL)
    assert parsed.illegal_work_messages == 1
    assert parsed.loss_pattern == "generic"
    assert parsed.losses == [2.302585, None]  # rank 1's copy of step 1 is the same step
    verdict = _judge(DS_ILLEGAL)
    assert (verdict.outcome, verdict.signature, verdict.first_divergent_step) == (
        "reproduced",
        "illegal-work-divergence",
        1,
    )


def test_megatron_losses_skips_and_scales() -> None:
    parsed = judge.parse(MEGATRON)
    assert parsed.loss_pattern == "megatron"
    assert parsed.loss_steps == [1, 3]
    assert parsed.losses[0] is not None and math.isclose(parsed.losses[0], 10.96342)
    assert parsed.losses[1] is None  # NAN
    assert parsed.skipped_steps == 2
    assert parsed.loss_scale == [4096.0, 2048.0, 1024.0]
    assert _judge(MEGATRON).signature == "divergence"  # no IllegalWork message, NaN loss


def test_hf_trainer_losses_without_step_numbers() -> None:
    parsed = judge.parse(HF)
    assert (parsed.loss_pattern, parsed.losses, parsed.loss_steps) == (
        "hf-trainer",
        [2.4512, 2.1],
        [None, None],
    )
    assert _judge(HF).outcome == "clean"


def test_deepspeed_overflow_counts_a_step_once_over_ranks() -> None:
    parsed = judge.parse(DS_OVERFLOW)
    assert parsed.skipped_steps == 3
    assert parsed.loss_scale == [32768.0, 32768.0, 16384.0, 8192.0]
    assert parsed.loss_pattern == "deepspeed-pipe" and parsed.losses == [10.5]


def test_overflow_storm_against_a_clean_fixed_run() -> None:
    fixed = judge.parse("steps: 1 loss: 10.5 iter time (s): 0.5\n")
    verdict = _against(judge.parse(DS_OVERFLOW), fixed)
    # No IllegalWork seen: the storm is not the bug's (a user's job is often not deterministic).
    assert (verdict.outcome, verdict.signature) == ("no-evidence", "overflow-storm")
    assert verdict.reason.startswith("differs, not the bug's path: 3 overflow-skipped steps vs 0")
    assert judge.NOISE_HINT in verdict.reason
    # With the hook's IllegalWork count beside it, the same storm is the bug's.
    counted = judge.with_hook(judge.parse(DS_OVERFLOW), [{"deepspeed": "0.13.1", "illegal_work_failures": 4}])
    verdict = _against(counted, fixed)
    assert (verdict.outcome, verdict.signature) == ("reproduced", "illegal-work-divergence")


def test_crash_raised_from_illegal_work_wins_over_the_launchers_traceback() -> None:
    parsed = judge.parse(CRASH)
    assert parsed.exception is not None and parsed.exception["type"] == "ValueError"
    assert parsed.illegal_work_messages == 0  # the exception's own text is not a log message
    verdict = _judge(CRASH, exit_code=1)
    assert (verdict.outcome, verdict.signature) == ("reproduced", "illegal-work-crash")


def test_other_crash_env_error_hang_and_unsupported() -> None:
    other = "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'a'\n"
    assert _judge(other, exit_code=1).outcome == "crashed"
    assert _judge("bash: torchrunn: command not found\n", exit_code=127).outcome == "env-error"
    assert _judge("ModuleNotFoundError: No module named 'deepspeed'\n", exit_code=1).outcome == "env-error"
    hung = judge.judge(judge.parse(""), patch="stock", exit_code=-9, status="hung", used_deepspeed=True)
    assert (hung.outcome, hung.signature) == ("hung", "hang")
    unsupported = _judge("", patch="fixed", fix_error="no deepspeed.runtime.zero.mics")
    assert unsupported.outcome == "unsupported"


def test_stock_losses_that_part_from_the_clean_fixed_run() -> None:
    stock = judge.parse("step 0 loss 2.0\nstep 1 loss 2.5\n")
    fixed = judge.parse("step 0 loss 2.0\nstep 1 loss 1.5\n")
    verdict = _against(stock, fixed)
    # Losses that part without any IllegalWork: they differ, but not by the bug.
    assert (verdict.outcome, verdict.signature, verdict.first_divergent_step) == (
        "no-evidence",
        "divergence",
        1,
    )
    assert verdict.reason.startswith(
        "differs, not the bug's path: losses part from the fixed run's at step 1"
    )
    # The fixed run is not judged against the stock run: its own evidence decides.
    assert _against(fixed, stock, patch="fixed", other_clean=False).outcome == "clean"


def test_a_command_without_deepspeed_is_no_evidence() -> None:
    verdict = judge.judge(
        judge.parse("hello\n"), patch="stock", exit_code=0, status=None, used_deepspeed=False
    )
    assert (verdict.outcome, verdict.reason) == ("no-evidence", f"exit code 0; {judge.NEVER_IMPORTED}")


def test_loss_regex_override_and_hidden_messages_from_the_hook() -> None:
    parsed = judge.parse(
        "it=3 my_loss=0.25\nit=4 my_loss=inf\n", loss_regex=r"it=(?P<step>\d+) my_loss=(?P<loss>\S+)"
    )
    assert (parsed.loss_pattern, parsed.losses, parsed.loss_steps) == ("custom", [0.25, None], [3, 4])
    assert judge.patterns_used(parsed, r"it=(?P<step>\d+) my_loss=(?P<loss>\S+)")["loss"]["name"] == "custom"
    judge.with_hook(parsed, [{"illegal_work_failures": 4}, {"illegal_work_failures": 0}])
    assert parsed.illegal_work_messages == 4


PORT_TAKEN = """\
[W socket.cpp:436] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in \
use).
[E socket.cpp:472] [c10d] The server socket has failed to listen on any local network address.
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
RuntimeError: The server socket has failed to listen on any local network address. The server socket has \
failed to bind to [::]:29500 (errno: 98 - Address already in use).
"""

NCCL_ON_CPU = """\
[2024-01-05 10:00:00,000] [INFO] [real_accelerator.py:161:get_accelerator] Setting ds_accelerator to cuda
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/deepspeed/comm/torch.py", line 112, in init_process_group
RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!
"""


def _one(log: str, *, patch: str, exit_code: int, used: bool, device: str = "gpu") -> ladder.Judgement:
    return judge.judge(
        judge.parse(log), patch=patch, exit_code=exit_code, status=None, used_deepspeed=used, device=device
    )


def test_a_taken_rendezvous_port_is_an_env_error_not_a_crash() -> None:
    for patch in ("stock", "fixed"):
        got = _one(PORT_TAKEN, patch=patch, exit_code=1, used=True)
        assert (got.outcome, got.signature) == ("env-error", "none")
        assert "rendezvous port is in use" in got.reason and "29500" in got.reason


def test_no_hooked_deepspeed_import_is_an_env_error_where_the_hook_was_needed() -> None:
    # The fixed run never got the fix: whatever it did says nothing about the fix.
    got = _one(NCCL_ON_CPU, patch="fixed", exit_code=1, used=False)
    assert got.outcome == "env-error" and judge.NO_HOOKED_DEEPSPEED in got.reason
    assert got.reason.startswith("the fix could not be applied")
    got = _one(NCCL_ON_CPU.splitlines()[0] + "\n", patch="fixed", exit_code=0, used=False)
    assert got.outcome == "env-error"  # ran DeepSpeed to the end unhooked: still not the fix's run
    # A CPU stock run that used DeepSpeed unhooked never had the CPU shims.
    got = _one(NCCL_ON_CPU, patch="stock", exit_code=1, used=False, device="cpu")
    assert got.outcome == "env-error" and got.reason.startswith("the CPU shims could not be installed")
    # Where the hook was not needed, or reached DeepSpeed, the usual verdicts stand.
    assert _one(NCCL_ON_CPU, patch="stock", exit_code=1, used=False, device="gpu").outcome == "crashed"
    assert _one(NCCL_ON_CPU, patch="fixed", exit_code=1, used=True).outcome == "crashed"
    plain = _one("hello\n", patch="fixed", exit_code=0, used=False)
    assert plain.outcome == "no-evidence" and "never imported DeepSpeed" in plain.reason


def _hf(losses: list[float]) -> str:
    return "".join(
        f"{{'loss': {v}, 'learning_rate': 5e-05, 'epoch': {i / 10}}}\n" for i, v in enumerate(losses)
    )


def test_the_reason_says_where_evidence_came_from_when_the_log_hides_it() -> None:
    """HF Trainer: DeepSpeed's logger at WARNING (no IllegalWork line in the log; the hook counted
    them) and a NaN loss logged as 0.0 (logging_nan_inf_filter)."""
    from repro.run.job import RawRun, build_records

    def raw(patch: str, losses: list[float], counted: int) -> RawRun:
        report = {"deepspeed": "0.13.1", "illegal_work_failures": counted, "engine": {"dtype": "bf16"}}
        job = {"exit_code": 0, "status": None, "hook_reports": [report], "device": "cpu"}
        return RawRun(patch, job, _hf(losses), None)

    stock, fixed = build_records(
        "cpu",
        [raw("stock", [2.45, 0.0, 0.0, 0.0], 366), raw("fixed", [2.45, 2.1, 1.9, 1.7], 0)],
        None,
        "x",
        60.0,
    )
    assert (stock["outcome"], stock["illegal_work_messages"]) == ("reproduced", 366)
    assert "IllegalWork messages counted by the hook: 366 (the job's log shows 0;" in stock["reason"]
    assert "NaN losses logged as 0.0 from step 1" in stock["reason"]
    assert stock["job"] is not None and fixed["job"] is not None
    assert (stock["job"]["illegal_work_by_hook"], stock["job"]["illegal_work_in_log"]) == (366, 0)
    assert stock["job"]["nan_logged_as_zero_from"] == 1 and fixed["job"]["nan_logged_as_zero_from"] is None
    assert "counted by the hook" not in fixed["reason"] and "0.0" not in fixed["reason"]
    # A log that shows its messages and real zero losses in both runs: nothing to explain.
    assert judge.nan_logged_as_zero([1.0, 0.0], [1.0, 0.0], None) is None
    assert judge.nan_logged_as_zero([1.0, 0.0, 0.5], [1.0, 0.9, 0.8], 1) is None  # not 0.0 to the end
    # The first parted step may still be a number (a halved loss), the zeros follow: from there.
    assert judge.nan_logged_as_zero([2.77, 0.0, 0.0], [5.55, 5.54, 5.57], 0) == 1


LOST_WORK_CRASH = (
    "Traceback (most recent call last):\n"
    '  File "/v/deepspeed/comm/torch.py", line 241, in all_gather_coalesced\n'
    "    with get_coalescing_manager(group, input_tensors[0].device, reqs, async_op):\n"
    '  File "/v/torch/distributed/distributed_c10d.py", line 2041, in _coalescing_manager\n'
    "    work.wait()\n"
    "AttributeError: 'NoneType' object has no attribute 'wait'\n"
    "Traceback (most recent call last):\n"
    '  File "/v/bin/torchrun", line 8, in <module>\n'
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED\n"
)


def test_crash_on_the_lost_coalesced_work_is_the_bug_in_a_users_job() -> None:
    verdict = _judge(LOST_WORK_CRASH, exit_code=1)
    assert (verdict.outcome, verdict.signature) == ("reproduced", "lost-work-crash")


# accelerate's port check in a container whose /etc/hosts is empty: the job dies before DeepSpeed.
NO_LOCALHOST = """\
Traceback (most recent call last):
  File "/venv/bin/accelerate", line 8, in <module>
    sys.exit(main())
  File "/venv/lib/python3.11/site-packages/accelerate/utils/other.py", line 230, in is_port_in_use
    return s.connect_ex(("localhost", port)) == 0
socket.gaierror: [Errno -3] Temporary failure in name resolution
"""


def test_an_early_failure_is_the_same_outcome_stock_and_fixed_and_its_exception_is_named() -> None:
    """A job that dies before importing DeepSpeed failed the same way whatever the patch: both runs
    are `crashed` with the exception named; no hint about -S or the hook's .pth (the hook was not
    missing from a process that imported DeepSpeed: none did)."""
    runs = {
        patch: _one(NO_LOCALHOST, patch=patch, exit_code=1, used=False, device="cpu")
        for patch in ("stock", "fixed")
    }
    for got in runs.values():
        assert (got.outcome, got.signature) == ("crashed", "crash")
        assert "socket.gaierror: [Errno -3] Temporary failure in name resolution" in got.reason
        assert judge.NO_HOOKED_DEEPSPEED not in got.reason and "-S" not in got.reason


@pytest.mark.parametrize(
    ("last", "kind", "message"),
    [
        ("KeyError: 'input_ids'", "KeyError", "'input_ids'"),
        ("KeyboardInterrupt", "KeyboardInterrupt", ""),
        ("ssl.SSLError: [SSL] bad", "ssl.SSLError", "[SSL] bad"),
        ("SystemExit: 2", "SystemExit", "2"),
        # accelerate 0.30.1 without transformers, under zero3_init_flag
        (
            "Exception: When `zero3_init_flag` is set, it requires",
            "Exception",
            "When `zero3_init_flag` is set, it requires",
        ),
    ],
)
def test_any_exception_line_ends_a_traceback(last: str, kind: str, message: str) -> None:
    log = f'Traceback (most recent call last):\n  File "t.py", line 1, in <module>\n    f()\n{last}\n'
    exc = judge.parse(log).exception
    assert exc is not None and (exc["type"], exc["message"]) == (kind, message)


def test_a_ranks_own_output_inside_anothers_traceback_is_not_its_exception() -> None:
    log = (
        'Traceback (most recent call last):\n  File "t.py", line 1, in <module>\n'
        "loss: 2.3\nEpoch: 1\nValueError: bad\n"
    )
    exc = judge.parse(log).exception
    assert exc is not None and (exc["type"], exc["message"]) == ("ValueError", "bad")
