"""Judge a custom job (`python -m repro run --cmd ...`) from its own output: a pure module.

`parse(log_text)` reads what any DeepSpeed job prints: IllegalWork messages, the exception that
ended it, fp16 overflow/skip lines and loss-scale changes (DeepSpeed's and Megatron's wording) and
the losses (default patterns for DeepSpeed, Megatron-DeepSpeed and HF Trainer output, or the
user's LOSS_REGEX). `judge(own, other, ...)` weighs one run on the ladder every run is weighed on
(ladder.py: its rungs, thresholds and divergence rule, shared with the suite's classify.py); the
stock and fixed runs of the same command are each other's control. Before the ladder's rungs, the
ways a job fails to be evidence at all:
  hung / interrupted   how the job runner says the run ended
  unsupported          fixed run whose DeepSpeed the fix cannot patch (it ran as stock)
  env-error            the command could not start (exit 126/127) or torch/DeepSpeed are missing;
                       no hooked process imported DeepSpeed where the hook was needed (a fixed
                       run, or a CPU run that failed, whose log shows DeepSpeed at work), so the
                       fix or the CPU shims never applied;
                       the rendezvous port was taken ("address already in use")
  reproduced           an exception raised from an _IllegalWork object in torch's or DeepSpeed's
                       code; IllegalWork messages counted by the hook, alone or with losses that
                       leave the fixed run's / an overflow storm the fixed run does not have
  env-error            (also) the job ended on a missing module: named, with PACKAGES=
  no-evidence          a pytest session that ran no test (none collected, all skipped: pytest's
                       reasons quoted); a command that never imported DeepSpeed, or took no
                       DeepSpeed optimizer step; losses that differ (or NaN, or an overflow storm)
                       without any IllegalWork seen: "differs, not the bug's path", with how to
                       tell the job's own noise from the bug
  crashed              any other non-zero exit; a pytest session whose tests failed without a
                       sign of the bug
  clean                none of that
A pytest session (pytest_outcomes.py) is weighed like any job, with its counts in the reason and
the tests whose outcome differs from the other patch's session in the notes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from repro.workload import ladder
from repro.workload.crash_signs import (
    lost_coalesced_work,
    raised_from_illegal_work,
    raised_in_framework,
    raising_file,
)
from repro.workload.ladder import Judgement

if TYPE_CHECKING:
    from repro.workload.hooksign import HookRecord, PytestSummary
    from repro.workload.record import Patterns, RecordedException

# The ladder's tolerance for a user's job: its other run is the same command with a different patch,
# possibly on GPUs whose reductions are not deterministic.
TOLERANCE = ladder.JOB_TOLERANCE

_NUM = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|NaN|NAN|-?inf|-?Inf|-?INF|infinity)"
# name -> regex with a named group `loss` and, where the output has one, `step`. First pattern
# that matches any line decides; its name and text go into the record.
LOSS_PATTERNS: dict[str, str] = {
    "megatron": rf"\biteration\s+(?P<step>\d+)\s*/\s*\d+\s*\|.*?\blm loss:\s*(?P<loss>{_NUM})",
    "deepspeed-pipe": rf"\bsteps:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{_NUM})",
    "hf-trainer": rf"\{{'loss':\s*(?P<loss>{_NUM}),",
    "generic": rf"(?i)\b(?:step|iter|iteration)\s*[:=#]?\s*(?P<step>\d+)\b"
    rf".*?\bloss\s*[:=]?\s*(?P<loss>{_NUM})\b",
}
ILLEGAL_WORK_FAILURE = r"Error message: .*IllegalWork"
# DeepSpeed: "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to
# 32768" (fused/stage 1-3) and "Grad overflow on iteration N" + "Reducing dynamic loss scale from
# X to Y" (unfused); Megatron: "| loss scale: 4096.0 |" and "number of skipped iterations:   1".
OVERFLOW_PATTERNS: dict[str, str] = {
    "deepspeed-overflow": r"OVERFLOW! Rank (?P<rank>\d+) Skipping step\.(?: Attempted loss scale: "
    rf"(?P<old>{_NUM}), reducing to (?P<new>{_NUM}))?",
    "deepspeed-unfused": rf"Reducing dynamic loss scale from (?P<old>{_NUM}) to (?P<new>{_NUM})",
    "megatron-skipped": r"number of skipped iterations:\s*(?P<skipped>\d+)",
    "megatron-scale": rf"\|\s*loss scale:\s*(?P<scale>{_NUM})\s*\|",
}
# Launchers prefix rank output: torchrun "[rank0]:", DeepSpeed's multi-node "worker-0: ".
_PREFIX = re.compile(r"^(?:\[(?:default)?rank\d+\]:\s?|worker-\d+:\s?|\d+:\s(?=\S))")
# The line that ends a traceback: `Type: message`, or a bare `Type`. The type is dotted (a module's
# exception: `socket.gaierror`, `ssl.SSLError`) or named like an exception (`KeyError`,
# `KeyboardInterrupt`, `SystemExit`, `StopIteration`, `ChildFailedError`...): a rank's own output,
# interleaved with another rank's traceback (`loss: 2.3`, `Epoch: 1`), is neither.
# Python's own base classes, raised as they are (accelerate raises a bare `Exception`), count too.
_EXC_NAME = (
    r"(?:(?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*|(?:Base)?Exception"
    r"|[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Iteration|Failure))"
)
_EXC_LINE = re.compile(
    rf"^(?:(?P<type>{_EXC_NAME}): ?(?P<message>.*)"
    r"|(?P<bare>\w*(?:Error|Exception|Interrupt|Exit|Iteration)))$"
)


def _exception_line(line: str) -> tuple[str, str] | None:
    """(type, message) when the line is the one that ends a traceback."""
    m = _EXC_LINE.match(line)
    if not m:
        return None
    return (m["type"], m["message"]) if m["type"] else (m["bare"], "")


_MISSING = re.compile(r"No module named '(?P<name>torch|deepspeed)'")
# How Python says a module is missing: the exception (`ModuleNotFoundError: No module named 'x.y'`)
# and `python -m x` ("/path/python: No module named x"), which prints no traceback.
_NO_MODULE = re.compile(r"No module named '?(?P<name>[A-Za-z_][\w.]*)'?")
_NO_MODULE_TO_RUN = re.compile(r"^\S*python[\d.]*: No module named (?P<name>[A-Za-z_][\w.]*)\s*$")
# How the job's shell says a program cannot start (exit 127/126): bash ("bash: line 1: torchrun:
# command not found", "bash: ./x: No such file or directory", "bash: ./x: Permission denied",
# "... /usr/bin/python9: bad interpreter: ...") and dash ("sh: 1: torchrun: not found"); a shell
# script of the job says it with its own name ("./run.sh: line 3: torchrun: command not found").
_NOT_STARTED = re.compile(
    r"^(?:(?:\S*/)?(?:ba)?sh: (?:line )?(?:\d+: )?|\S+: (?:line )?\d+: )"
    r"(?P<program>[^\s:][^:]{0,199}): (?:(?P<interp>/[^:]{0,200}): )?"
    r"(?P<why>command not found|not found|No such file or directory|Permission denied"
    r"|bad interpreter: [^\n]{0,200}|cannot execute[^\n]{0,100})\s*$"
)
# DeepSpeed's own log tag, module paths in tracebacks and log records, its launcher's lines.
_DEEPSPEED_SIGN = re.compile(
    r"(?i)[/\\]deepspeed[/\\]|\[deepspeed\]|\bds_accelerator\b|DeepSpeed info:"
    r"|\bdeepspeed\.(?:comm|runtime|ops|accelerator|launcher|utils|zero)\b"
)
# c10d's TCPStore and gloo say it in these words when another process holds the rendezvous port.
_ADDRESS_IN_USE = re.compile(r"(?i)address already in use|EADDRINUSE")
NO_HOOKED_DEEPSPEED = "no hooked process imported DeepSpeed"


@dataclass
class Parsed:
    """What one job's log says, plus what the hook reported (merged in by `with_hook`)."""

    losses: list[float | None] = field(default_factory=list)
    loss_steps: list[int | None] = field(default_factory=list)
    loss_pattern: str | None = None  # name of the pattern that decided, or "custom"
    illegal_work_messages: int = 0
    skipped_steps: int = 0
    loss_scale: list[float | None] = field(default_factory=list)
    overflow_patterns: list[str] = field(default_factory=list)
    exception: RecordedException | None = None
    missing_module: str | None = None
    missing_program: str | None = None  # what the job's shell could not start (exit 127/126)
    missing_program_why: str | None = None  # the shell's words: "command not found", "bad interpreter: ..."
    mentions_deepspeed: bool = False  # the log shows DeepSpeed at work (hooked or not)
    address_in_use: str | None = None  # the line saying the rendezvous port was taken
    illegal_work_in_log: int = 0  # what the log alone shows, before the hook's count is merged in
    illegal_work_by_hook: int = 0
    # The runner verified the hook's signatures (repro/workload/hooksign.py): only the hook's count
    # is evidence then, the log's is corroboration. False: a runner before signing, or no runner.
    hook_signed: bool = False
    forged_hook_records: list[dict[str, str]] = field(default_factory=list)
    # From the hook's records: optimizer steps some process ran (None: a runner before counting
    # them; the first step's engine description stands in), and what pytest said of the session
    # that ran the most tests (pytest_outcomes.py; None: no pytest session).
    steps: int | None = None
    pytest: PytestSummary | None = None
    # The exception's own `No module named X` (any module), when that is how the job ended.
    missing_any_module: str | None = None


def _float(text: str) -> float:
    return float(text.lower().replace("infinity", "inf"))


def _losses(
    lines: list[str], loss_regex: str | None
) -> tuple[list[float | None], list[int | None], str | None]:
    patterns = {"custom": loss_regex} if loss_regex else LOSS_PATTERNS
    for name, text in patterns.items():
        rx = re.compile(text)
        found: list[tuple[int | None, float]] = []
        for line in lines:
            m = rx.search(line)
            if not m:
                continue
            groups = m.groupdict()
            raw = groups.get("loss") if "loss" in groups else (m.group(1) if rx.groups else m.group(0))
            try:
                value = _float(str(raw))
            except ValueError:
                continue
            step = groups.get("step")
            found.append((int(step) if step is not None else None, value))
        if found:
            values, steps = _dedupe(found)
            return values, steps, name
    return [], [], None


def _dedupe(found: list[tuple[int | None, float]]) -> tuple[list[float | None], list[int | None]]:
    """Every rank may print the same step: keep the first value of each step number. The values
    (NaN/inf as None) and their step numbers."""
    seen: set[int] = set()
    kept: list[tuple[int | None, float]] = []
    for step, value in found:
        if step is not None:
            if step in seen:
                continue
            seen.add(step)
        kept.append((step, value))
    return [value if math.isfinite(value) else None for _, value in kept], [step for step, _ in kept]


def _tracebacks(lines: list[str]) -> list[RecordedException]:
    found: list[RecordedException] = []
    for start, line in enumerate(lines):
        if not line.startswith("Traceback (most recent call last)"):
            continue
        for i in range(start + 1, len(lines)):
            m = _exception_line(lines[i])
            if m:
                text = "\n".join(lines[start : i + 1])[-4000:]
                found.append({"type": m[0], "message": m[1], "rank": None, "traceback": text})
                break
    return found


def _exception(lines: list[str]) -> RecordedException | None:
    """The exception that ended the job: one raised from an _IllegalWork object (or torch's manager
    waiting a lost work) if any rank had it, else the first traceback (a launcher's own traceback,
    e.g. torchrun's ChildFailedError, comes after the rank's that caused it)."""
    found = _tracebacks(lines)
    bug = [t for t in found if raised_from_illegal_work(t) or lost_coalesced_work(t)]
    return next(
        (t for t in bug if raised_in_framework(t)),
        bug[0] if bug else (found[0] if found else None),
    )


def _missing_module(exc: RecordedException | None, lines: list[str]) -> str | None:
    """The top-level module whose absence ended the job: the exception that ended it, or the line
    `python -m` prints for a module it cannot run. None for a warning about an optional module that
    the job survived (DeepSpeed's own try/except imports), which ends no job."""
    if exc and exc.get("type") in ("ModuleNotFoundError", "ImportError"):
        m = _NO_MODULE.search(str(exc.get("message") or ""))
        if m:
            return m["name"].split(".")[0]
    found = next((m for m in map(_NO_MODULE_TO_RUN.match, lines) if m), None)
    return found["name"].split(".")[0] if found else None


def parse(log_text: str, loss_regex: str | None = None) -> Parsed:
    lines = [_PREFIX.sub("", line, count=1) for line in log_text.splitlines()]
    out = Parsed()
    out.losses, out.loss_steps, out.loss_pattern = _losses(lines, loss_regex)
    failure = re.compile(ILLEGAL_WORK_FAILURE)
    in_traceback = False
    for line in lines:
        ends = in_traceback and _exception_line(line) is not None
        in_traceback = line.startswith("Traceback") or (in_traceback and not ends)
        if in_traceback or ends:
            continue  # the exception's own text is evidence of a crash, not a message
        if failure.search(line):
            out.illegal_work_messages += 1
    _overflows(lines, out)
    out.exception = _exception(lines)
    m = next((m for m in map(_MISSING.search, lines) if m), None)
    out.missing_module = m["name"] if m else None
    out.missing_any_module = _missing_module(out.exception, lines)
    gone = next((g for g in map(_NOT_STARTED.match, lines) if g), None)
    if gone:
        why = f"{gone['interp']}: {gone['why']}" if gone["interp"] else gone["why"]
        out.missing_program, out.missing_program_why = gone["program"].strip(), why
    out.mentions_deepspeed = any(_DEEPSPEED_SIGN.search(line) for line in lines)
    out.address_in_use = next((line.strip()[:300] for line in lines if _ADDRESS_IN_USE.search(line)), None)
    out.illegal_work_in_log = out.illegal_work_messages
    return out


def _overflows(lines: list[str], out: Parsed) -> None:
    per_rank: dict[str, int] = {}
    megatron_skipped = 0
    used: list[str] = []
    for line in lines:
        for name, text in OVERFLOW_PATTERNS.items():
            m = re.search(text, line)
            if not m:
                continue
            used.append(name)
            groups = m.groupdict()
            if name == "deepspeed-overflow":
                rank = groups.get("rank") or "0"
                per_rank[rank] = per_rank.get(rank, 0) + 1
            if name == "deepspeed-unfused":
                per_rank["-"] = per_rank.get("-", 0) + 1
            if name == "megatron-skipped":
                megatron_skipped += int(groups["skipped"])
            new = groups.get("new") or groups.get("scale")
            if new is not None:
                value = _float(new)
                out.loss_scale.append(value if math.isfinite(value) else None)
    # DeepSpeed may print the overflow line on every rank: a skipped step counts once.
    out.skipped_steps = max(per_rank.values(), default=0) + megatron_skipped
    out.overflow_patterns = sorted(set(used))


def with_hook(
    parsed: Parsed,
    reports: list[HookRecord],
    forged: list[dict[str, str]] | None = None,
    signed: bool = False,
) -> Parsed:
    """The hook counts IllegalWork messages at every log level (DeepSpeed 0.19.6 hides them);
    `reports` are the hook records the runner verified, `forged` the ones it did not."""
    # What the hook counted in DeepSpeed's logger; the count the verdict rests on is that alone when
    # the runner verified the records' signatures (the log's lines only corroborate: the job can
    # print them), and the larger of the two from a runner before signing, as then.
    counted = sum(int(r.get("illegal_work_failures") or 0) for r in reports)
    parsed.illegal_work_by_hook = counted
    parsed.illegal_work_messages = counted if signed else max(parsed.illegal_work_in_log, counted)
    parsed.hook_signed, parsed.forged_hook_records = signed, list(forged or ())
    parsed.steps = _steps_taken(reports)
    sessions = [r["pytest"] for r in reports if isinstance(r.get("pytest"), dict)]
    parsed.pytest = max(sessions, key=lambda t: int(t.get("ran") or 0), default=None)
    return parsed


def _steps_taken(reports: list[HookRecord]) -> int | None:
    """Optimizer steps of the process that ran the most; 1 where a runner before the count saw the
    engine (its first step), 0 where no process stepped."""
    counted = [int(r["steps"]) for r in reports if isinstance(r.get("steps"), int)]
    if counted:
        return max(counted)
    return 1 if any(r.get("engine") for r in reports) else (0 if reports else None)


def log_only_illegal_work(parsed: Parsed) -> str:
    """The words for IllegalWork lines the log shows and the hook did not count ("" otherwise)."""
    if not parsed.hook_signed or parsed.illegal_work_by_hook or not parsed.illegal_work_in_log:
        return ""
    return (
        f"{parsed.illegal_work_in_log} IllegalWork messages in the job's log, not counted: the hook "
        "counted none from DeepSpeed (a log line is corroboration only: the job can print it)"
    )


def forged_records(parsed: Parsed) -> str:
    if not parsed.forged_hook_records:
        return ""
    named = ", ".join(f"{f.get('file')} ({f.get('why')})" for f in parsed.forged_hook_records)
    return f"forged hook records, not counted: {named}"


def hidden_illegal_work(parsed: Parsed) -> str:
    """Where the IllegalWork evidence came from when the job's log hides it (HF Trainer lowers
    DeepSpeed's logger to WARNING; DeepSpeed 0.19.6 logs them at DEBUG); "" when the log shows it."""
    if parsed.illegal_work_by_hook <= parsed.illegal_work_in_log:
        return ""
    return (
        f"IllegalWork messages counted by the hook: {parsed.illegal_work_by_hook} (the job's log shows "
        f"{parsed.illegal_work_in_log}; its framework lowers DeepSpeed's log level)"
    )


def nan_logged_as_zero(
    stock: list[float | None], fixed: list[float | None], parted: int | None
) -> int | None:
    """The step from which the stock run logs exactly 0.0 to its end, at or after the step its
    losses part from the fixed run's, while the fixed run's losses there are finite and not 0.0: a
    framework that logs a non-finite loss as 0.0 (HF Trainer's `logging_nan_inf_filter`), so the
    log shows no NaN although the training has one. None otherwise."""
    if parted is None or parted >= len(stock) or any(v is None for v in fixed):
        return None
    start = len(stock)
    while start > parted and stock[start - 1] == 0.0:
        start -= 1
    if start == len(stock):
        return None  # the stock run does not end in zeros
    if all(v not in (0.0, None) for v in fixed[start : len(stock)]) and len(fixed) >= len(stock):
        return start
    return None


def not_started_reason(own: Parsed, exit_code: int) -> str:
    """Why a job exited 127/126 before running: the program its shell could not start, and what
    to do (an env-error: it says nothing about the bug, so a probe of it is unknown)."""
    program, why = own.missing_program, own.missing_program_why or "not found"
    if why in ("command not found", "not found"):
        fix = (
            "the job runs with the env's bin/ first on PATH (its python, torchrun, deepspeed and "
            "the other console scripts of the env's packages): install the package that provides "
            f"{program!r} into the env (PACKAGES=/REQUIREMENTS=), or call it by its full path or "
            "as `python -m <module>` (torchrun: `python -m torch.distributed.run`)"
        )
    elif "bad interpreter" in why:
        fix = "its first line names an interpreter that does not exist here: run it as `python <script>`"
    else:
        fix = "check the path in the command (relative to WORKDIR) and that the file is executable"
    return f"the command could not run in this env: {program!r}: {why} (exit {exit_code}); {fix}"


def first_parting_step(a: list[float | None], b: list[float | None]) -> int | None:
    """First index where two loss series part (a null never matches a number); None: they agree
    on every index both have (the ladder's rule, on the steps both runs logged)."""
    return ladder.first_divergent_step(a, b, TOLERANCE, missing_diverges=False)


def judge(
    own: Parsed,
    *,
    patch: str,
    exit_code: int | None,
    status: str | None,
    used_deepspeed: bool,
    fix_error: str | None = None,
    other: Parsed | None = None,
    other_clean: bool = False,
    device: str = "gpu",
    framework_dirs: tuple[str, ...] = (),
) -> Judgement:
    """One run. `other` is the parse of the same command with the other patch (None when it was
    not run); `other_clean` says whether that run ended clean (only then is it a control).
    `used_deepspeed`: some process imported DeepSpeed with the hook active (it reported).
    `framework_dirs`: the torch.distributed and DeepSpeed folders the hook saw imported; only an
    exception raised from a file there is the bug's (crash_signs.raised_in_framework)."""
    if status in ("hung", "interrupted"):
        why = "no output and no heartbeat within the stall limit, or the time limit reached"
        return ladder.status_judgement(status, why if status == "hung" else "stopped by the user")
    if patch == "fixed" and fix_error:
        return Judgement("unsupported", "none", f"the fix cannot patch this DeepSpeed: {fix_error}", None)
    exc = own.exception
    if exit_code in (126, 127) and own.missing_program:
        return Judgement("env-error", "none", not_started_reason(own, exit_code), None)
    if exit_code in (126, 127) or own.missing_module:
        what = f"no module named {own.missing_module!r}" if own.missing_module else f"exit {exit_code}"
        return Judgement("env-error", "none", f"the command could not run in this env: {what}", None)
    if exit_code not in (0, None) and own.address_in_use:
        held = f"the rendezvous port is in use ({own.address_in_use}): another process on this host holds it"
        fix = "drop the port the command sets (each run then gets a free MASTER_PORT) or pick a free one"
        return Judgement("env-error", "none", f"{held}; {fix}", None)
    unhooked = _unhooked(own, patch=patch, exit_code=exit_code, used_deepspeed=used_deepspeed, device=device)
    if unhooked:
        return Judgement("env-error", "none", unhooked, None)
    # A signed run's crash is the bug only when torch's or DeepSpeed's code raised it; results of a
    # runner from before signing (no hook_signed) are judged as then, by the exception's words.
    in_framework = not own.hook_signed or raised_in_framework(exc, framework_dirs)
    bug = ladder.crash(exc, "", own.illegal_work_messages, in_framework=in_framework)
    if bug is not None:
        return bug
    if exit_code not in (0, None) and own.missing_any_module:
        return Judgement("env-error", "none", missing_module_reason(own.missing_any_module, exit_code), None)
    tests = own.pytest
    missing = _missing_in_collection(tests)
    if exit_code not in (0, None) and missing:
        return Judgement("env-error", "none", missing_module_reason(missing, exit_code), None)
    if tests is not None and tests.get("collect_errors") and exit_code not in (0, None):
        first = tests["collect_errors"][0]
        why = f"pytest could not collect {first.get('nodeid') or 'the session'}: {first.get('message')}"
        return Judgement("crashed", "crash", f"exit code {exit_code}: {why}", None)
    if tests is not None and not tests.get("ran"):
        return Judgement(NO_EVIDENCE, "none", no_test_ran(tests, exit_code), None)
    tests_failed = tests is not None and exit_code == 1 and bool(_failed(tests))
    if exit_code not in (0, None) and not tests_failed:
        summary = f"{exc['type']}: {exc['message']}" if exc else "no Python exception in the log"
        why_not = _not_the_bug(exc)
        return Judgement("crashed", "crash", f"exit code {exit_code}: {summary}{why_not}", None)
    if not used_deepspeed:
        return Judgement(NO_EVIDENCE, "none", f"exit code {exit_code}; {NEVER_IMPORTED}", None)
    if tests is None and own.steps == 0 and not own.illegal_work_messages:
        return Judgement(NO_EVIDENCE, "none", f"exit code {exit_code}; {NO_STEP}", None)
    judged = bugs_path_only(_evidence(own, patch, other, other_clean), own)
    if tests is not None:
        judged = _with_tests(judged, tests, exit_code, other.pytest if other is not None else None)
    return judged


NO_EVIDENCE = "no-evidence"
NEVER_IMPORTED = "the command never imported DeepSpeed, so the bug cannot show: no evidence either way"
NO_STEP = (
    "no DeepSpeed optimizer step in any process (the hook counts DeepSpeedEngine.step), so the bug's "
    "path was never trained through: no evidence either way"
)
# How to tell a job's own noise from the bug, said wherever losses differ without the bug's path.
NOISE_HINT = (
    "to tell noise from the bug: run the fixed run twice (two fixed runs that differ are the job's own "
    "noise), or seed the job's data and initialisation (torch.manual_seed, a fixed sampler)"
)


def missing_module_reason(module: str, exit_code: int | None) -> str:
    return (
        f"the command could not run in this env: no module named {module!r} (exit {exit_code}); "
        f"install it into the env: PACKAGES={module} (or REQUIREMENTS=<file>; the package's name on "
        "PyPI may differ from the module's), or run from the folder that holds it (WORKDIR=)"
    )


def _missing_in_collection(tests: PytestSummary | None) -> str | None:
    """The module whose absence kept pytest from collecting a test module (pytest prints no
    Python traceback for it, only its own report)."""
    for error in (tests.get("collect_errors") if tests else None) or []:
        m = _NO_MODULE.search(str(error.get("message") or ""))
        if m and "No module named" in str(error.get("message")):
            return m["name"].split(".")[0]
    return None


def _failed(tests: PytestSummary) -> int:
    counts = tests.get("counts") or {}
    return int(counts.get("failed") or 0) + int(counts.get("error") or 0)


def _counts_text(tests: PytestSummary) -> str:
    counts = tests.get("counts") or {}
    order = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
    said = ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))
    return said or "no test collected"


def no_test_ran(tests: PytestSummary, exit_code: int | None) -> str:
    """A pytest session that ran no test: what it did instead, with pytest's own reasons."""
    reasons: dict[str, int] = {}
    for entry in (tests.get("tests") or {}).values():
        if entry.get("outcome") == "skipped":
            why = str(entry.get("message") or "no reason given")
            reasons[why] = reasons.get(why, 0) + 1
    top = "; ".join(f"{why!r} x{n}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:3])
    what = f"pytest ran no test ({_counts_text(tests)}; pytest exit {tests.get('exitstatus', exit_code)})"
    return f"{what}{': ' + top if top else ''}: no evidence either way"


def _with_tests(
    judged: Judgement, tests: PytestSummary, exit_code: int | None, other: PytestSummary | None
) -> Judgement:
    """A pytest session's judgement says its counts and, beside the other patch's session, which
    tests changed; tests that failed with no sign of the bug make the session "crashed"."""
    words = f"pytest: {_counts_text(tests)}"
    failed = [
        (tid, e) for tid, e in (tests.get("tests") or {}).items() if e.get("outcome") in ("failed", "error")
    ]
    if failed:
        tid, entry = failed[0]
        words += f" (first: {tid}: {entry.get('message') or entry.get('outcome')})"
    notes = [*judged.notes]
    changed = tests_that_differ(tests, other) if other is not None else []
    if changed:
        shown = ", ".join(f"{tid} {a}->{b}" for tid, a, b in changed[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        notes.append(f"tests whose outcome differs between this session and the other patch's: {shown}{more}")
    if judged.outcome == "clean" and failed:
        return Judgement("crashed", "crash", f"exit code {exit_code}: {words}", None, tuple(notes))
    return replace(judged, reason=f"{judged.reason}; {words}", notes=tuple(notes))


def tests_that_differ(own: PytestSummary, other: PytestSummary) -> list[tuple[str, str, str]]:
    """(test id, its outcome here, its outcome in the other session) for tests both ran differently."""
    mine, theirs = own.get("tests") or {}, other.get("tests") or {}
    return [
        (tid, str(mine[tid].get("outcome")), str(theirs[tid].get("outcome")))
        for tid in mine
        if tid in theirs and mine[tid].get("outcome") != theirs[tid].get("outcome")
    ]


def bugs_path_only(judged: Judgement, own: Parsed) -> Judgement:
    """The bug's name needs the bug's evidence: an own job whose losses part from its other run's,
    or that overflows more, without any IllegalWork seen (the hook's count from DeepSpeed's logger,
    the bug's own path) differs, but not by the bug: a user's job is often not deterministic."""
    if judged.outcome != "reproduced" or own.illegal_work_messages:
        return judged
    if judged.signature not in ("divergence", "overflow-storm"):
        return judged
    reason = (
        f"differs, not the bug's path: {judged.reason}; no IllegalWork seen, so DeepSpeed never waited "
        f"on the lost gather; {NOISE_HINT}"
    )
    return replace(judged, outcome=NO_EVIDENCE, reason=reason)


def _not_the_bug(exc: RecordedException | None) -> str:
    """Why a crash that names IllegalWork is not counted as the bug ("" for any other crash)."""
    if not (raised_from_illegal_work(exc) or lost_coalesced_work(exc)):
        return ""
    where = raising_file(exc) or "no frame in its traceback"
    return (
        f" (it names the bug's error, but the frame that raised it is not torch.distributed's or "
        f"DeepSpeed's: {where}; not counted as the bug)"
    )


def _unhooked(own: Parsed, *, patch: str, exit_code: int | None, used_deepspeed: bool, device: str) -> str:
    """Why the run says nothing about the fix when no hooked process imported DeepSpeed: the job
    replaced the hook's way in (or ran Python with -S). A fixed run whose log shows DeepSpeed at work
    unhooked ran without the fix; a CPU run that failed using DeepSpeed ran without the CPU shims.
    "" when the hook was not needed or reached DeepSpeed."""
    if used_deepspeed:
        return ""
    failed = exit_code not in (0, None)
    hint = (
        " (it was started with -S, or the hook's site-packages .pth could not be written: "
        "see hook_pth in the job's job.json)"
    )
    # Only where DeepSpeed was at work: a run that failed before importing it (a bad argument, a
    # name that does not resolve) failed the same way stock or fixed, and is judged like stock.
    if patch == "fixed" and own.mentions_deepspeed:
        return f"the fix could not be applied: {NO_HOOKED_DEEPSPEED}{hint}"
    if device == "cpu" and failed and own.mentions_deepspeed:
        return f"the CPU shims could not be installed: {NO_HOOKED_DEEPSPEED}{hint}"
    return ""


def _evidence(own: Parsed, patch: str, other: Parsed | None, other_clean: bool) -> Judgement:
    # A pytest session is weighed by its tests: no losses there is not worth a note.
    session = own.pytest is not None
    notes = [] if own.losses or session else ["no losses found in the output (set LOSS_REGEX= to name them)"]
    control = other if (patch == "stock" and other is not None and other_clean) else None
    evidence = ladder.Evidence(
        illegal_work=own.illegal_work_messages,
        losses=own.losses,
        skipped_steps=own.skipped_steps,
        control=ladder.Control(control.losses, control.skipped_steps) if control is not None else None,
        tolerance=TOLERANCE,
        words=ladder.JOB_WORDS,
        missing_diverges=False,
        non_finite_beside_control=True,
        illegal_work_source=_corroboration(own),
        none_source=" from DeepSpeed" if own.hook_signed else "",
    )
    compared = (
        "losses match the fixed run's"
        if control is not None and own.losses
        else ""
        if session and not own.losses
        else f"{len(own.losses)} finite losses"
    )
    return ladder.weigh(evidence, compared=compared, notes=notes)


def _corroboration(own: Parsed) -> str:
    """What stands beside the hook's count: the log's lines, which corroborate and never count."""
    if not own.hook_signed:
        return ""
    return f" counted by the hook (the job's log shows {own.illegal_work_in_log}: corroboration)"


def patterns_used(parsed: Parsed, loss_regex: str | None) -> Patterns:
    """What decided, for the record: the loss pattern (name and text) and the message patterns."""
    loss_text = (
        loss_regex if parsed.loss_pattern == "custom" else LOSS_PATTERNS.get(parsed.loss_pattern or "")
    )
    return {
        "loss": {"name": parsed.loss_pattern, "regex": loss_text},
        "illegal_work": ILLEGAL_WORK_FAILURE,
        "overflow": {name: OVERFLOW_PATTERNS[name] for name in parsed.overflow_patterns},
    }
