"""PR_DESCRIPTION.md from the records `make pr` made (pr.json), never from hand-written facts.

The torch references are constants read from torch 2.1.0's released
torch/distributed/distributed_c10d.py (the first release with the placeholder); everything about
the DeepSpeed commit (its files, the diff stat, the callers) comes from the record.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from repro.core import templating
from repro.core.runs import RunFinding
from repro.upstream.pr import affected_range as pr_range
from repro.upstream.pr import checks as pr_checks
from repro.upstream.pr import fix as pr_fix
from repro.upstream.pr import suite as pr_suite
from repro.upstream.pr.checks import Seen
from repro.upstream.pr.record import FileStat, PrRecord

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"  # repro/upstream/templates
TORCH_TAG = "v2.1.0"
TORCH_FILE = "torch/distributed/distributed_c10d.py"


@dataclass(frozen=True)
class TorchRef:
    name: str
    start: int
    end: int
    what: str

    def url(self) -> str:
        return f"https://github.com/pytorch/pytorch/blob/{TORCH_TAG}/{TORCH_FILE}#L{self.start}-L{self.end}"


TORCH_REFS = (
    TorchRef(
        "_IllegalWork",
        1647,
        1650,
        "the placeholder a collective returns inside the manager; every attribute raises",
    ),
    TorchRef("_CoalescingManager", 1653, 1663, "holds the real work (`works`) and waits on it (`wait()`)"),
    TorchRef(
        "_coalescing_manager",
        1666,
        1752,
        "issues the recorded collectives on exit and yields the `_CoalescingManager`",
    ),
)


def code(text: str) -> str:
    """`text` as one Markdown code span, whatever backticks it holds."""
    tick = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{tick}{pad}{text}{pad}{tick}"


def record_from(data: Mapping[str, Any]) -> PrRecord:
    """pr.json back into the record (an older pr.json without `function` reads as None)."""
    fields = dict(data)
    fields["changed"] = tuple(fields.get("changed") or ())
    fields["files"] = tuple(FileStat(**f) for f in fields.get("files") or ())
    fields["callers"] = tuple(
        pr_fix.Caller(c["path"], int(c["line"]), c["text"], pr_fix.CallerKind(c["kind"]), c.get("function"))
        for c in fields.get("callers") or ()
    )
    known = {f.name for f in dataclasses.fields(PrRecord)}
    return PrRecord(**{k: v for k, v in fields.items() if k in known})


# The description's pieces, as the template reads them.
class Grouped(TypedDict):  # items that say the same on several torches
    torches: str
    first: Mapping[str, Any]


class CallerRow(TypedDict):  # a call of the function, with the lab's checks of it
    caller: pr_fix.Caller
    checks: list[Grouped]
    scenarios: tuple[str, ...]


class OtherLine(TypedDict):  # the lines of one kind that are no call
    words: str
    where: list[str]


class UnexpectedLine(TypedDict):  # checks not as expected or not applicable, for one reason
    keys: list[str]
    torches: str
    why: str
    ref: str
    branch: str


class RangeTableRow(TypedDict):
    deepspeed: str
    applies: str
    why: str
    cells: list[str]


class RangeNote(TypedDict):
    what: str
    where: list[str]


class RangeTable(TypedDict):
    torches: list[str]
    rows: list[RangeTableRow]
    notes: list[RangeNote]
    complete: bool
    seconds: float | None


class SideWords(TypedDict):  # what the un-skipped optimizer test showed on one side
    tally: str
    failures: list[str]
    unsaid: bool
    stopped: str | None


class UnskipLine(TypedDict):
    column: str
    sides: dict[str, SideWords]


class TestCells(TypedDict):
    test: str
    cells: list[str]


class RegressionColumn(TypedDict, total=False):
    column: str
    ok: bool | None
    why: str


class SuiteTable(TypedDict):
    columns: list[str]
    rows: list[TestCells]
    flags: str
    upstream_torches: Mapping[str, Any]
    torches: list[str]
    flags_from: str | None
    packages_from: str | None
    install: str | None
    edits: list[str]
    missing: list[str]
    regression: list[RegressionColumn]
    regression_all_ok: bool
    unskip: list[UnskipLine]
    skip: str | None  # what the un-skip showed for the branch's skip (skip_words)
    not_run: list[Mapping[str, Any]]


class FailedWait(TypedDict):
    torch: str
    test: str
    ref: str
    branch: str


def by_torch(items: Iterable[Mapping[str, Any]], words: Callable[[Mapping[str, Any]], Any]) -> list[Grouped]:
    """Items (checks, regression results) that say the same words on several torches, once, in
    first-seen order: {"torches": "2.7.1, 2.8.0", "first": the first item}. Six torches read as
    long as one where they agree (#43: the description stays about 150 lines)."""
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for item in items:
        groups.setdefault(words(item), []).append(item)
    return [
        {"torches": ", ".join(str(i.get("torch")) for i in same), "first": same[0]}
        for same in groups.values()
    ]


def _seen_words(check: Mapping[str, Any]) -> tuple[Any, ...]:
    sides = (check.get("ref") or {}, check.get("branch") or {})
    return (check.get("key"), *(side.get(k) for side in sides for k in ("outcome", "signature")))


def evidence(record: PrRecord, verification: Mapping[str, Any] | None) -> list[CallerRow]:
    """Each call of deepspeed.comm.all_gather_coalesced that `git grep` found, with the lab's checks
    that exercise it (those that agree on several torches once)."""
    checks = list((verification or {}).get("checks") or [])
    rows: list[CallerRow] = []
    for caller in record.callers:
        if caller.kind is not pr_fix.CallerKind.CALL:
            continue
        keys = pr_checks.FUNCTION_SCENARIOS.get(caller.function or "", ())
        # judged checks only: a torch the commit does not import with says nothing here
        judged = [c for c in checks if c.get("key") in keys and c.get("ok") is not None]
        rows.append({"caller": caller, "checks": by_torch(judged, _seen_words), "scenarios": keys})
    return rows


def other_lines(record: PrRecord) -> list[OtherLine]:
    """The lines of `git grep` that are no call, by kind, each once: where the function is
    defined, forwarded or imported, and the other functions of that name and comments."""
    by_kind: dict[pr_fix.CallerKind, list[str]] = {}
    for caller in record.callers:
        if caller.kind is not pr_fix.CallerKind.CALL:
            by_kind.setdefault(caller.kind, []).append(f"{caller.path}:{caller.line}")
    return [{"words": kind.words, "where": where} for kind, where in by_kind.items()]


def unexpected(verification: Mapping[str, Any] | None) -> list[UnexpectedLine]:
    """The checks not as expected or not applicable, one line per reason: the checks and torches
    that share it, named so that every check listed ran on every torch listed."""
    reasons: dict[tuple[str, ...], dict[str, list[str]]] = {}
    regression = [{**r, "key": "regression test", "ok": r.get("ok"), "ref": {}, "branch": {}}
                  for r in (verification or {}).get("regression") or []]  # fmt: skip
    for c in [*((verification or {}).get("checks") or []), *regression]:
        if c.get("ok") is True:
            continue
        said = (str(c.get("why")), "", "")
        if c.get("ok") is not None:  # a judged check: each side's reason (the branch's when it differs)
            ref, branch = ((c.get(side) or {}).get("reason") or "" for side in ("ref", "branch"))
            said = (said[0], ref, branch if branch != ref else "")
        reasons.setdefault(said, {}).setdefault(str(c.get("key")), []).append(str(c.get("torch")))
    lines: list[UnexpectedLine] = []
    for (why, ref, branch), torches_of in reasons.items():
        keys_of: dict[str, list[str]] = {}  # the same torches: one line for their checks
        for key, torches in torches_of.items():
            keys_of.setdefault(", ".join(torches), []).append(key)
        for named, keys in keys_of.items():
            lines.append({"keys": keys, "torches": named, "why": why, "ref": ref, "branch": branch})
    return lines


def range_table(ranged: Mapping[str, Any] | None) -> RangeTable | None:
    """The range as header + rows of words (pr_range.cell_words), and notes naming the error
    behind every cell that holds no outcome, or None without records."""
    if not ranged or not ranged.get("rows"):
        return None
    torches = [c["torch"] for c in ranged.get("columns") or []]
    rows: list[RangeTableRow] = []
    causes: dict[str, list[str]] = {}
    for row in ranged["rows"]:
        cells = []
        for torch in torches:
            cell = (row.get("cells") or {}).get(torch) or {}
            stock, fixed = pr_range.cell_words(cell.get("stock")), pr_range.cell_words(cell.get("fixed"))
            # No fixed probe where stock did not run MiCS (pr_range: nothing for the fix to show).
            same_failure = stock == fixed == "does not import"
            cells.append(stock if fixed == "-" or same_failure else f"{stock} / {fixed}")
            for probe in (cell.get("stock"), cell.get("fixed")):
                if probe and probe.get("outcome") not in ("reproduced", "clean"):
                    where = f"{row['deepspeed'].split(' ')[0]} + torch {torch}"
                    seen = causes.setdefault(f"{pr_range.cell_words(probe)}: {pr_range.cause(probe)}", [])
                    if where not in seen:
                        seen.append(where)
        applies, why = _applies_words(row, torches), row.get("applies_why", "")
        rows.append({"deepspeed": row["deepspeed"], "applies": applies, "why": why, "cells": cells})
    return {
        "torches": torches,
        "rows": rows,
        "notes": [{"what": what, "where": where} for what, where in causes.items()],
        "complete": ranged.get("complete", False),
        "seconds": ranged.get("seconds"),
    }


def _applies_words(row: Mapping[str, Any], torches: list[str]) -> str:
    """From the release tag's files; without the tag, from the fixed runs (one that trained or
    showed the bug means the run-time fix, the same splice, applied)."""
    applies = row.get("applies")
    if applies is not None:
        return "yes" if applies else "no"
    fixed = [((row.get("cells") or {}).get(t) or {}).get("fixed") for t in torches]
    if any(p and Seen.from_probe(p).finding in (RunFinding.BUG, RunFinding.CLEAN) for p in fixed):
        return "yes (by its fixed run; no tag)"
    return "?"


TRANSPORT_WORDS = {"plain": "plain gloo", "async": "lab adapter"}


def suite_table(verification: Mapping[str, Any] | None) -> SuiteTable | None:
    """DeepSpeed's own MiCS tests (pr_suite) as one table: a row per test id, a column per torch
    and transport holding "REF -> branch"; and what the un-skipped optimizer test showed."""
    entries = [e for e in (verification or {}).get("suite") or [] if e.get("sessions")]
    if not entries:
        return None
    columns = [(e["torch"], t) for e in entries for t in pr_suite.TRANSPORTS]
    cells: dict[str, dict[tuple[str, str], str]] = {}
    for e in entries:
        for row in e.get("rows") or []:
            for transport, seen in (row.get("cells") or {}).items():
                words = f"{seen.get('ref', '-')} → {seen.get('branch', '-')}"
                cells.setdefault(row["test"], {})[(e["torch"], transport)] = words
    unskip: list[UnskipLine] = []
    for e in entries:
        for transport in pr_suite.TRANSPORTS:
            sides: dict[str, SideWords] = {}
            for s in (s for s in e["sessions"] if s["transport"] == transport):
                mine = _optimizer_tests(s)
                bad = [v for v in mine.values() if v["outcome"] in ("failed", "error")]
                said = sorted({v["message"] for v in bad if v["message"]})[:2]
                sides[s["side"]] = {
                    "tally": tally({t: v["outcome"] for t, v in mine.items()}),
                    "failures": said,
                    "unsaid": bool(bad) and not said,  # stopped before pytest printed its failures
                    # The lab ended the session (a deadlock seen, the stall limit): its own words.
                    "stopped": s.get("reason") if s.get("outcome") == "hung" and mine else None,
                }
            unskip.append(
                {"column": f"torch {e['torch']}, {TRANSPORT_WORDS.get(transport, transport)}", "sides": sides}
            )
    regression: list[RegressionColumn] = [
        {
            "column": f"torch {e['torch']}, {TRANSPORT_WORDS.get(t, t)}",
            "ok": r.get("ok"),
            "why": r.get("why", ""),
        }
        for e in entries
        for t, r in sorted((e.get("regression") or {}).items(), key=lambda tr: _transport_order(tr[0]))
    ]
    first = entries[0]
    return {
        "columns": [f"torch {torch}, {TRANSPORT_WORDS.get(t, t)}" for torch, t in columns],
        "rows": _parametrized_once(
            [(test, [by.get(c, "-") for c in columns]) for test, by in sorted(cells.items())]
        ),
        "flags": " ".join(first.get("flags") or ()),
        "upstream_torches": first.get("upstream_torches") or {},
        "torches": [e["torch"] for e in entries],
        "flags_from": first.get("flags_from"),
        "packages_from": first.get("packages_from"),
        "install": first.get("install"),
        "edits": first.get("edits") or [],
        "missing": first.get("missing") or [],
        "regression": regression,
        "regression_all_ok": bool(regression) and all(r.get("ok") for r in regression),
        "unskip": unskip,
        "skip": skip_words(entries),
        "not_run": [e for e in (verification or {}).get("suite") or [] if not e.get("sessions")],
    }


_OPTIMIZER_ID = pr_suite.OPTIMIZER_TEST.removeprefix("tests/")  # as pytest names it, run in tests/


def _optimizer_tests(session: Mapping[str, Any]) -> dict[str, pr_suite.TestSeen]:
    """The session's tests of the un-skipped `test_mics_optimizer.py`: {test id: what it saw}."""
    return {t: v for t, v in (session.get("tests") or {}).items() if t.startswith(_OPTIMIZER_ID)}


def skip_words(entries: Sequence[Mapping[str, Any]]) -> str | None:
    """What the evidence says of `test_mics_optimizer.py`'s skip (issue #43 item 5): it can go only
    when, un-skipped, every one of its tests passed on the branch under DeepSpeed's harness on plain
    gloo (what upstream's CI has) on every torch that ran it; None when the branch ran none."""
    seen = [
        (e["torch"], {t: v["outcome"] for t, v in _optimizer_tests(s).items()})
        for e in entries
        for s in e["sessions"]
        if s["side"] == "branch" and s["transport"] == "plain"
    ]
    seen = [(torch, outcomes) for torch, outcomes in seen if outcomes]
    if not seen:
        return None
    short = [
        f"torch {torch}: {tally(outcomes)}"
        for torch, outcomes in seen
        if set(outcomes.values()) != {"passed"}
    ]
    if not short:
        torches = ", ".join(torch for torch, _ in seen)
        return (
            f"un-skipped, every test of `{_OPTIMIZER_ID}` passed on the branch under DeepSpeed's harness on "
            f"plain gloo (torch {torches}): the evidence supports removing its skip with this fix "
            "(this branch keeps it; the two lines are named above)"
        )
    return (
        f"`{_OPTIMIZER_ID}` keeps its skip on this branch: un-skipped, it did not pass there under "
        f"DeepSpeed's harness on plain gloo ({'; '.join(short)}), as the lines below say"
    )


def _transport_order(transport: str) -> int:
    """upstream's CI first (plain gloo), then the lab's adapter, as the sessions ran."""
    return (
        pr_suite.TRANSPORTS.index(transport) if transport in pr_suite.TRANSPORTS else len(pr_suite.TRANSPORTS)
    )


def _parametrized_once(rows: list[tuple[str, list[str]]]) -> list[TestCells]:
    """One row for the parameters of a test that fared the same: `test_a[2]` and `test_a[4]` with
    equal cells read `test_a[2, 4]` (the table stays short; nothing said is lost)."""
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for test, cells in rows:
        base, bracket, param = test.partition("[")
        grouped.setdefault((base if bracket else test, tuple(cells)), []).append(
            param[:-1] if bracket else ""
        )
    out: list[TestCells] = []
    for (base, same), params in grouped.items():
        named = [p for p in params if p]
        test = f"{base}[{', '.join(named)}]" if named and len(named) == len(params) else base
        out.append({"test": test, "cells": list(same)})
    return sorted(out, key=lambda row: row["test"])


def context(
    record: PrRecord, verification: Mapping[str, Any] | None = None, ranged: Mapping[str, Any] | None = None
) -> dict[str, Any]:  # the template's names: each piece above, and the records themselves
    checks: list[Mapping[str, Any]] = list((verification or {}).get("checks") or [])
    lab: dict[str, list[Any]] = {}
    for check in checks:
        lab.setdefault(str(check.get("key")), []).append(check)
    regression: list[Mapping[str, Any]] = list((verification or {}).get("regression") or [])
    return {
        "verify": verification,
        "lab": {key: by_torch(same, _lab_words) for key, same in lab.items()},
        # The table holds the judged checks; those not applicable are listed with their reason.
        "checked": sorted(
            by_torch(
                [c for c in checks if c.get("ok") is not None], lambda c: (*_seen_words(c), c.get("ok"))
            ),
            key=lambda g: _key_order(checks, g["first"]),
        ),
        "regression_rows": by_torch([r for r in regression if r.get("ok") is not None], _regression_words),
        "failed_wait": by_torch(_failed_wait(regression), lambda t: (t["test"], t["ref"], t["branch"])),
        "unexpected": unexpected(verification),
        "evidence": evidence(record, verification),
        "other_lines": other_lines(record),
        "range": range_table(ranged),
        "suite": suite_table(verification),
        "r": record,
        "torch_refs": TORCH_REFS,
        "calls": [c for c in record.callers if c.kind is pr_fix.CallerKind.CALL],
        "outside": pr_fix.callers_outside_mics(record.callers),
        "mics": pr_fix.MICS,
        "added": sum(f.added for f in record.files),
        "removed": sum(f.removed for f in record.files),
    }


def _lab_words(check: Mapping[str, Any]) -> tuple[Any, ...]:
    ref, branch = check.get("ref") or {}, check.get("branch") or {}
    reason = str(ref.get("reason") or "")[:120]
    return (check.get("ok") is None, ref.get("outcome"), reason, branch.get("outcome"))


def _key_order(checks: list[Mapping[str, Any]], check: Mapping[str, Any]) -> tuple[int, int]:
    """The table's rows by check, in the order the checks were made, then by torch."""
    keys = list(dict.fromkeys(str(c.get("key")) for c in checks))
    return keys.index(str(check.get("key"))), checks.index(check)


def _regression_words(result: Mapping[str, Any]) -> tuple[Any, ...]:
    return (tally(result.get("ref") or {}), tally(result.get("branch") or {}), result.get("ok"))


def _failed_wait(regression: list[Mapping[str, Any]]) -> list[FailedWait]:
    """The regression test's failed-wait case per torch (the AVAILABLE point's evidence)."""
    return [
        {
            "torch": str(r.get("torch")),
            "test": test,
            "ref": outcome,
            "branch": str((r.get("branch") or {}).get(test, "-")),
        }
        for r in regression
        for test, outcome in (r.get("ref") or {}).items()
        if "failed_wait" in test
    ]


def tally(outcomes: Mapping[str, str]) -> str:
    """{test: outcome} as counts, the most first: "4 failed", "3 passed, 1 failed" (the same words
    whether the outcomes come from the run or from verify.json, whose keys are sorted)."""
    counts = Counter(outcomes.values())
    return ", ".join(f"{n} {o}" for o, n in sorted(counts.items(), key=lambda c: (-c[1], c[0]))) or "-"


def render(
    record: PrRecord, verification: Mapping[str, Any] | None = None, ranged: Mapping[str, Any] | None = None
) -> str:
    env = templating.environment(TEMPLATES, filters={"code": code, "tally": tally})
    return env.get_template("PR_DESCRIPTION.md.j2").render(**context(record, verification, ranged))
