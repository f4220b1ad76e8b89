"""pr-verify's third step: DeepSpeed's own MiCS tests, run the way DeepSpeed's CPU CI runs them.

A maintainer asks two things of the PR: does the change make our own skipped MiCS test pass, and
does the new test run in our CI as it is? The lab's checks and its stand-in harness
(patches/pr/harness) cannot answer that; DeepSpeed's own harness can. For REF and for the branch:

- the commit's files (`git archive`, DS_REPO untouched) in a folder: `deepspeed/`, `csrc/` (the
  CPU accelerator compiles its shared-memory op from it), `tests/` with DeepSpeed's own
  `conftest.py` and `unit/common.py`, and what `setup.py` reads. The branch's regression test is
  copied into REF's tree (it must fail there), and `test_mics_optimizer.py`'s module-level
  torch-2.1 skip is removed on both sides (our edit of the exported copy, named in verify.json);
- DeepSpeed installed from the tree (`--deepspeed-src`: built with DS_BUILD_OPS=0 and pip-installed
  into a layer over the env's venv, repro/bisect/source_overlay.py), as upstream's CI runs
  `pip install .` first: its metadata, `git_version_info_installed.py` and scripts are the commit's;
- the pytest packages REF's `requirements/requirements-dev.txt` names (DeepSpeed pins pytest
  < 8.4: pytest 9's reports break pytest-forked), in a job layer over that one;
- the pytest flags of REF's `.github/workflows/cpu-torch-latest.yml` (`--forked -n 4`) with
  `--torch_ver=<major.minor>`, in `tests/`, through the lab's front door (`python -m repro run`),
  so each session has a signed record with each test id's outcome (repro/workload/pytest_outcomes.py).

DeepSpeed's `tests/conftest.py` then puts the tree first on sys.path, so the tree's `deepspeed/` is
the one the tests import, as in upstream's CI (the installed copy holds the same files). Each side
runs twice: on plain gloo (`TRANSPORT=plain`, no lab adapter: what upstream's CPU CI has) and on
the lab's adapter (`async`: the NCCL-like coalescing semantics).
A test that hangs past DeepSpeed's own timeout is stopped by the lab's stall limit (STALL_S); the
session's tests are then read from pytest's verbose lines, the hung one as "unfinished"
(read_session).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, TypedDict, cast

from repro.core import cmd, console, results
from repro.core.errors import RunError, UsageError
from repro.upstream.pr import fix as pr_fix
from repro.upstream.pr.out_folders import fresh_folder, log_path
from repro.workload.pytest_outcomes import BARE_LOCATION, RAISED_LINE

# What a tree needs for DeepSpeed's harness on CPU and for `pip install .` (setup.py reads its
# README.md, bin/ scripts and requirements/); the two files below say how upstream runs it.
TREE_PATHS = (
    *("deepspeed", "accelerator", "op_builder", "csrc", "tests", "version.txt", "requirements"),
    *("setup.py", "setup.cfg", "MANIFEST.in", "README.md", "bin"),
)
WORKFLOW = ".github/workflows/cpu-torch-latest.yml"
REQUIREMENTS_DEV = "requirements/requirements-dev.txt"
# master's cpu-torch-latest.yml at edaa72212, for a REF that has no such workflow (said in verify.json)
DEFAULT_FLAGS = ("--forked", "-n", "4")
DEFAULT_PACKAGES = ("pytest>=7.2.0,<8.4.0", "pytest-forked", "pytest-xdist")
OPTIMIZER_TEST = "tests/unit/checkpoint/test_mics_optimizer.py"
# The files the lab's edits of an exported tree write (UpstreamSuite.trees): the regression test
# copied into REF's tree, the optimizer test without its skip and with its data dtype.
EDITED = (str(pr_fix.TEST_REL), OPTIMIZER_TEST)
# DeepSpeed's MiCS tests: (file under the tree, the class; None for the whole file).
MICS_TESTS: tuple[tuple[str, str | None], ...] = (
    (str(pr_fix.TEST_REL), None),
    (OPTIMIZER_TEST, None),
    ("tests/unit/runtime/zero/test_zero_context.py", "TestMiCSGatheredParametersFree"),
    ("tests/unit/v1/zero/test_zero.py", "TestZero3RepeatForwardLoop"),
)
# The transports a side runs on: upstream's CI (plain gloo) and the lab's adapter.
TRANSPORTS = ("plain", "async")
SIDES = ("ref", "branch")
# 2: the key holds the bytes of the files the lab's edits wrote (EDITED), not only the edits' names.
# 3: DeepSpeed pip-installed from the tree into a layer (INSTALL), no longer only shadowing the env's.
CACHE_FORMAT = 3
# How each side's DeepSpeed reaches the session (`repro run --deepspeed-src`, SourceOverlay).
INSTALL = (
    "each side's tree pip-installed into a layer over the env (`pip install --no-build-isolation "
    "--no-deps`, DS_BUILD_OPS=0: no compiled ops, the env's dependencies), as upstream's CI's "
    "`pip install .`; pytest's packages in a layer over that one"
)


@dataclass(frozen=True)
class SuiteCall:
    """One pytest session of DeepSpeed's harness: a side's tree, a stack's env, a transport."""

    env: str
    torch: str
    side: str
    commit: str
    transport: str
    tree: Path
    argv: tuple[str, ...]  # pytest's arguments after `python -m pytest`, run in tree/tests
    packages: tuple[str, ...]
    out: Path
    engine: str = "venv"

    def command(self) -> str:
        return "cd tests && python -m pytest " + " ".join(shlex.quote(a) for a in self.argv)

    def key(self, edits: Sequence[str]) -> str:
        """What decides the session: the commit, the stack, the command and the files the lab's
        edits wrote, by their bytes (a change in how an edit is written is a new session)."""
        what: list[Any] = [CACHE_FORMAT, self.env, self.torch, self.engine, self.commit, self.transport]
        what += [list(self.argv), list(self.packages), list(edits)]
        for rel in EDITED:
            path = self.tree / rel
            what.append(hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None)
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:20]


# What REF's CPU CI installs (workflow_torches).
class CiTorches(TypedDict):
    default: str | None
    presets: list[str]


# One test's end in a session: pytest's outcome ("unfinished": started, never ended) and message.
class TestSeen(TypedDict):
    outcome: str
    message: str


# A session as verify.json keeps it (session_summary, read_session; cached as it is).
class Session(TypedDict, total=False):
    outcome: str | None
    signature: str | None
    reason: str
    illegal_work_messages: int | None
    counts: dict[str, int]
    exitstatus: int | None
    tests: dict[str, TestSeen]
    collect_errors: list[dict[str, str]]
    from_log: bool  # pytest never reported: the outcomes are its verbose lines
    folder: str
    side: str
    transport: str


# One test id across a stack's sessions: {transport: {side: outcome}}.
class SuiteRow(TypedDict):
    test: str
    cells: dict[str, dict[str, str]]


# A stack's entry in verify.json's `suite` (UpstreamSuite.run).
class SuiteEntry(TypedDict, total=False):
    stack: str
    env: str
    torch: str
    command: str
    flags: list[str]
    packages: list[str]
    flags_from: str
    packages_from: str
    install: str  # how each side's DeepSpeed was installed (INSTALL)
    edits: list[str]
    missing: list[str]
    sessions: list[Session]
    upstream_torches: CiTorches
    rows: list[SuiteRow]
    regression: dict[str, dict[str, Any]]  # transport: {"ok": bool | None, "why": str}
    why: str


SuiteRunner = Callable[[SuiteCall], Session]  # -> the session's summary (session_summary)


def remove_module_skip(text: str) -> tuple[str, str | None]:
    """The test file without its module-level `if ...: pytest.skip(..., allow_module_level=True)`,
    and the removed lines (None when the file holds no such skip)."""
    lines = text.splitlines(keepends=True)
    for i in range(len(lines) - 1):
        guard, skip = lines[i], lines[i + 1]
        if (
            guard.startswith("if ")
            and skip.lstrip().startswith("pytest.skip(")
            and "allow_module_level" in skip
        ):
            removed = guard + skip
            return "".join(lines[:i] + lines[i + 2 :]), removed.rstrip("\n")
    return text, None


CHECKPOINT_HELPER = "checkpoint_correctness_verification"
CHECKPOINT_COMMON = "tests/unit/checkpoint/common.py"
FP16_CONFIG = re.compile(r'"fp16"\s*:\s*\{\s*"enabled"\s*:\s*True')


def defaults_to_preferred_dtype(common: str) -> bool:
    """Whether the harness's checkpoint helper takes its data's dtype from `preferred_dtype()`
    when none is given (DeepSpeed #5206 on; before, `fp16=True` meant half data)."""
    try:
        tree = ast.parse(common)
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == CHECKPOINT_HELPER:
            params = [a.arg for a in node.args.args + node.args.kwonlyargs]
            return "dtype" in params and "preferred_dtype()" in ast.unparse(node)
    return False


def align_data_dtype(test: str, common: str) -> tuple[str, int]:
    """`test_mics_optimizer.py` with `dtype=torch.float16` given to each checkpoint helper call
    that gives none, and how many calls changed (0: the text unchanged).

    Why: its config trains in fp16, but since #5206 the helper's data is `preferred_dtype()`,
    bf16 wherever bf16 is supported (every CPU, most GPUs), so the un-skipped test fails on
    `mat1 and mat2 must have the same dtype` before MiCS is exercised. Only where the helper has
    that default (`defaults_to_preferred_dtype`) and the test's config enables fp16."""
    if not defaults_to_preferred_dtype(common) or not FP16_CONFIG.search(test):
        return test, 0
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return test, 0
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == CHECKPOINT_HELPER
        and not any(k.arg == "dtype" for k in node.keywords)
    ]
    lines = test.splitlines(keepends=True)
    for call in sorted(calls, key=lambda c: (c.end_lineno or 0, c.end_col_offset or 0), reverse=True):
        _add_dtype(lines, call, test)
    text = "".join(lines)
    if calls and not re.search(r"^import torch$", text, re.MULTILINE):
        text = re.sub(r"^(import deepspeed\n)", r"\1import torch\n", text, count=1, flags=re.MULTILINE)
    return text, len(calls)


# DeepSpeed's yapf style (its .style.yapf): a call that outgrows the line puts one argument per
# line, aligned after the opening parenthesis.
DS_COLUMN_LIMIT = 119
DTYPE_ARGUMENT = "dtype=torch.float16"


def _add_dtype(lines: list[str], call: ast.Call, source: str) -> None:
    """`lines` with DTYPE_ARGUMENT last in `call`; a one-line call that would outgrow DeepSpeed's
    column limit is written as its yapf would write it."""
    row, col = (call.end_lineno or 1) - 1, (call.end_col_offset or 1) - 1  # the closing paren
    line = lines[row]
    added = line[:col] + ", " + DTYPE_ARGUMENT + line[col:]
    if call.lineno != call.end_lineno or len(added.rstrip("\n")) <= DS_COLUMN_LIMIT:
        lines[row] = added
        return
    start = call.func.col_offset if isinstance(call.func, ast.Name) else call.col_offset
    opening = line.index("(", start) + 1
    arguments = [ast.get_source_segment(source, node) or "" for node in (*call.args, *call.keywords)]
    arguments.append(DTYPE_ARGUMENT)
    indent = " " * opening
    lines[row] = line[:opening] + (",\n" + indent).join(arguments) + line[col:]


def pytest_flags(workflow: str | None) -> tuple[tuple[str, ...], str]:
    """The flags of the workflow's first `pytest ... unit/` line (shell variables dropped), and
    where they came from."""
    for line in (workflow or "").splitlines():
        words = line.split()
        if "pytest" in words and "unit/" in words:
            flags = words[words.index("pytest") + 1 : words.index("unit/")]
            kept = tuple(w for w in flags if not w.startswith("$"))
            return kept, f"{WORKFLOW} at REF: {' '.join(kept)}"
    return DEFAULT_FLAGS, f"REF has no {WORKFLOW}: the flags of master's ({' '.join(DEFAULT_FLAGS)})"


def workflow_torches(workflow: str | None) -> CiTorches:
    """The torch releases REF's CPU CI installs: its default preset and every preset it lists
    (`DEFAULT_TORCH_PRESET: '2.10.0-cpu'`, `torch_install_version='2.7.1'`)."""
    text = workflow or ""
    default = re.search(r"DEFAULT_TORCH_PRESET:\s*['\"]?(\d+(?:\.\d+)+)", text)
    presets = sorted(
        set(re.findall(r"torch_install_version=['\"]?(\d+(?:\.\d+)+)", text)),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )
    return {"default": default.group(1) if default else None, "presets": presets}


def pytest_packages(requirements: str | None) -> tuple[tuple[str, ...], str]:
    """The pytest lines of REF's requirements-dev.txt (pytest and its plugins, as pinned there)."""
    found = []
    for line in (requirements or "").splitlines():
        line = line.split("#", 1)[0].strip()
        name = re.split(r"[<>=!~; \[]", line, maxsplit=1)[0].lower()
        if name == "pytest" or name.startswith("pytest-"):
            found.append(line.replace(" ", ""))
    if not any(re.split(r"[<>=!~;\[]", p, maxsplit=1)[0].lower() == "pytest" for p in found):
        return DEFAULT_PACKAGES, f"REF has no pytest pin in {REQUIREMENTS_DEV}: {' '.join(DEFAULT_PACKAGES)}"
    return tuple(found), f"{REQUIREMENTS_DEV} at REF: {' '.join(found)}"


def node_ids(tree: Path) -> tuple[list[str], list[str]]:
    """pytest node ids (relative to tests/) of the MiCS tests this tree holds, and what it lacks."""
    present, missing = [], []
    for rel, cls in MICS_TESTS:
        path = tree / rel
        text = path.read_text(errors="replace") if path.is_file() else ""
        if not text or (cls and not re.search(rf"^class {re.escape(cls)}\b", text, re.M)):
            missing.append(f"{rel}{'::' + cls if cls else ''}")
            continue
        node = str(PurePosixPath(rel).relative_to("tests"))
        present.append(f"{node}::{cls}" if cls else node)
    return present, missing


def torch_ver(torch: str) -> str:
    """What upstream passes as --torch_ver: major.minor (their conftest compares that deep)."""
    return ".".join(torch.split("+")[0].split(".")[:2])


def session_summary(record: Mapping[str, Any]) -> Session:
    """What verify.json keeps of a session's run record: the lab's verdict and pytest's own word."""
    pytest = (record.get("job") or {}).get("pytest") or {}
    tests: dict[str, TestSeen] = {
        str(test): {"outcome": str(t.get("outcome")), "message": str(t.get("message") or "")[:300]}
        for test, t in (pytest.get("tests") or {}).items()
    }
    return {
        "outcome": record.get("outcome"),
        "signature": record.get("signature"),
        "reason": str(record.get("reason") or "")[:600],
        "illegal_work_messages": record.get("illegal_work_messages"),
        "counts": dict(pytest.get("counts") or {}),
        "exitstatus": pytest.get("exitstatus"),
        "tests": tests,
        "collect_errors": list(pytest.get("collect_errors") or []),
    }


# DeepSpeed's harness stops a hung test itself after DS_UNITTEST_TIMEOUT (600 s by default,
# tests/unit/common.py) and reports it failed; the lab's stall limit must leave it that time.
HARNESS_TIMEOUT_S = 600
STALL_S = HARNESS_TIMEOUT_S + 120
SESSION_S = 4 * 3600
# pytest's verbose line for a test's end (DeepSpeed's conftest sets verbose): "[gw1] [ 42%] FAILED id"
_VERBOSE_END = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(unit/\S+::\S+)")
_VERBOSE_END_ALONE = re.compile(r"^(unit/\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
# A start line may run into another process's output (a resource_tracker warning) on the same line.
_VERBOSE_START = re.compile(r"^(unit/\S+::\S+)(\s|$)")
# A failure section's title line, "_____ TestA.test_b[1] _____" (its exception lines: RAISED_LINE)
_SECTION = re.compile(r"^_{3,} (\S.*?) _{3,}$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def outcomes_from_log(text: str) -> dict[str, TestSeen]:
    """Each test's outcome from pytest's verbose lines, for a session stopped before pytest could
    report (the lab's time limit): a test that started and never ended is "unfinished". A failed
    test's message is the last exception line (`E   Name: words`) of its failure section."""
    tests: dict[str, TestSeen] = {}
    raised: dict[str, str] = {}  # failure section's title ("TestA.test_b[1]") -> its last E line
    section = None
    for line in _ANSI.sub("", text).splitlines():
        title = _SECTION.match(line)
        if title:
            section = title.group(1)
            continue
        if section and RAISED_LINE.match(line):
            raised[section] = " ".join(line[1:].split())
        ended = _VERBOSE_END.search(line)
        alone = _VERBOSE_END_ALONE.match(line.lstrip())  # without -n: "unit/x.py::t PASSED [ 50%]"
        said = (
            (ended.group(2), ended.group(1)) if ended else (alone.group(1), alone.group(2)) if alone else None
        )
        if said:
            test, word = said
            outcome = {"xfail": "xfailed", "xpass": "xpassed"}.get(word.lower(), word.lower())
            tests[test] = {"outcome": outcome, "message": ""}
            continue
        started = _VERBOSE_START.match(line.lstrip())
        if started and started.group(1) not in tests:
            tests[started.group(1)] = {"outcome": "unfinished", "message": "started, never ended"}
    for test, entry in tests.items():
        if entry["outcome"] in ("failed", "error"):
            entry["message"] = raised.get(test.split("::", 1)[-1].replace("::", "."), "")
    return tests


def front_door_session(call: SuiteCall) -> Session:
    """The session as a user runs it: `python -m repro run` with the tree as WORKDIR."""
    argv = [sys.executable, "-m", "repro", "run", "--env", call.env, "--engine", call.engine]
    argv += ["--cmd", call.command(), "--workdir", str(call.tree), "--patch", "stock"]
    argv += ["--transport", call.transport, "--packages", " ".join(call.packages), "--out", str(call.out)]
    argv += ["--deepspeed-src", str(call.tree)]  # INSTALL
    argv += ["--stall-timeout", str(STALL_S), "--timeout", str(SESSION_S)]
    call.out.parent.mkdir(parents=True, exist_ok=True)
    log = log_path(call.out)
    result = cmd.run(argv, tee=log)
    seen = read_session(call.out)
    if seen is None:
        raise RunError(
            f"DeepSpeed's tests ({call.side}, {call.transport}, torch {call.torch}) left no record "
            f"(exit {result.returncode})",
            why=result.tail(8),
            fix=f"read {log}",
        )
    return seen


def read_session(out: Path) -> Session | None:
    """A session's summary from its `repro run` folder (None without a record). Tests pytest never
    reported come from its verbose lines: all of them when the lab stopped the session before
    pytest could report, and a test that started and never ended ("unfinished") in any case (an
    interrupted pytest reports only the tests that ended)."""
    try:
        runs = results.load(out)["runs"]
    except UsageError:  # missing or damaged: no record
        runs = []
    if not runs:
        return None
    seen = session_summary(runs[0])
    logs = sorted(out.glob("*/custom-stock/job.log"))
    shown = outcomes_from_log(logs[0].read_text(errors="replace")) if logs else {}
    seen["from_log"] = not seen["tests"] and bool(shown)
    for test, said in shown.items():
        if test not in seen["tests"] and (seen["from_log"] or said["outcome"] == "unfinished"):
            seen["tests"][test] = said
        elif (
            test in seen["tests"] and BARE_LOCATION.match(seen["tests"][test]["message"]) and said["message"]
        ):
            seen["tests"][test]["message"] = said["message"]  # a report rebuilt without its words
    counts: dict[str, int] = {}
    for said in seen["tests"].values():
        counts[said["outcome"]] = counts.get(said["outcome"], 0) + 1
    seen["counts"] = counts
    return seen


def compare(sessions: Sequence[Session]) -> list[SuiteRow]:
    """One row per test id: its outcome at REF and on the branch for each transport."""
    rows: dict[str, SuiteRow] = {}
    for s in sessions:
        for test, seen in (s.get("tests") or {}).items():
            row = rows.setdefault(test, {"test": test, "cells": {}})
            row["cells"].setdefault(s["transport"], {})[s["side"]] = seen["outcome"]
    return [rows[t] for t in sorted(rows)]


def regression_words(rows: Sequence[SuiteRow], transport: str) -> tuple[bool | None, str]:
    """Whether the PR's regression test fails at REF and passes on the branch on `transport`."""
    name = PurePosixPath(pr_fix.TEST_REL).name
    mine = [r for r in rows if name in r["test"]]
    cells = [r["cells"].get(transport) or {} for r in mine]
    if not mine:
        return None, "no session ran it"
    # A session the lab stopped (a deadlock, the stall limit) never started the tests after the
    # hung one, and pytest-randomly (DeepSpeed's dev requirements) orders each session its own way.
    unseen = [
        f"{'REF' if side == 'ref' else 'the branch'}'s session never started {n} of {len(mine)}"
        for side in SIDES
        if (n := sum(1 for c in cells if side not in c))
    ]
    if unseen:
        return None, f"not run on both sides ({'; '.join(unseen)})"
    ref_bad = [f"{_short(r['test'])} {c['ref']}" for r, c in zip(mine, cells) if c["ref"] != "failed"]
    branch_bad = [
        f"{_short(r['test'])} {c['branch']}" for r, c in zip(mine, cells) if c["branch"] != "passed"
    ]
    if not ref_bad and not branch_bad:
        return True, f"all {len(mine)} fail at REF and pass on the branch"
    words = [f"{len(ref_bad)} of {len(mine)} do not fail at REF ({', '.join(ref_bad)})"] if ref_bad else []
    if branch_bad:
        words.append(f"{len(branch_bad)} of {len(mine)} do not pass on the branch ({', '.join(branch_bad)})")
    return False, "; ".join(words)


def _short(test: str) -> str:
    """`unit/x.py::TestA::test_b[1]` -> `TestA::test_b[1]`."""
    return test.split("::", 1)[-1]


@dataclass(frozen=True)
class Trees:
    """REF's and the branch's exported trees with the lab's edits, and what REF says of its CI."""

    ref: Path
    branch: Path
    edits: list[str]  # each edit of the exported copies, in words
    unskipped: dict[str, str]  # side: the skip removed
    aligned: dict[str, int]  # side: calls given dtype=torch.float16
    flags: tuple[str, ...]
    flags_from: str
    packages: tuple[str, ...]
    packages_from: str
    tests: list[str]  # node ids, relative to tests/
    missing: list[str]
    upstream_torches: CiTorches

    def side(self, side: str) -> Path:
        return self.ref if side == "ref" else self.branch


class UpstreamSuite:
    """DeepSpeed's harness over REF's and the branch's trees for one stack (torch)."""

    def __init__(
        self,
        pr: Mapping[str, Any],
        ds_repo: str,
        folder: Path,
        export: Callable[[str, str, Path, Sequence[str]], Path],  # pr_verify.export_tree
        engine: str = "venv",
        runner: SuiteRunner = front_door_session,
        cache: Any = None,
    ) -> None:
        self.pr, self.ds_repo, self.folder, self.engine = pr, ds_repo, folder, engine
        self.runner, self.cache, self.export = runner, cache, export
        self._trees: Trees | None = None

    def trees(self) -> Trees:
        """REF's and the branch's trees, exported once, with the lab's two edits."""
        if self._trees is not None:
            return self._trees
        where = self.folder / "suite-trees"
        shutil.rmtree(where, ignore_errors=True)
        ref = self.export(self.ds_repo, self.pr["ref_sha"], where / "ref", TREE_PATHS)
        branch = self.export(self.ds_repo, self.pr["commit"], where / "branch", TREE_PATHS)
        edits = []
        # An export has no .git, so DeepSpeed's setup.py would version the install "<version>+unknown";
        # it reads build.txt instead, as in an sdist (the file DS_BUILD_STRING writes).
        builds = {
            tree: f"+{sha[:7]}" for tree, sha in ((ref, self.pr["ref_sha"]), (branch, self.pr["commit"]))
        }
        for tree, build in builds.items():
            (tree / "build.txt").write_text(build + "\n")  # not among TREE_PATHS: never exported
        edits.append(
            f"`build.txt` in each tree ({', '.join(builds.values())}): the install's version names its commit"
        )
        test = branch / str(pr_fix.TEST_REL)
        if test.is_file():
            (ref / str(pr_fix.TEST_REL)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(test, ref / str(pr_fix.TEST_REL))
            edits.append(f"the branch's `{pr_fix.TEST_REL}` copied into REF's tree")
        unskipped: dict[str, str] = {}
        aligned: dict[str, int] = {}
        for side, tree in (("ref", ref), ("branch", branch)):
            path = tree / OPTIMIZER_TEST
            text, removed = remove_module_skip(path.read_text()) if path.is_file() else ("", None)
            if removed:
                unskipped[side] = " ".join(removed.split())
                common = tree / CHECKPOINT_COMMON
                text, aligned[side] = align_data_dtype(text, common.read_text() if common.is_file() else "")
                path.write_text(text)
        for removed in sorted(set(unskipped.values())):
            sides = " and ".join(s for s in SIDES if unskipped.get(s) == removed)
            edits.append(f"`{OPTIMIZER_TEST}` without its module-level skip at {sides} (`{removed}`)")
        for count in sorted({n for n in aligned.values() if n}):
            sides = " and ".join(s for s in SIDES if aligned.get(s) == count)
            edits.append(
                f"`{OPTIMIZER_TEST}` at {sides}: `dtype=torch.float16` given to its {count} "
                f"`{CHECKPOINT_HELPER}` calls, as its config's fp16 says (`{CHECKPOINT_COMMON}` "
                "makes the data `preferred_dtype()`, bf16 wherever bf16 is supported, when none is given)"
            )
        workflow = self._read(ref, WORKFLOW, self.pr["ref_sha"])
        flags, flags_from = pytest_flags(workflow)
        packages, packages_from = pytest_packages(self._read(ref, REQUIREMENTS_DEV, self.pr["ref_sha"]))
        if any(re.split(r"[<>=!~;\[]", p, maxsplit=1)[0].lower() == "pytest-randomly" for p in packages):
            # pytest-randomly shuffles each session its own way: one seed (REF's sha) runs every
            # session in one order, so a test one side never reached is not the shuffle's doing.
            seed = int(self.pr["ref_sha"][:8], 16)
            flags = (*flags, f"--randomly-seed={seed}")
            flags_from = (
                f"{flags_from}, with --randomly-seed={seed} (pytest-randomly: one order for every session)"
            )
        nodes, missing = node_ids(branch)
        self._trees = Trees(
            ref, branch, edits, unskipped, aligned, flags, flags_from, packages, packages_from,
            nodes, missing, workflow_torches(workflow),
        )  # fmt: skip
        return self._trees

    def _read(self, tree: Path, rel: str, sha: str) -> str | None:
        path = tree / rel
        if path.is_file():
            return path.read_text(errors="replace")
        from repro.core.safe_git import SafeGit

        shown = SafeGit().run("show", f"{sha}:{rel}", where=["-C", self.ds_repo])
        return shown.stdout if shown.ok else None

    def run(self, env: str, torch: str, stack: str) -> SuiteEntry:
        trees = self.trees()
        argv = (*trees.flags, *trees.tests, f"--torch_ver={torch_ver(torch)}")
        entry: SuiteEntry = {
            "stack": stack, "env": env, "torch": torch, "command": "", "flags": list(trees.flags),
            "packages": list(trees.packages),
            "flags_from": trees.flags_from, "packages_from": trees.packages_from, "install": INSTALL,
            "edits": list(trees.edits), "missing": list(trees.missing), "sessions": [],
            "upstream_torches": trees.upstream_torches,
        }  # fmt: skip
        if not trees.tests:
            entry["rows"], entry["regression"] = [], {}
            entry["why"] = "the branch holds none of the MiCS tests"
            return entry
        for transport in TRANSPORTS:
            for side in SIDES:
                sha = self.pr["ref_sha"] if side == "ref" else self.pr["commit"]
                call = SuiteCall(
                    env, torch, side, sha, transport, trees.side(side), argv, trees.packages,
                    self.folder / "suite" / f"{stack}-{transport}-{side}", self.engine,
                )  # fmt: skip
                entry["command"] = call.command()
                console.info(
                    f"== verify: DeepSpeed's own tests, torch {torch}, {transport} gloo"
                    f"{' (the lab adapter)' if transport != 'plain' else ''}, {side} {sha[:10]}"
                )
                key = call.key(trees.edits)
                hit = self.cache.get(key) if self.cache else None
                if hit is None:
                    # `repro run` never writes over results: an interrupted earlier session keeps its folder.
                    call = replace(call, out=fresh_folder(call.out))
                    seen = self.runner(call)
                    seen["folder"] = str(call.out)  # cached with it
                    if self.cache:
                        self.cache.put(key, seen)
                else:
                    seen = cast(Session, hit)  # a session this code cached (CellCache keeps results only)
                entry["sessions"].append(Session(side=side, transport=transport, **seen))
                console.info(f"verify: {side} on {transport}: {_counts(seen)}")
        rows = compare(entry["sessions"])
        regression = {t: dict(zip(("ok", "why"), regression_words(rows, t))) for t in TRANSPORTS}
        entry["rows"], entry["regression"] = rows, regression
        return entry


def worth_caching(seen: Mapping[str, Any]) -> bool:
    """A session is kept when pytest reported tests, or when the lab stopped it on a deadlock it
    proved (each rank's collective: what the code did, not how busy the machine was; on master
    such a session costs about 30 minutes to run again). One the lab stopped for silence or its
    time limit, and one that ran no test (an install failure), runs again next time."""
    if not seen.get("tests"):
        return False
    if not seen.get("from_log"):
        return True
    return seen.get("outcome") == "hung" and str(seen.get("reason") or "").startswith("deadlock:")


def _counts(seen: Mapping[str, Any]) -> str:
    counts = seen.get("counts") or {}
    return ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or f"no test ran ({seen.get('reason')})"
