"""What bisect and survey print and save: one line per probe, OUT/bisect.json, OUT/survey.json,
and the closing summary. Pure functions of the probes (the report reads the same JSON).

bisect.json and survey.json: `WalkData` (repro.core.walk_files) says what each key holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from packaging.version import InvalidVersion, Version

from repro.bisect.commits import CommitInfo, DsRepo
from repro.bisect.probe import BadIf, Observation, ProbeSpec
from repro.bisect.search import BisectResult, BisectStatus, ProbeVerdict, SurveyResult
from repro.core.jobname import walk_subject
from repro.core.runs import RunFinding
from repro.core.walk_files import Change, Next, ProbeRow, Reproduce, Segment, WalkData
from repro.workload.record import CUSTOM_SCENARIO, Signature

# A stock-only probe of the user's command has no fixed run to compare its losses with: the judge
# says "divergence" only when its own losses go non-finite (repro/workload/ladder.py), and
# "warnings" where `make run` of the same job, which runs both patches, may find the losses part
# from the fixed run's. One line says so wherever it shows.
STOCK_ONLY_NOTE = (
    "note: a stock-only probe of your command shows illegal-work-warnings where `make run` (stock + "
    "fixed) may say illegal-work-divergence: without the fixed run to compare against, a probe sees "
    "divergence only as non-finite losses"
)


def signature_note(data: WalkData) -> str | None:
    """STOCK_ONLY_NOTE when it applies to these probes (a custom job probed without the fix)."""
    if data.get("scenario") != CUSTOM_SCENARIO or data.get("patch") != "stock":
        return None
    seen = {row.get("signature") for row in data.get("probes") or []}
    return STOCK_ONLY_NOTE if Signature.ILLEGAL_WORK_WARNINGS.value in seen else None


Key = tuple[str, str]


class ProbeLog:
    """Prints each probe as it finishes and keeps the rows for the JSON file."""

    def __init__(self, axis: str, say: Callable[[str], None]) -> None:
        self.axis, self.say = axis, say
        self.rows: list[ProbeRow] = []
        self.observations: dict[str, Observation] = {}

    def add(self, obs: Observation, verdict: ProbeVerdict | None) -> None:
        self.observations[obs.label] = obs
        self.rows.append(obs.as_dict(verdict))
        env = {True: "env reused", False: "env built", None: "no env"}[obs.reused_env]
        if obs.layered_on:
            env += f", layered on {obs.layered_on.rsplit('/', 1)[-1]}"
        mark = f"{verdict.value:<8}" if verdict else ""
        self.say(
            f"probe {len(self.rows):>2}: {self.axis} {obs.label:<10} {obs.outcome:<12} "
            f"{obs.signature:<24} {mark}{obs.seconds:6.0f} s  ({env})"
        )
        if obs.finding not in (RunFinding.BUG, RunFinding.CLEAN):
            self.say(f"          {obs.reason}")  # why nothing was learnt about the bug

    def summary_fields(self) -> WalkData:
        return {
            "probes": self.rows,
            "probe_count": len(self.rows),
            "envs_built": sum(1 for r in self.rows if r["reused_env"] is False),
            "envs_reused": sum(1 for r in self.rows if r["reused_env"] is True),
        }


def _change(before: str, after: str, kb: Key, ka: Key, unknown: list[str]) -> Change:
    return {
        "before": before,
        "after": after,
        "outcome_before": kb[0],
        "outcome_after": ka[0],
        "signature_before": kb[1],
        "signature_after": ka[1],
        "unknown_between": unknown,
    }


def bisect_data(
    header: WalkData,
    names: tuple[str, ...],
    result: BisectResult,
    log: ProbeLog,
    *,
    done: bool,
    repro_for: Callable[[str], str],
    resume: str | None = None,
) -> WalkData:
    data: WalkData = {
        "kind": "bisect",
        **header,
        "candidates": list(names),
        "status": result.status.value if done else "in-progress",
        "direction": None,
        "last_good": None,
        "first_bad": None,
        "evidence": {},
        "unknown_between": [],
        "change_points": [],
        **log.summary_fields(),
        "repro_command": None,
        "next": None,  # no-transition: {why, lines, earlier, later} (the driver's no_transition_next)
        "interrupted": resume is not None,
        "resume_command": resume,
    }
    if done and result.status is BisectStatus.FOUND:
        assert result.before is not None and result.after is not None
        before, after = names[result.before], names[result.after]
        good, bad = (before, after) if result.before_verdict is ProbeVerdict.GOOD else (after, before)
        unknown = [names[i] for i in result.unknown_between]
        obs = log.observations
        data.update(
            {
                "direction": "regression" if good == before else "fix",
                "last_good": good,
                "first_bad": bad,
                "evidence": {"last_good": obs[good].as_dict(), "first_bad": obs[bad].as_dict()},
                "unknown_between": unknown,
                "repro_command": repro_for(bad),
                "change_points": [_change(before, after, obs[before].key, obs[after].key, unknown)],
            }
        )
    data["signature_note"] = signature_note(data)
    return data


def no_transition_next(
    data: WalkData,
    earlier: Sequence[str],
    later: Sequence[str],
    widen: Callable[[str, str], str],
    other_axis: Callable[[str, str], str | None],
) -> Next:
    """What to do when both ends gave the same verdict: runnable lines that widen the range to the
    releases the index has beyond it (`earlier`/`later`, oldest first), and the other axis.

    `widen(good, bad)` is this bisect's own make line over another range; `other_axis(release,
    "older"|"newer")` the line that walks the other package at that release (None: there is none).
    """
    names = list(data["candidates"])
    oldest, newest = sorted((names[0], names[-1]), key=_order)
    verdicts = {row.get("verdict") for row in data.get("probes") or []} - {ProbeVerdict.UNKNOWN.value}
    if verdicts == {ProbeVerdict.BAD.value}:
        why = f"both ends are bad: the last good release is older than {oldest}"
        release, toward, beyond, nearest = oldest, "older", earlier, earlier[-6:]
        wider = [widen(earlier[0], oldest)] if earlier else []
    elif verdicts == {ProbeVerdict.GOOD.value}:
        why = f"both ends are good: the first bad release is newer than {newest} (or BAD_IF= asks too much)"
        release, toward, beyond, nearest = newest, "newer", later, later[:6]
        wider = [widen(newest, later[-1])] if later else []
    else:
        return {"why": "", "lines": [], "earlier": list(earlier), "later": list(later)}
    if beyond:
        why += f"; the index has {len(beyond)} {toward} ({', '.join(nearest)})"
    else:
        why += f"; the index lists no {toward} release for this env"
    other = other_axis(release, toward)
    lines = wider + ([other] if other else [])
    return {"why": why + "; next:", "lines": lines, "earlier": list(earlier), "later": list(later)}


def _order(label: str) -> tuple[int, Any]:
    try:
        return 0, Version(label)
    except InvalidVersion:  # a commit label: keep the given order
        return 1, label


def _opening(text: str, data: WalkData) -> list[str]:
    """A summary's first lines: a blank one, then `text` and what the probes built."""
    return ["", f"{text} ({data['envs_built']} envs built, {data['envs_reused']} reused)"]


def bisect_summary(data: WalkData) -> list[str]:
    lines = _opening(
        f"bisect {data['status']}: {data['axis']} on {data['env']}, {walk_subject(data)}, "
        f"BAD_IF={data['bad_if']}, {data['probe_count']} probes",
        data,
    )
    if data["status"] != BisectStatus.FOUND.value:
        seen = sorted({(r["outcome"], r["signature"], r["verdict"]) for r in data["probes"]})
        lines.append("  no good/bad boundary: " + "; ".join(f"{o} ({s}) = {v}" for o, s, v in seen))
        steps = data.get("next")
        if steps and steps.get("why"):
            lines.append(f"  {steps['why']}")
        lines += [f"    {line}" for line in (steps and steps.get("lines")) or ()]
        lines.append("  try `make survey` over the same range to see every outcome")
        note = signature_note(data)
        return lines + ([f"  {note}"] if note else [])
    if data["direction"] == "fix":
        lines.append("  (the bad release is the older one: this range shows where it was fixed)")
    for name in ("last_good", "first_bad"):
        e = data["evidence"][name]
        lines.append(
            f"  {name.replace('_', ' ')}: {e['version']}  {e['outcome']} ({e['signature']}): {e['reason']}"
        )
    if data["unknown_between"]:
        lines.append(f"  not decidable between them: {', '.join(data['unknown_between'])} (unknown verdicts)")
    lines.append(f"  reproduce the first bad: {data['repro_command']}")
    note = signature_note(data)
    return lines + ([f"  {note}"] if note else [])


def survey_data(
    header: WalkData,
    names: tuple[str, ...],
    result: SurveyResult[Key],
    log: ProbeLog,
    *,
    done: bool,
    interrupted: bool = False,
) -> WalkData:
    points = [
        _change(
            names[c.before], names[c.after], c.key_before, c.key_after, [names[i] for i in c.unknown_between]
        )
        for c in result.change_points
    ]
    known = sorted(i for i, k in result.keys.items() if k is not None)
    segments: list[Segment] = []
    if known:
        starts = [known[0], *(c.after for c in result.change_points)]
        ends = [*(c.before for c in result.change_points), known[-1]]
        for a, b in zip(starts, ends):
            key = result.keys[a]
            assert key is not None
            segments.append({"from": names[a], "to": names[b], "outcome": key[0], "signature": key[1]})
    data: WalkData = {
        "kind": "survey",
        **header,
        "candidates": list(names),
        "status": "done" if done else "in-progress",
        "interrupted": interrupted,
        "change_points": points,
        "segments": segments,
        "unknown": [names[i] for i, k in sorted(result.keys.items()) if k is None],
        **log.summary_fields(),
    }
    data["signature_note"] = signature_note(data)
    return data


def survey_summary(data: WalkData) -> list[str]:
    lines = _opening(
        f"survey: {data['axis']} on {data['env']}, {walk_subject(data)}: "
        f"{data['probe_count']} probes for {len(data['candidates'])} candidates",
        data,
    )
    for seg in data["segments"]:
        span = seg["from"] if seg["from"] == seg["to"] else f"{seg['from']} .. {seg['to']}"
        lines.append(f"  {span:<22} {seg['outcome']:<12} {seg['signature']}")
    unknown = list(data["unknown"])
    if not data["change_points"] and not unknown:
        lines.append("  no change of outcome or signature between the probed releases")
    elif not data["change_points"]:
        # Unknown is not "the same": say how little ran, so "no change" is never read as an answer.
        ran = len(data["candidates"]) - len(unknown)
        lines.append(
            f"  no change among the {ran} of {len(data['candidates'])} releases that ran; "
            f"nothing is known of the {len(unknown)} that did not (below)"
        )
    for c in data["change_points"]:
        gap = f" (unknown between: {', '.join(c['unknown_between'])})" if c["unknown_between"] else ""
        lines.append(
            f"  change {c['before']} -> {c['after']}: {c['outcome_before']}/{c['signature_before']}"
            f" -> {c['outcome_after']}/{c['signature_after']}{gap}"
        )
    if unknown:
        lines.append(f"  unknown (env could not run): {', '.join(unknown)}")
        lines += [f"    {', '.join(names)}: {reason}" for reason, names in _unknown_reasons(data, unknown)]
    if not data["every"]:
        lines.append(
            "  between two probes with the same result every release is assumed the same; "
            "EVERY=1 checks them all"
        )
    note = signature_note(data)
    return lines + ([f"  {note}"] if note else [])


def _unknown_reasons(data: WalkData, unknown: list[str]) -> list[tuple[str, list[str]]]:
    """Why the unknown releases did not run, one line per distinct reason (the last probe of each)."""
    last = {row["version"]: row.get("reason") or "no reason recorded" for row in data["probes"]}
    by_reason: dict[str, list[str]] = {}
    for name in unknown:
        by_reason.setdefault(str(last.get(name, "not probed")), []).append(name)
    return list(by_reason.items())


def commit_fields(
    data: WalkData,
    commits: Mapping[str, CommitInfo],
    repo: DsRepo,
    spec_of: Callable[[str], ProbeSpec],
    *,
    done: bool,
) -> WalkData:
    """AXIS=deepspeed-commit: what the commits are, and for the first bad one what it changed and
    how to reproduce it with and without this tool."""
    url = repo.url()
    fields: WalkData = {
        "ds_repo": repo.source,
        "repo_url": url,
        "candidate_commits": {label: info.as_dict(url) for label, info in commits.items()},
        "first_bad_commit": None,
        "last_good_commit": None,
        "reproduce": None,
    }
    if not (done and data.get("status") == BisectStatus.FOUND.value):
        return fields
    first_bad, last_good = data["first_bad"], data["last_good"]
    assert first_bad is not None and last_good is not None  # a found bisection names both
    bad, good = commits[first_bad], commits[last_good]
    spec = spec_of(first_bad)
    reproduce: Reproduce = {
        "make": spec.repro_command()
        + (
            f" BAD_IF={data['bad_if']}"
            if data.get("bad_if", BadIf.REPRODUCED.value) != BadIf.REPRODUCED.value
            else ""
        ),
        "pip": f"DS_BUILD_OPS=0 pip install --no-deps --no-build-isolation 'git+{url}@{bad.sha}'",
        "command": spec.command,
    }
    fields.update(
        {
            "first_bad_commit": {**bad.as_dict(url), "files": repo.files_changed(bad.sha)},
            "last_good_commit": good.as_dict(url),
            "reproduce": reproduce,
        }
    )
    return fields


def commit_summary(data: WalkData) -> list[str]:
    """The closing lines of a commit bisection (nothing for a release bisection)."""
    bad = data.get("first_bad_commit")
    if not bad:
        return []
    good, reproduce = data["last_good_commit"], data["reproduce"]
    assert good is not None and reproduce is not None  # set with first_bad_commit
    pr = f"  PR #{bad['pr']}" + (f" {bad['pr_url']}" if bad["pr_url"] else "") if bad["pr"] else ""
    lines = [
        f"  first bad commit: {bad['short']} {bad['subject']} ({bad['date']}){pr}",
        *("    " + line for line in bad["files"].splitlines()),
        f"  last good commit: {good['short']} {good['subject']} ({good['date']})",
        f"  probes: {data['probe_count']} in {data.get('rounds', data['probe_count'])} rounds "
        f"({data.get('parallel', 1)} a round, {data.get('runner', 'in-process')})",
        f"  reproduce with this tool: {reproduce['make']}",
        f"  reproduce without it: {reproduce['pip']}",
    ]
    if reproduce["command"]:
        lines.append(f"    then: {reproduce['command']}")
    return lines
