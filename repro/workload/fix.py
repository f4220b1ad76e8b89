"""Our fix for the MiCS `_IllegalWork` bug, as text that is installed two ways.

The new function bodies live only here. At run time `apply()` splices them into the installed
DeepSpeed module's own source (keeping that release's decorators, signature and docstring) and
compiles the result in the module's globals. `repro.upstream.patchgen` splices the same text into the
pristine sdist file to write patches/deepspeed-*.patch. One splice function serves both, so the
shipped patches and the run-time fix cannot drift apart.

Runs inside the environments: standard library only at import time (Python 3.9+); DeepSpeed is
imported lazily by `apply()`.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib
import inspect
import json
import linecache
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, TypedDict

# Statements after the docstring of TorchBackend.all_gather_coalesced (deepspeed/comm/torch.py).
# The branches that do not touch the coalescing manager keep the release's text so the diff only
# shows what changed.
_ALL_GATHER_COALESCED = """\
assert len(output_tensors) == len(input_tensors), ""
if hasattr(torch.distributed.distributed_c10d, '_all_gather_base_coalesced'):
    # customized PyTorch
    return torch.distributed.distributed_c10d._all_gather_base_coalesced(output_tensors,
                                                                         input_tensors,
                                                                         group=group,
                                                                         async_op=async_op)
elif has_coalescing_manager():
    reqs = []
    started = False
    try:
        # async_ops=True even for a synchronous call: the manager then keeps the real work rather
        # than waiting it on exit, where torch 2.3.x with device= set holds None instead
        # (pytorch#122807) and would raise AttributeError. The synchronous case waits below.
        with get_coalescing_manager(group, input_tensors[0].device, reqs, True) as cm:
            started = True
            for output, input in zip(output_tensors, input_tensors):
                handle = torch.distributed.distributed_c10d.all_gather_into_tensor(output,
                                                                                   input,
                                                                                   group=group,
                                                                                   async_op=True)
                reqs.append(handle)
    except RuntimeError as e:
        # Backends without coalescing support (gloo) refuse in _start_coalescing, when the manager
        # is entered and before any collective is issued. Only that refusal falls back to gathering
        # one by one; any other error, or one raised after the block started, is the caller's.
        if started or 'does not implement startCoalescing' not in str(e):
            raise
        # torch registered the group as coalescing before the backend refused and leaves it so:
        # collectives on it would only be recorded (returning _IllegalWork), never issued.
        c10d = torch.distributed.distributed_c10d
        c10d._world.pg_coalesce_state.pop(group or c10d._get_default_group(), None)
        cm = c10d._CoalescingManager()  # its wait() waits each work appended
        for output, input in zip(output_tensors, input_tensors):
            cm.append(c10d.all_gather_into_tensor(output, input, group=group, async_op=True))
    if cm is None:
        # torch < 2.1: the manager yields nothing and reqs holds real works; waiting the last
        # one completes the whole coalesced group.
        if async_op:
            return reqs[-1]
        reqs[-1].wait()
        return None
    # torch >= 2.1: reqs holds only _IllegalWork placeholders, whose wait() raises. The real
    # work belongs to the manager (cm.works).
    if not cm.works:
        # pytorch#122807: with device= set, torch 2.3.x loses the work in _end_coalescing
        # and leaves nothing to wait on; block until the device is idle rather than let the
        # caller read outputs that are still being written.
        get_accelerator().synchronize()
    if not async_op:
        cm.wait()
        return None
    return cm
"""

# Statements after the docstring of MiCS_AllGatherCoalescedHandle.wait
# (deepspeed/runtime/zero/mics.py).
_MICS_HANDLE_WAIT = """\
# A failed wait means the gathered data may never arrive. Logging it and marking the params
# AVAILABLE anyway lets compute read unfilled buffers, so the error goes to the caller.
instrument_w_nvtx(self.allgather_handle.wait)()
if self.complete:
    return

for _, param in enumerate(self.params):
    assert param.ds_status == ZeroParamStatus.INFLIGHT, f"expected param {param.ds_summary()} to be inflight"
    param.ds_status = ZeroParamStatus.AVAILABLE

self.complete = True
"""


@dataclass(frozen=True)
class Target:
    """One method we replace: where it lives and the statements we own."""

    module: str
    cls: str
    func: str
    path: str  # relative to the sdist root, as in the a/ b/ paths of the patch
    body: str

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.cls}.{self.func}"


TARGETS: tuple[Target, ...] = (
    Target(
        "deepspeed.comm.torch",
        "TorchBackend",
        "all_gather_coalesced",
        "deepspeed/comm/torch.py",
        _ALL_GATHER_COALESCED,
    ),
    Target(
        "deepspeed.runtime.zero.mics",
        "MiCS_AllGatherCoalescedHandle",
        "wait",
        "deepspeed/runtime/zero/mics.py",
        _MICS_HANDLE_WAIT,
    ),
)

FIX_ID = hashlib.sha256("\n".join(f"{t.qualname}\n{t.body}" for t in TARGETS).encode()).hexdigest()[:12]


class FixNotApplicableError(RuntimeError):
    """The DeepSpeed at hand lacks what the fix replaces (e.g. 0.19.8 has no MiCS)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Splice:
    """Where a target sits in one module's source and what replaces its owned statements."""

    target: Target
    header_start: int  # first line of the decorators (or of `def`), 1-based
    start: int  # first replaced line, 1-based
    end: int  # last replaced line, inclusive
    new_lines: tuple[str, ...]
    unchanged: bool  # the source already holds our statements (a patched install)


def _find_method(tree: ast.Module, target: Target) -> ast.FunctionDef:
    found = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == target.cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == target.func:
                    found = item  # the last definition is the one Python keeps
    if found is None:
        raise FixNotApplicableError(f"{target.path} has no {target.cls}.{target.func}")
    return found


def _has_docstring(func: ast.FunctionDef) -> bool:
    first = func.body[0]
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )


def _statements_dump(func: ast.FunctionDef) -> list[str]:
    stmts = func.body[1:] if _has_docstring(func) else func.body
    return [ast.dump(s) for s in stmts]


def locate(source: str, target: Target) -> Splice:
    """Compute the splice of `target.body` into one module's source text."""
    tree = ast.parse(source)
    func = _find_method(tree, target)
    lines = source.splitlines(keepends=True)
    first = func.body[0]
    if first.lineno == func.lineno:
        raise FixNotApplicableError(f"{target.qualname}: body on the `def` line, cannot splice")
    if _has_docstring(func):
        if len(func.body) == 1:
            raise FixNotApplicableError(f"{target.qualname} has only a docstring")
        start = int(first.end_lineno or first.lineno) + 1
        anchor = func.body[1]
    else:
        start, anchor = first.lineno, first
    end = int(func.end_lineno or func.lineno)
    pad = lines[anchor.lineno - 1][: anchor.col_offset]
    if pad.strip():
        raise FixNotApplicableError(f"{target.qualname}: unexpected indentation")
    new_lines = tuple(pad + ln if ln.strip() else "\n" for ln in target.body.splitlines(keepends=True))
    decorator_lines = [d.lineno for d in func.decorator_list]
    header_start = min(decorator_lines + [func.lineno])
    spliced = parse_function("".join(lines[header_start - 1 : start - 1]) + "".join(new_lines))
    return Splice(
        target,
        header_start,
        start,
        end,
        new_lines,
        unchanged=_statements_dump(func) == _statements_dump(spliced),
    )


def function_text(source: str, splice: Splice) -> str:
    """The whole new method (release decorators + signature + docstring, our statements)."""
    lines = source.splitlines(keepends=True)
    return "".join(lines[splice.header_start - 1 : splice.start - 1]) + "".join(splice.new_lines)


def patched_source(source: str, targets: tuple[Target, ...]) -> str:
    """The module source with every given target's statements replaced (for the patch files)."""
    lines = source.splitlines(keepends=True)
    for splice in sorted((locate(source, t) for t in targets), key=lambda s: s.start, reverse=True):
        lines[splice.start - 1 : splice.end] = list(splice.new_lines)
    return "".join(lines)


def _wrap(text: str, cls: str) -> str:
    # A method is indented; under a class header it compiles as is, and gets its real qualname.
    return f"class {cls}:\n{text}"


def parse_function(text: str, cls: str = "_Host") -> ast.FunctionDef:
    """Parse an indented method's text (as `function_text` returns it)."""
    node = ast.parse(_wrap(text, cls)).body[0]
    assert isinstance(node, ast.ClassDef)
    func = node.body[-1]
    assert isinstance(func, ast.FunctionDef)
    return func


def _free_names(func: ast.FunctionDef) -> list[str]:
    """Names the method reads that it neither binds nor receives: they must come from globals."""
    bound: set[str] = set()
    loaded: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node is not func:
            bound.add(node.name)
    return sorted(loaded - bound)


def compile_method(text: str, target: Target, namespace: dict[str, Any]) -> Any:  # a module's globals
    """Compile a method's text with `namespace` as its globals; returns the decorated object.

    Names the body needs must already be in `namespace` (or builtins): checking here turns a
    release that lacks a helper into a clear error instead of a NameError mid-training.
    """
    func = parse_function(text, target.cls)
    missing = [n for n in _free_names(func) if n not in namespace and not hasattr(builtins, n)]
    if missing:
        raise FixNotApplicableError(f"{target.module} does not define {', '.join(missing)}")
    filename = f"<repro fix {FIX_ID}: {target.qualname}>"
    code = _wrap(text, target.cls)
    # Tracebacks through the new code can then show its lines.
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    local: dict[str, Any] = {}  # whatever the compiled text defines
    exec(compile(code, filename, "exec"), namespace, local)
    return local[target.cls].__dict__[target.func]


# qualname -> (object we set on the class, method text we compiled)
_INSTALLED: dict[str, tuple[Any, str]] = {}


@dataclass(frozen=True)
class _Step:
    target: Target
    cls: type
    new: Any  # the compiled method to set, or None when the class already has it
    text: str
    how: str  # "runtime": compiled by apply(); "in-source": the installed file already has it


def installed_sources() -> dict[str, str]:
    """The method text `apply()` compiled, per qualname (what the patch must equal)."""
    return {name: text for name, (_, text) in _INSTALLED.items()}


def _resolve(target: Target, importer: Callable[[str], Any]) -> tuple[Any, Any, str]:
    try:
        # import_module, not attribute access: deepspeed.comm's star imports shadow its
        # `torch` submodule with torch itself.
        module = importer(target.module)
    except ImportError as exc:
        raise FixNotApplicableError(f"cannot import {target.module}: {exc}") from exc
    cls = getattr(module, target.cls, None)
    if not isinstance(cls, type) or target.func not in cls.__dict__:
        raise FixNotApplicableError(f"{target.module} has no {target.cls}.{target.func}")
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError) as exc:
        raise FixNotApplicableError(f"source of {target.module} is not available: {exc}") from exc
    return module, cls, source


# What apply() installed, or (applied false) why not: a record's `fix`, this module's JSON.
class FixReport(TypedDict, total=False):
    applied: bool
    deepspeed: str
    fix_id: str
    patched: list[str]  # the qualnames of TARGETS
    source: str  # "runtime" | "in-source" | "in-source+runtime"
    package_dir: str | None
    sources: dict[str, str]  # main() only: installed_sources()
    reason: str


def apply(importer: Callable[[str], Any] = importlib.import_module) -> FixReport:
    """Install the fix into the live DeepSpeed classes; safe to call more than once.

    Call after `import deepspeed` and before the engine or MiCS_Init is built. Raises
    FixNotApplicableError, changing nothing, when any target is missing. `importer` exists so
    tests can hand in stand-in modules.
    """
    deepspeed = importer("deepspeed")
    version = str(getattr(deepspeed, "__version__", "unknown"))
    plan = []
    for target in TARGETS:
        module, cls, source = _resolve(target, importer)
        done = _INSTALLED.get(target.qualname)
        if done is not None and done[0] is cls.__dict__[target.func]:
            plan.append(_Step(target, cls, None, done[1], "runtime"))
            continue
        splice = locate(source, target)
        text = function_text(source, splice)
        if splice.unchanged:
            plan.append(_Step(target, cls, None, text, "in-source"))
        else:
            plan.append(_Step(target, cls, compile_method(text, target, module.__dict__), text, "runtime"))
    # Everything compiled before anything is replaced: a failure leaves the classes untouched.
    for step in plan:
        if step.new is not None:
            setattr(step.cls, step.target.func, step.new)
            _INSTALLED[step.target.qualname] = (step.new, step.text)
        else:
            _INSTALLED.setdefault(step.target.qualname, (step.cls.__dict__[step.target.func], step.text))
    return {
        "applied": True,
        "deepspeed": version,
        "fix_id": FIX_ID,
        "patched": [step.target.qualname for step in plan],
        "source": "+".join(sorted({step.how for step in plan})),
        # which DeepSpeed it patched: a checkout's own deepspeed/ shadows the env's when the job
        # runs in it (DeepSpeed's tests/conftest.py puts the checkout first on sys.path)
        "package_dir": _package_dir(deepspeed),
    }


def _package_dir(module: Any) -> str | None:
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) if isinstance(path, str) else None


def main(argv: list[str]) -> int:
    """`python -m repro.workload.fix [--out FILE]`: apply here and report the outcome as JSON.

    DeepSpeed logs to stdout, so callers that parse the result should pass --out.
    Exit 0: applied; 3: this DeepSpeed lacks what the fix replaces.
    """
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    try:
        result = apply()
        result["sources"] = installed_sources()
        code = 0
    except FixNotApplicableError as exc:
        result, code = {"applied": False, "reason": exc.reason, "fix_id": FIX_ID}, 3
    text = json.dumps(result, indent=2, sort_keys=True)
    if out is None:
        print(text)
    else:
        with open(out, "w") as fh:
            fh.write(text + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
