"""The shape rules of repro/ that a reader relies on (docs/developing.md, "Code shape"), read from
the source's syntax tree: no function over 80 lines, no argparse.Namespace below the CLI,
`type: ignore` only where a type cannot be written, and few untyped dicts (`dict[str, Any]`: the
JSON files and records have declared types; what is left is free-form and says so)."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

REPRO = Path(__file__).resolve().parents[2] / "repro"
MAX_FUNCTION_LINES = 80
MAX_TYPE_IGNORES = 5
# 318 before issue #46's typing, 31 after it (session 18): room for a few, not for a return.
MAX_UNTYPED_DICTS = 40


def modules() -> list[Path]:
    return sorted(p for p in REPRO.rglob("*.py") if "__pycache__" not in p.parts)


def functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`name (N lines)` for each function of `path` longer than `limit`, docstring included."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for fn in functions(tree):
        lines = (fn.end_lineno or fn.lineno) - fn.lineno + 1
        if lines > limit:
            found.append(f"{path.relative_to(REPRO.parent)}:{fn.lineno} {fn.name} ({lines} lines)")
    return found


def namespace_parameters(path: Path) -> list[str]:
    """Parameters and returns of `path`'s functions annotated `argparse.Namespace`."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for fn in functions(tree):
        args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        annotations = [a.annotation for a in args if a.annotation is not None]
        annotations += [fn.returns] if fn.returns is not None else []
        if any("argparse.Namespace" in ast.unparse(a) for a in annotations):
            found.append(f"{path.relative_to(REPRO.parent)}:{fn.lineno} {fn.name}")
    return found


def type_ignores(path: Path) -> list[str]:
    """The `# type: ignore` comments of `path` (comments only: a string that says so is no ignore)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [
        f"{path.relative_to(REPRO.parent)}:{tok.start[0]}"
        for tok in tokens
        if tok.type == tokenize.COMMENT and "type: ignore" in tok.string
    ]


def untyped_dicts(path: Path) -> list[str]:
    """Where `path`'s code (not its strings or comments) says `dict[str, Any]`."""
    skip = (
        tokenize.STRING,
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
    )
    tokens = [
        t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline) if t.type not in skip
    ]
    shape = ["dict", "[", "str", ",", "Any", "]"]
    return [
        f"{path.relative_to(REPRO.parent)}:{tokens[i].start[0]}"
        for i in range(len(tokens) - len(shape) + 1)
        if [t.string for t in tokens[i : i + len(shape)]] == shape
    ]


def test_no_function_in_repro_is_over_80_lines() -> None:
    too_long = [hit for path in modules() for hit in long_functions(path)]
    assert not too_long, "split these into named steps:\n" + "\n".join(too_long)


def test_no_argparse_namespace_goes_below_the_cli() -> None:
    """The host tool's layers under repro/cli take typed values. repro/workload is not below the
    CLI: its modules are the programs that run inside an env, each parsing its own argv."""
    below = [p for p in modules() if p.relative_to(REPRO).parts[0] not in ("cli", "workload")]
    found = [hit for path in below for hit in namespace_parameters(path)]
    assert not found, "the CLI passes typed values down, not its Namespace:\n" + "\n".join(found)


def test_type_ignores_stay_few() -> None:
    found = [hit for path in modules() for hit in type_ignores(path)]
    assert len(found) <= MAX_TYPE_IGNORES, "\n".join(found)


def test_untyped_dicts_stay_few() -> None:
    found = [hit for path in modules() for hit in untyped_dicts(path)]
    assert len(found) <= MAX_UNTYPED_DICTS, "declare a TypedDict or dataclass:\n" + "\n".join(found)


def test_the_untyped_dict_counter_reads_code_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.REPRO", tmp_path / "repro")
    path = tmp_path / "repro" / "mod.py"
    path.parent.mkdir()
    path.write_text(
        "x: dict[str, Any] = {}  # dict[str, Any]\ny = 'dict[str, Any]'\ndef f(a: dict[\n  str, Any]): ...\n"
    )
    assert untyped_dicts(path) == ["repro/mod.py:1", "repro/mod.py:3"]


@pytest.mark.parametrize(
    ("source", "long", "namespace", "ignores"),
    [
        ("def f():\n" + "    x = 1\n" * 80 + "    return x\n", 1, 0, 0),
        ("def f():\n" + "    x = 1\n" * 78 + "    return x\n", 0, 0, 0),
        ("import argparse\ndef f(a: argparse.Namespace) -> int:\n    return 1\n", 0, 1, 0),
        ("def f() -> argparse.Namespace: ...\n", 0, 1, 0),
        ("x = 1  # type: ignore[misc]\ny = '# type: ignore'\n", 0, 0, 1),
    ],
)
def test_the_counters_see_what_they_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, long: int, namespace: int, ignores: int
) -> None:
    """Each rule's counter finds its case in a made-up module (a counter that sees nothing passes
    every tree)."""
    monkeypatch.setattr(f"{__name__}.REPRO", tmp_path / "repro")
    path = tmp_path / "repro" / "mod.py"
    path.parent.mkdir()
    path.write_text(source)
    assert (len(long_functions(path)), len(namespace_parameters(path)), len(type_ignores(path))) == (
        long,
        namespace,
        ignores,
    )
