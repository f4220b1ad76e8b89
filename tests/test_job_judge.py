"""The custom job's judge (repro/workload/judge.py) on literal log texts of the tools it reads."""

from __future__ import annotations

import math

from repro.workload import judge

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


def _judge(text: str, patch: str = "stock", exit_code: int = 0, **kw: object) -> judge.Judgement:
    return judge.judge(
        judge.parse(text), patch=patch, exit_code=exit_code, status=None, used_deepspeed=True, **kw
    )  # type: ignore[arg-type]


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
    verdict = judge.judge(
        judge.parse(DS_OVERFLOW),
        patch="stock",
        exit_code=0,
        status=None,
        used_deepspeed=True,
        other=fixed,
        other_clean=True,
    )
    assert (verdict.outcome, verdict.signature) == ("reproduced", "overflow-storm")


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
    verdict = judge.judge(
        stock, patch="stock", exit_code=0, status=None, used_deepspeed=True, other=fixed, other_clean=True
    )
    assert (verdict.outcome, verdict.signature, verdict.first_divergent_step) == (
        "reproduced",
        "divergence",
        1,
    )
    # The fixed run is not judged against the stock run: its own evidence decides.
    assert (
        judge.judge(
            fixed,
            patch="fixed",
            exit_code=0,
            status=None,
            used_deepspeed=True,
            other=stock,
            other_clean=False,
        ).outcome
        == "clean"
    )


def test_a_command_without_deepspeed_is_clean_with_a_note() -> None:
    verdict = judge.judge(
        judge.parse("hello\n"), patch="stock", exit_code=0, status=None, used_deepspeed=False
    )
    assert verdict.outcome == "clean" and verdict.notes and "never imported DeepSpeed" in verdict.notes[0]


def test_loss_regex_override_and_hidden_messages_from_the_hook() -> None:
    parsed = judge.parse(
        "it=3 my_loss=0.25\nit=4 my_loss=inf\n", loss_regex=r"it=(?P<step>\d+) my_loss=(?P<loss>\S+)"
    )
    assert (parsed.loss_pattern, parsed.losses, parsed.loss_steps) == ("custom", [0.25, None], [3, 4])
    assert judge.patterns_used(parsed, r"it=(?P<step>\d+) my_loss=(?P<loss>\S+)")["loss"]["name"] == "custom"
    judge.with_hook(parsed, [{"illegal_work_failures": 4}, {"illegal_work_failures": 0}])
    assert parsed.illegal_work_messages == 4
