"""Issue #30 (first slice), the pure parts of `make pr`: which lines call the changed function, where
the fix does not apply, and PR_DESCRIPTION.md rendered from a record alone (no git, no process)."""

from __future__ import annotations

import pytest

from repro.upstream.pr import fix as pr_fix
from repro.upstream.pr.description import TORCH_REFS, code, render
from repro.upstream.pr.fix import Caller, CallerKind
from repro.upstream.pr.record import FileStat, PrRecord
from tests.fixtures.ds_pr_git import MICS, MICS_EARLY, TORCH

SHA = "edaa7221267243c7be7fb49c5d5f5c4fb97b4641"
# `git grep -n -w all_gather_coalesced edaa72212 -- deepspeed/` on DeepSpeed master (Aug 2026), cut.
GREP = "\n".join(
    f"{SHA}:{line}"
    for line in (
        "deepspeed/comm/comm.py:637:def all_gather_coalesced(outs, ins, group=None):",
        "deepspeed/comm/comm.py:641:    return cdb.all_gather_coalesced(outs, ins, group=group)",
        "deepspeed/comm/torch.py:287:    def all_gather_coalesced(self, outs, ins, group=None):",
        "deepspeed/runtime/zero/mics.py:181:    # record existing all_gather_coalesced implementation",
        "deepspeed/runtime/zero/mics.py:183:    old_all_gather_coalesced = param.all_gather_coalesced",
        "deepspeed/runtime/zero/mics.py:240:    handle = dist.all_gather_coalesced(outs,",
        "deepspeed/runtime/zero/mics.py:286:    dist.all_gather_coalesced(outs, ins, async_op=False)",
        "deepspeed/runtime/zero/mics.py:308:    handle = dist.all_gather_coalesced(intra_outputs,",
        "deepspeed/runtime/zero/partition_parameters.py:1512:    def all_gather_coalesced(params,",
        "deepspeed/runtime/zero/partition_parameters.py:1527:        all_gather_coalesced(group_params)",
        "deepspeed/runtime/zero/partitioned_param_coordinator.py:609:    h = p[0].all_gather_coalesced(g)",
    )
)


def test_only_the_mics_lines_call_deepspeed_comms_function() -> None:
    callers = pr_fix.parse_grep(GREP, SHA)
    calls = [(c.path, c.line) for c in callers if c.kind is CallerKind.CALL]
    assert calls == [("deepspeed/runtime/zero/mics.py", n) for n in (240, 286, 308)]
    kinds = {(c.path, c.line): c.kind for c in callers}
    assert kinds[("deepspeed/comm/comm.py", 641)] is CallerKind.FORWARD
    # ZeRO-3's own function of that name calling itself is not a caller of deepspeed.comm's.
    assert kinds[("deepspeed/runtime/zero/partition_parameters.py", 1527)] is CallerKind.SAME_NAME
    assert kinds[("deepspeed/runtime/zero/partition_parameters.py", 1512)] is CallerKind.SAME_NAME
    assert kinds[("deepspeed/comm/torch.py", 287)] is CallerKind.DEFINITION
    assert pr_fix.callers_outside_mics(callers) == ()


def test_a_bare_call_counts_where_the_file_imports_it_from_deepspeed_comm() -> None:
    grep = (
        f"{SHA}:deepspeed/moe/x.py:3:from deepspeed.comm import all_gather_coalesced\n"
        f"{SHA}:deepspeed/moe/x.py:9:    all_gather_coalesced(a, b, async_op=True)\n"
        f"{SHA}:not-a-line-number\n"
    )
    callers = pr_fix.parse_grep(grep, SHA)
    assert [c.kind for c in callers] == [CallerKind.IMPORT, CallerKind.CALL]
    assert [c.path for c in pr_fix.callers_outside_mics(callers)] == ["deepspeed/moe/x.py"]


def test_the_fix_that_does_not_apply_is_named_with_file_and_line() -> None:
    with pytest.raises(pr_fix.FixDoesNotApplyError) as err:
        pr_fix.changed_files({"deepspeed/comm/torch.py": TORCH, "deepspeed/runtime/zero/mics.py": MICS_EARLY})
    assert (
        "deepspeed/runtime/zero/mics.py" in err.value.why and "MiCS_AllGatherCoalescedHandle" in err.value.why
    )
    broken = TORCH.replace("class TorchBackend:", "class TorchBackend(:")
    with pytest.raises(pr_fix.FixDoesNotApplyError) as err:
        pr_fix.changed_files({"deepspeed/comm/torch.py": broken, "deepspeed/runtime/zero/mics.py": None})
    line = TORCH.splitlines().index("class TorchBackend:") + 1
    assert f"deepspeed/comm/torch.py:{line}: does not parse" in err.value.why
    assert "deepspeed/runtime/zero/mics.py: the file does not exist at REF" in err.value.why
    renamed = TORCH.replace("def all_gather_coalesced", "def all_gather_many")
    with pytest.raises(pr_fix.FixDoesNotApplyError) as err:
        pr_fix.changed_files({"deepspeed/comm/torch.py": renamed, "deepspeed/runtime/zero/mics.py": MICS})
    cls_line = TORCH.splitlines().index("class TorchBackend:") + 1
    assert f"deepspeed/comm/torch.py:{cls_line}:" in err.value.why and "all_gather_coalesced" in err.value.why


def test_the_swallowing_try_is_seen_in_the_stock_handle_and_gone_after_the_fix() -> None:
    assert pr_fix.wait_swallows(MICS)
    fixed = pr_fix.changed_files({"deepspeed/comm/torch.py": TORCH, "deepspeed/runtime/zero/mics.py": MICS})
    assert not pr_fix.wait_swallows(fixed["deepspeed/runtime/zero/mics.py"])


def _record(callers: tuple[Caller, ...], swallowed: bool = True) -> PrRecord:
    return PrRecord(
        ref="master",
        ref_sha=SHA,
        branch="mics-coalesced-wait",
        commit="1" * 40,
        subject="Wait on the coalescing manager's work in MiCS all-gathers",
        author="Pat <pat@example.invalid>",
        fix_id="abc",
        changed=("deepspeed.comm.torch.TorchBackend.all_gather_coalesced",),
        files=(FileStat("deepspeed/comm/torch.py", 21, 4), FileStat("deepspeed/runtime/zero/mics.py", 3, 10)),
        test_path=str(pr_fix.TEST_REL),
        patch_file="0001-x.patch",
        swallowed_before=swallowed,
        callers=callers,
        worktree=None,
        checkout_untouched=True,
    )


def test_the_description_answers_each_upstream_point_from_the_record() -> None:
    text = render(_record(pr_fix.parse_grep(GREP, SHA)))
    for ref in TORCH_REFS:
        assert ref.url() in text
    assert "2 files, +24 -14" in text
    points = ("Fix shape", "gloo without coalescing", "AVAILABLE after a failed collective", "Non-MiCS jobs")
    for point in points:
        assert f"**{point}.**" in text
    assert "3 call site(s)" in text and "Jobs that do\nnot use MiCS do not reach the changed code" in text
    assert "removes that `try`" in text
    assert "pytest tests/unit/runtime/zero/test_mics_coalesced_wait.py" in text


def test_the_description_names_other_callers_when_there_are_some() -> None:
    other = Caller("deepspeed/moe/x.py", 9, "dist.all_gather_coalesced(a, b)", CallerKind.CALL)
    text = render(_record((other,), swallowed=False))
    assert "`deepspeed/moe/x.py:9`" in text and "Jobs that do" not in text
    assert "removes that `try`" not in text


@pytest.mark.parametrize("kind", [CallerKind.CALL, CallerKind.SAME_NAME])
def test_a_caller_line_cannot_break_out_of_its_code_block(kind: CallerKind) -> None:
    hostile = Caller("deepspeed/x.py", 1, "x = '```\n# injected heading'", kind)
    text = render(_record((hostile,)))
    if kind is CallerKind.CALL:
        # one line, in a code span whose fence is longer than the backticks inside: no heading escapes
        assert "````x = '``` # injected heading'````" in text
    else:
        # a line that is no call is named by its place alone
        assert "or a comment: `deepspeed/x.py:1`" in text and "injected" not in text
    assert not any(line.startswith("# injected") for line in text.splitlines())
    assert code("a`b") == "``a`b``" and code("`x") == "`` `x ``"


def test_the_description_of_a_master_verification_on_seven_torches_stays_short() -> None:
    """#43 item 7: DeepSpeed master's record (15 `git grep` lines) verified on seven torches with
    DeepSpeed's own tests reads in at most 150 lines, each line of `git grep` named once."""
    from repro.core.scrub import Scrubber, hand_out
    from tests.fixtures import pr_master_sized as master

    text = render(master.record(), master.verification())
    assert len(text.splitlines()) <= 150, len(text.splitlines())
    for caller in master.CALLERS:
        assert text.count(f"`{caller.path}:{caller.line}`") == 1, caller
    judged = ", ".join(master.TORCHES[1:])
    for key, ref in (("mics", "reproduced (illegal-work-divergence)"), ("mics@plain", "crashed (crash)")):
        assert f"| `{key}` | {judged} | {ref} | clean (none) | yes |" in text
    assert f"| regression test | {judged} | 4 failed | 4 passed | yes |" in text
    assert f"- `mics`, `mics-hier`, `zero3`, torch {master.OLD_TORCH}: not applicable" in text
    assert f"(torch {judged}, flat MiCS, 4 ranks): REF crashed" in text
    assert f"ZeRO-3 control (torch {judged}): clean at REF, clean on the branch" in text
    # the hung session's reason reaches the text handed out
    assert "which found `deadlock: ranks 0,1 in all_reduce_coalesced" in hand_out(
        text, Scrubber.from_host(), "PR_DESCRIPTION.md"
    )


def test_torches_share_a_row_only_where_they_agree() -> None:
    from repro.upstream.pr.description import by_torch, unexpected

    def check(key: str, torch: str, ok: bool | None, ref: str = "reproduced") -> dict[str, object]:
        seen = {"outcome": ref, "signature": "none", "reason": "r"}
        return {"key": key, "torch": torch, "ok": ok, "why": "w", "ref": seen, "branch": seen}

    rows = by_torch(
        [check("mics", "2.7.1", True), check("mics", "2.8.0", True, "clean"), check("mics", "2.9.1", True)],
        lambda c: (c["ref"]["outcome"],),
    )
    assert [(r["torches"], r["first"]["ref"]["outcome"]) for r in rows] == [
        ("2.7.1, 2.9.1", "reproduced"),
        ("2.8.0", "clean"),
    ]
    # not applicable for mics on two torches, for zero3 on one: no line claims zero3 on 2.7.1
    lines = unexpected(
        {
            "checks": [
                check("mics", "2.1.0", None),
                check("mics", "2.7.1", None),
                check("zero3", "2.1.0", None),
            ]
        }
    )
    assert [(u["keys"], u["torches"]) for u in lines] == [(["mics"], "2.1.0, 2.7.1"), (["zero3"], "2.1.0")]


def test_the_words_do_not_depend_on_the_order_of_verify_jsons_keys() -> None:
    """`make pr-verify` renders from the run's data, a later rerender from verify.json (keys
    sorted): a tally or a list read in dict order came out in another order the second time."""
    from typing import Any

    from tests.fixtures import pr_master_sized as master

    def reversed_keys(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: reversed_keys(value[k]) for k in reversed(list(value))}
        return [reversed_keys(v) for v in value] if isinstance(value, list) else value

    data = master.verification()
    assert render(master.record(), data) == render(master.record(), reversed_keys(data))


def test_a_session_the_lab_stopped_says_so_once() -> None:
    """A failure without pytest's words in a session the lab stopped: the lab's reason is the why,
    not a second "(stopped before pytest printed why)" beside it (seen on the master run)."""
    from tests.fixtures import pr_master_sized as master

    data = master.verification()
    for session in data["suite"][0]["sessions"]:
        if session["outcome"] == "hung":
            first = next(iter(session["tests"]))
            session["tests"][first] = {"outcome": "failed", "message": ""}
    text = render(master.record(), data)
    stopped = [line for line in text.splitlines() if "stopped by the lab, which found `deadlock:" in line]
    assert stopped and not any("stopped before pytest printed why) (stopped by the lab" in s for s in stopped)
