"""Where the bug lives in a given DeepSpeed release: file and line numbers found with `ast`.

Line numbers differ between releases, so they are computed from that release's own source (the
sdist in the wheelhouse, or files read out of the image), never written down by hand. Each
`SourceRef` says what a reader should see there; a construct a release does not have is simply
absent from the result, and `missing` says which.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

COMM = "deepspeed/comm/torch.py"
MICS = "deepspeed/runtime/zero/mics.py"
PATHS = (COMM, MICS)
REPO_URL = "https://github.com/deepspeedai/DeepSpeed"


@dataclass(frozen=True)
class SourceRef:
    key: str
    path: str
    start: int
    end: int
    summary: str

    def label(self) -> str:
        lines = f"L{self.start}" if self.start == self.end else f"L{self.start}-L{self.end}"
        return f"{self.path}#{lines}"

    def url(self, version: str) -> str:
        # DeepSpeed tags releases as v<version>.
        return f"{REPO_URL}/blob/v{version}/{self.label()}"


@dataclass(frozen=True)
class Refs:
    version: str
    refs: tuple[SourceRef, ...]
    missing: tuple[str, ...]

    def get(self, key: str) -> SourceRef | None:
        return next((r for r in self.refs if r.key == key), None)


def find_method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    return None


def _span(node: ast.AST) -> tuple[int, int]:
    start = getattr(node, "lineno", 0)
    return start, getattr(node, "end_lineno", None) or start


def _is_last_req(node: ast.AST) -> bool:
    """`reqs[-1]`."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "reqs"
        and isinstance(node.slice, ast.UnaryOp)
        and isinstance(node.slice.operand, ast.Constant)
        and node.slice.operand.value == 1
    )


def _call_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            return func.attr
        if isinstance(func, ast.Name):
            return func.id
    return ""


def _keyword(call: ast.Call, name: str) -> object:
    for kw in call.keywords:
        if kw.arg == name and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return None


def _exception_names(handler: ast.ExceptHandler) -> list[str]:
    node = handler.type
    items = node.elts if isinstance(node, ast.Tuple) else [node] if node is not None else []
    return [n.id for n in items if isinstance(n, ast.Name)]


_UNBOUND = "without binding it (`with ...:`, not `with ... as cm:`), so the manager's real work is lost"


def comm_refs(source: str) -> list[SourceRef]:
    func = find_method(ast.parse(source), "TorchBackend", "all_gather_coalesced")
    if func is None:
        return []
    refs = [SourceRef("comm.method", COMM, *_span(func), "`TorchBackend.all_gather_coalesced`")]
    for node in ast.walk(func):
        if isinstance(node, ast.With) and _call_name(node.items[0].context_expr) == "get_coalescing_manager":
            how = "and binds it" if node.items[0].optional_vars is not None else _UNBOUND
            what = f"enters torch's `_coalescing_manager` {how}"
            refs.append(SourceRef("comm.with", COMM, node.lineno, node.lineno, what))
        if isinstance(node, ast.Return) and node.value is not None and _is_last_req(node.value):
            what = "async: returns `reqs[-1]`, an `_IllegalWork` placeholder on torch >= 2.1"
            refs.append(SourceRef("comm.return", COMM, *_span(node), what))
        call = node.value if isinstance(node, ast.Expr) else None
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "wait"
            and _is_last_req(call.func.value)
        ):
            what = "sync: calls `reqs[-1].wait()` on the placeholder, which raises"
            refs.append(SourceRef("comm.wait", COMM, *_span(node), what))
    return refs


def mics_refs(source: str) -> list[SourceRef]:
    tree = ast.parse(source)
    refs: list[SourceRef] = []
    wait = find_method(tree, "MiCS_AllGatherCoalescedHandle", "wait")
    if wait is not None:
        for node in ast.walk(wait):
            if isinstance(node, ast.Try) and node.handlers:
                caught = " and ".join(n for h in node.handlers for n in _exception_names(h))
                what = f"`MiCS_AllGatherCoalescedHandle.wait` catches {caught}, "
                what += "logs it and then marks the parameters AVAILABLE anyway"
                refs.append(SourceRef("mics.swallow", MICS, *_span(node), what))
                break
    for method, key, mode in (
        ("_flat_all_gather_with_coalescing_manager", "mics.flat", True),
        ("_hierarchical_all_gather_params", "mics.hier", False),
    ):
        func = find_method(tree, "MiCS_Init", method)
        if func is None:
            continue
        for node in ast.walk(func):
            if (
                _call_name(node) == "all_gather_coalesced"
                and isinstance(node, ast.Call)
                and _keyword(node, "async_op") is mode
            ):
                what = (
                    "flat parameter gather (async): the handle it gets is the placeholder"
                    if mode
                    else "hierarchical gather, inter-node step (sync): reaches `reqs[-1].wait()` and crashes"
                )
                refs.append(SourceRef(key, MICS, *_span(node), f"`MiCS_Init.{method}`: {what}"))
                break
    return refs


EXPECTED = ("comm.method", "comm.with", "comm.return", "comm.wait", "mics.swallow", "mics.flat", "mics.hier")


def find_refs(version: str, sources: Mapping[str, str]) -> Refs:
    """The bug's locations in this release; `sources` maps PATHS to file text (missing files allowed)."""
    refs = [*comm_refs(sources[COMM])] if COMM in sources else []
    if MICS in sources:
        refs += mics_refs(sources[MICS])
    found = {r.key for r in refs}
    return Refs(version, tuple(refs), tuple(k for k in EXPECTED if k not in found))
