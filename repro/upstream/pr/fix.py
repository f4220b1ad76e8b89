"""The fix, the test and the callers at one DeepSpeed commit: pure functions over file texts.

The changed files are made by `repro.workload.fix.patched_source`, the splice the run-time fix and
patches/deepspeed-*.patch use, so the branch cannot drift from what the lab verifies. What does not
apply is named with its file and line (the class, the method, or a syntax error's position).
"""

from __future__ import annotations

import ast
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from repro.core.errors import (
    FixDoesNotApplyError as FixDoesNotApplyError,  # re-exported: callers name it here
)
from repro.core.paths import REPO_ROOT
from repro.upstream.bundle.source_refs import find_method
from repro.workload import fix
from repro.workload.closed import assert_never

# The regression test, at the same path under DeepSpeed's tests/ as under patches/pr/tests/.
TEST_REL = PurePosixPath("tests/unit/runtime/zero/test_mics_coalesced_wait.py")
TEST_SOURCE = REPO_ROOT / "patches" / "pr" / TEST_REL
FUNCTION = "all_gather_coalesced"
MICS = "deepspeed/runtime/zero/mics.py"


@dataclass(frozen=True)
class Where:
    path: str
    line: int | None
    reason: str

    def label(self) -> str:
        return f"{self.path}:{self.line}" if self.line else self.path


def _class_line(source: str, cls: str) -> int | None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    return next((n.lineno for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)


def changed_files(read: Mapping[str, str | None]) -> dict[str, str]:
    """path -> new text for every file the fix changes. `read` maps each target path to its text at
    REF (None: the file does not exist there). Raises FixDoesNotApplyError naming every place."""
    problems: list[Where] = []
    out: dict[str, str] = {}
    unchanged = True
    for path in sorted({t.path for t in fix.TARGETS}):
        targets = tuple(t for t in fix.TARGETS if t.path == path)
        source = read.get(path)
        if source is None:
            problems.append(Where(path, None, "the file does not exist at REF"))
            continue
        try:
            splices = [fix.locate(source, t) for t in targets]
            out[path] = fix.patched_source(source, targets)
        except SyntaxError as exc:
            problems.append(Where(path, exc.lineno, f"does not parse: {exc.msg}"))
            continue
        except fix.FixNotApplicableError as exc:
            cls = next((t.cls for t in targets if t.cls in exc.reason), targets[0].cls)
            line = _class_line(source, cls)
            where = f"class {cls} (line {line})" if line else f"no class {cls}"
            reason = exc.reason.replace(f"{path} ", "", 1)  # the label names the file already
            problems.append(Where(path, line, f"{reason}; {where}"))
            continue
        unchanged = unchanged and all(splice.unchanged for splice in splices)
    if problems:
        raise FixDoesNotApplyError(
            "the fix does not apply at REF",
            why="; ".join(f"{p.label()}: {p.reason}" for p in problems),
            fix="choose a REF that still has MiCS and TorchBackend.all_gather_coalesced "
            "(e.g. a v0.19.6 tag or a commit before MiCS was removed)",
        )
    if unchanged:
        raise FixDoesNotApplyError(
            "REF already holds the fix",
            why=", ".join(f"{t.path}: {t.qualname}" for t in fix.TARGETS) + " already have its statements",
            fix="nothing to commit: choose an older REF",
        )
    return out


def wait_swallows(source: str) -> bool:
    """Whether MiCS_AllGatherCoalescedHandle.wait in this mics.py catches the failed wait."""
    target = next(t for t in fix.TARGETS if t.path == MICS)
    wait = find_method(ast.parse(source), target.cls, target.func)
    return wait is not None and any(isinstance(n, ast.Try) for n in ast.walk(wait))


# -- callers -----------------------------------------------------------------------------------------
class CallerKind(enum.Enum):
    DEFINITION = "definition"
    FORWARD = "forward"  # deepspeed.comm's wrapper handing the call to the backend
    CALL = "call"  # a call of deepspeed.comm's all_gather_coalesced
    IMPORT = "import"  # `from deepspeed.comm import all_gather_coalesced`: bare calls in that file are calls
    SAME_NAME = "same-name"  # another function of that name (ZeRO-3's param method) or a comment

    @property
    def words(self) -> str:
        if self is CallerKind.DEFINITION:
            return "defines it (deepspeed.comm or its backend)"
        if self is CallerKind.FORWARD:
            return "deepspeed.comm forwards to the backend"
        if self is CallerKind.CALL:
            return "calls deepspeed.comm.all_gather_coalesced"
        if self is CallerKind.IMPORT:
            return "imports it from deepspeed.comm"
        if self is CallerKind.SAME_NAME:
            return "not this function: another of the same name (ZeRO-3's parameter method), or a comment"
        assert_never(self)


@dataclass(frozen=True)
class Caller:
    path: str
    line: int
    text: str
    kind: CallerKind
    function: str | None = None  # the function holding the line (filled for mics.py's callers)


def enclosing_function(source: str, line: int) -> str | None:
    """The innermost function whose lines hold `line` (None when none does or it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    best: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end and (best is None or node.lineno >= best.lineno):
                best = node
    return best.name if best else None


_DEF = re.compile(rf"^\s*def\s+{FUNCTION}\s*\(")
_FORWARD = re.compile(rf"\bcdb\.{FUNCTION}\s*\(")
_QUALIFIED = re.compile(rf"\b(?:dist|comm|deepspeed\.comm)\.{FUNCTION}\s*\(")
_BARE = re.compile(rf"(?<![.\w]){FUNCTION}\s*\(")
_IMPORT = re.compile(rf"^\s*from\s+deepspeed(?:\.comm){{1,2}}\s+import\b.*\b{FUNCTION}\b")


def classify(path: str, text: str, imported: bool = False) -> CallerKind:
    """What one line that names the function does. A bare `all_gather_coalesced(` is deepspeed.comm's
    only where the file imports it from there (`imported`); ZeRO-3's partition_parameters.py has a
    local function of that name that calls itself."""
    if text.strip().startswith("#"):
        return CallerKind.SAME_NAME
    if _DEF.match(text):
        # Only deepspeed.comm's and its backends' are the changed function; ZeRO-3's parameter
        # method of the same name (partition_parameters.py) is another one.
        return CallerKind.DEFINITION if path.startswith("deepspeed/comm/") else CallerKind.SAME_NAME
    if _IMPORT.match(text):
        return CallerKind.IMPORT
    if path.startswith("deepspeed/comm/") and _FORWARD.search(text):
        return CallerKind.FORWARD
    if _QUALIFIED.search(text) or (imported and _BARE.search(text)):
        return CallerKind.CALL
    return CallerKind.SAME_NAME


def parse_grep(output: str, sha: str) -> tuple[Caller, ...]:
    """`git grep -n -w all_gather_coalesced <sha> -- deepspeed/` lines: `<sha>:<path>:<line>:<text>`."""
    rows = []
    prefix = f"{sha}:"
    for raw in output.splitlines():
        if not raw.startswith(prefix):
            continue
        path, _, rest = raw[len(prefix) :].partition(":")
        line, _, text = rest.partition(":")
        if line.isdigit():
            rows.append((path, int(line), text.rstrip()))
    importing = {path for path, _, text in rows if _IMPORT.match(text)}
    defining = {path for path, _, text in rows if _DEF.match(text)}  # a local function shadows the import
    return tuple(
        Caller(path, line, text, classify(path, text, path in importing and path not in defining))
        for path, line, text in rows
    )


def callers_outside_mics(callers: tuple[Caller, ...]) -> tuple[Caller, ...]:
    return tuple(c for c in callers if c.kind is CallerKind.CALL and c.path != MICS)
