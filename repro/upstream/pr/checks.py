"""What the lab runs to verify a `make pr` branch at its commit, and what each result must be.

Pure: the plan, the expectations and their judgement. repro/upstream/pr/verify.py runs the plan
(probes of REF and of the branch commit, both stock, through the commit layers of
AXIS=deepspeed-commit) and the regression test.

A check passes when:
- `fixes`: REF shows the bug (an IllegalWork crash, warnings or divergence) and the branch is clean;
- `fixes-refusal`: on gloo as torch ships it (TRANSPORT=plain), REF crashes with the backend's
  "does not implement startCoalescing" refusal and the branch is clean;
- `unchanged`: the ZeRO-3 control is clean at REF and on the branch.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from repro.core.runs import RunFinding, finding_of
from repro.core.walk_files import ProbeRow
from repro.workload.closed import assert_never
from repro.workload.record import Outcome

REFUSAL = "does not implement startCoalescing"


class Expect(enum.Enum):
    FIXES = "fixes"
    FIXES_REFUSAL = "fixes-refusal"
    UNCHANGED = "unchanged"

    @property
    def words(self) -> str:
        if self is Expect.FIXES:
            return "REF shows the bug, the branch is clean"
        if self is Expect.FIXES_REFUSAL:
            return "REF crashes on the backend's refusal to coalesce, the branch is clean"
        if self is Expect.UNCHANGED:
            return "clean at REF and on the branch"
        assert_never(self)


@dataclass(frozen=True)
class Stack:
    """A torch the branch is verified with: an env of the matrix (torch pinned there), or one
    derived from it with another torch ("cpu-latest+torch2.10.0")."""

    name: str  # "reporter", "newest", or "torch<version>" for a torch REF's CI installs
    env: str
    torch: str
    role: str = ""  # which checks run on it (Check.stacks); empty: the name says
    suite: bool = True  # DeepSpeed's own tests run on it too (pr_suite: a long step)

    @property
    def kind(self) -> str:
        return self.role or self.name


# A stack of a torch that REF's CPU CI installs (a preset of its workflow): the newest's checks.
UPSTREAM_CI = "upstream-ci"


@dataclass(frozen=True)
class Check:
    scenario: str
    transport: str
    expect: Expect
    stacks: tuple[str, ...]  # the Stack.kind values it runs on

    @property
    def key(self) -> str:
        return self.scenario if self.transport == "async" else f"{self.scenario}@{self.transport}"


# Plain gloo only with the newest torch: on torch 2.1 gloo has no _allgather_base, so even
# ZeRO-3 cannot start there (docs/upstream.md) and the stack says nothing about the fix.
CHECKS: tuple[Check, ...] = (
    Check("mics", "async", Expect.FIXES, ("reporter", "newest", UPSTREAM_CI)),
    Check("mics-hier", "async", Expect.FIXES, ("reporter", "newest", UPSTREAM_CI)),
    Check("zero3", "async", Expect.UNCHANGED, ("reporter", "newest", UPSTREAM_CI)),
    Check("mics", "plain", Expect.FIXES_REFUSAL, ("newest", UPSTREAM_CI)),
)

# Which checks exercise which function of mics.py, by the scenario's config: flat gather
# (`mics_hierarchical_params_gather: false`) or hierarchical (`true`). The callers table of
# PR_DESCRIPTION.md shows, for each call site, the checks of the function that holds it.
FUNCTION_SCENARIOS: Mapping[str, tuple[str, ...]] = {
    "_flat_all_gather_with_coalescing_manager": ("mics", "mics@plain"),
    "_hierarchical_all_gather_params": ("mics-hier",),
}


@dataclass(frozen=True)
class Seen:
    """One probe's outcome as pr_verify reads it from probe.json."""

    outcome: str
    signature: str
    reason: str
    seconds: float

    @classmethod
    def from_probe(cls, probe: ProbeRow) -> Seen:
        return cls(
            str(probe.get("outcome", "")),
            str(probe.get("signature", "")),
            str(probe.get("reason", "")),
            float(probe.get("seconds") or 0.0),
        )

    @property
    def finding(self) -> RunFinding | None:
        return finding_of(self.outcome, self.signature)

    def short(self) -> str:
        return f"{self.outcome} ({self.signature})"


NO_IMPORT = "does not import"


# An env-error that is still a result about the DeepSpeed and torch probed: DeepSpeed was installed
# and importing it failed (a commit layer's import check, or the run's own ImportError), which a
# rerun would only repeat. Every other env-error (a failed pip step: the network, the index; a
# suite that wrote no record) says nothing about them and may pass another time.
_IMPORT_FAILED = (NO_IMPORT, "environment: ImportError", "environment: ModuleNotFoundError")
_INSTALL_FAILED = ("pip step", "BuildError")


def stopped_before_running(seen: Seen) -> bool:
    """An env-error from importing or installing DeepSpeed: the probe never ran its scenario."""
    said = (*_IMPORT_FAILED, *_INSTALL_FAILED, "ImportError")
    return seen.outcome == "env-error" and any(words in seen.reason for words in said)


def is_result(probe: ProbeRow) -> bool:
    """Whether a probe's outcome is what the probe found (worth caching), not a failure to get
    there (install failure, interruption): only results are cached, the rest is tried again."""
    seen = Seen.from_probe(probe)
    finding = seen.finding
    if finding is None:
        return False
    if finding is not RunFinding.NO_OUTCOME:
        return True
    return (
        seen.outcome == Outcome.ENV_ERROR.value
        and any(words in seen.reason for words in _IMPORT_FAILED)
        and not any(words in seen.reason for words in _INSTALL_FAILED)
    )


def judge(expect: Expect, ref: Seen, branch: Seen) -> tuple[bool | None, str]:
    """(passed, why) for one check from its two probes; passed is None when DeepSpeed at REF and
    on the branch does not import with this torch (the check says nothing about the change)."""
    if NO_IMPORT in ref.reason and NO_IMPORT in branch.reason:
        return None, f"not applicable: neither REF nor the branch imports with this torch ({ref.reason})"
    branch_clean = branch.finding is RunFinding.CLEAN
    if expect is Expect.FIXES:
        ok = ref.finding is RunFinding.BUG and branch_clean
    elif expect is Expect.FIXES_REFUSAL:
        ok = ref.outcome == Outcome.CRASHED.value and REFUSAL in ref.reason and branch_clean
    elif expect is Expect.UNCHANGED:
        ok = ref.finding is RunFinding.CLEAN and branch_clean
    else:
        assert_never(expect)
    verb = "as expected" if ok else "NOT as expected"
    return ok, f"REF {ref.short()}, branch {branch.short()}: {verb} ({expect.words})"


def plan(stacks: Sequence[Stack]) -> list[tuple[Stack, Check]]:
    """Each check on each stack of its kinds, check by check (the stacks in their given order)."""
    return [(stack, check) for check in CHECKS for stack in stacks if stack.kind in check.stacks]


def regression_ok(ref: Mapping[str, str], branch: Mapping[str, str]) -> tuple[bool, str]:
    """The test must fail at REF (every case) and pass on the branch (every case)."""
    if not ref or not branch:
        return False, "a run collected no test"
    bad = [f"REF {t}: {o}" for t, o in sorted(ref.items()) if o != "failed"]
    bad += [f"branch {t}: {o}" for t, o in sorted(branch.items()) if o != "passed"]
    if set(ref) != set(branch):
        bad.append("REF and branch ran different tests")
    if bad:
        return False, "; ".join(bad)
    return True, f"{len(ref)} test(s) fail at REF and pass on the branch"
