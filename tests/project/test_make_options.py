"""One table of make options (issue #46 item 3): repro/core/make_options.py declares every make
variable once, and each place that lists variables by hand is checked against it here: the
Makefile's USER_VARIABLES and SWITCHES, which flag each recipe passes an option on as, the
argparse parser of the subcommand each target runs, docs/options.md, and the names every make
line the tool prints is built from. Each check is a function of text (or of a table) that returns
what disagrees, so each is also shown to fail on a small made-up case. Nothing runs make.
"""

from __future__ import annotations

import argparse
import ast
import re
import shlex
from collections.abc import Iterable
from pathlib import Path

import pytest

from repro.bisect.driver import BisectMode, Folder, SurveyMode, Walk, WalkRequest
from repro.bisect.probe import ProbeSpec
from repro.cli.main import build_parser
from repro.cli.options import run_make_line
from repro.core import make_options
from repro.core.make_options import OPTIONS, MakeOption, checked_pairs, reproduce_pairs
from repro.core.makeline import make_line
from repro.engines.jobdeps import JobDeps
from repro.run.job import JobRequest, reproduce_line
from repro.upstream.issue.facts import bundle_steps
from tests.fixtures.make_recorder import MAKEFILE, REPO, phony_targets

DOCS = REPO / "docs" / "options.md"
NAMES = {o.name for o in OPTIONS}
LINE_NAMES = {o.name for o in OPTIONS if o.reproduce}
WRAPPERS = {"reproduce_pairs", "checked_pairs"}


# -- the Makefile, read as text ------------------------------------------------------------------
def listed(text: str, variable: str) -> set[str]:
    """The words of `VARIABLE := a b \\ c` in the Makefile."""
    match = re.search(rf"^{variable} := ((?:.*\\\n)*.*)$", text, flags=re.M)
    assert match, f"the Makefile has no {variable} :="
    return set(match.group(1).replace("\\\n", " ").split())


def recipes(text: str) -> dict[str, str]:
    """Each target's recipe, the Makefile's own helper variables (RUN_FLAGS, REPRO, ...) expanded."""
    joined = text.replace("\\\n", " ")
    macros = dict(re.findall(r"^([A-Z][A-Z0-9_]*)\s*:?=\s*(.*)$", joined, flags=re.M))
    macros.pop("PYTHON", None)  # the interpreter, not a group of flags

    def expand(recipe: str) -> str:
        def one(m: re.Match[str]) -> str:
            return expand(macros[m.group(1)]) if m.group(1) in macros else m.group(0)

        return re.sub(r"\$\(([A-Z][A-Z0-9_]*)\)", one, recipe)

    found: dict[str, str] = {}
    target = None
    for line in joined.split("\n"):
        if line.startswith("\t"):
            if target:
                found[target] += " " + expand(line)
            continue
        rule = re.match(r"^([a-z][a-z0-9-]*)\s*:(?!=)", line)
        target = rule.group(1) if rule else None  # any other line ends the recipe
        if target:
            found.setdefault(target, "")
    return found


FLAG_PATTERNS = (
    r"\$\(call flag,(?P<var>[A-Z][A-Z0-9_]*),(?P<flag>[a-z-]+)\)",  # $(call flag,WORLD_SIZE,world-size)
    r"\$\(if \$\(call yes,(?P<var>[A-Z][A-Z0-9_]*)\),--(?P<flag>[a-z-]+)\)",  # switches
    r"--(?P<flag>[a-z-]+) \$\(call sq,\$\((?:value|or \$\(value) (?P<var>[A-Z][A-Z0-9_]*)",  # --cmd '...'
)


def passed_flags(recipe_of: dict[str, str]) -> dict[tuple[str, str], str]:
    """(variable, target) -> the flag that target's recipe passes the variable on as."""
    found: dict[tuple[str, str], str] = {}
    for target, recipe in recipe_of.items():
        for pattern in FLAG_PATTERNS:
            for m in re.finditer(pattern, recipe):
                found[(m.group("var"), target)] = f"--{m.group('flag')}"
    return found


def table_flags(options: Iterable[MakeOption]) -> dict[tuple[str, str], str]:
    """The same, as the table says it (RESUME= goes through the environment, not a flag)."""
    return {
        (o.name, target): o.flag for o in options if o.flag and not o.via_environment for target in o.targets
    }


def subcommand(recipe: str) -> str | None:
    found = re.search(r"\$\(PYTHON\) -m repro (?:\$\(if [^)]*\)[^)]*\) )*([a-z][a-z0-9-]*)", recipe)
    return found.group(1) if found else None


def disagreements(makefile: dict[tuple[str, str], str], table: dict[tuple[str, str], str]) -> list[str]:
    keys = sorted(set(makefile) | set(table))
    return [
        f"{v} in make {t}: Makefile {makefile.get((v, t))}, table {table.get((v, t))}"
        for v, t in keys
        if makefile.get((v, t)) != table.get((v, t))
    ]


# -- the parsers ---------------------------------------------------------------------------------
def parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return top, dict(sub.choices)


def flags_missing_from_parsers(options: Iterable[MakeOption], recipe_of: dict[str, str]) -> list[str]:
    """`NAME: make target -> python -m repro sub lacks --flag` for each flag a parser lacks. A flag
    of the top-level parser (--quiet, --verbose: `$(REPRO)` puts them before the subcommand) counts."""
    top, subs = parsers()
    missing = []
    for o in options:
        for target in o.targets if o.flag else ():
            name = subcommand(recipe_of.get(target, ""))
            known = set(top._option_string_actions)
            known |= set(subs[name]._option_string_actions) if name in subs else set()
            if o.flag not in known:
                missing.append(f"{o.name}: make {target} -> python -m repro {name} lacks {o.flag}")
    return missing


# -- docs/options.md -----------------------------------------------------------------------------
def documented(text: str) -> set[str]:
    """The variables the first column of the Options table names (`ENV=`, `DRY_RUN=1`)."""
    section = text.split("\n## Options", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (.*?) \|", section, flags=re.M)
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]*)=", row)}


# -- the make-line builders, read from their source ----------------------------------------------
def _called(node: ast.AST, names: set[str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) in names


def _pair_names(function: ast.AST) -> set[str]:
    """Every NAME of a ("NAME", value) pair (or ("A" if c else "B", value)) and every key of a
    reproduce_pairs({...}) in the function."""
    names: set[str] = set()
    for node in ast.walk(function):
        firsts: list[ast.expr] = []
        if isinstance(node, ast.Tuple) and len(node.elts) == 2:
            first = node.elts[0]
            firsts = [first.body, first.orelse] if isinstance(first, ast.IfExp) else [first]
        elif _called(node, {"reproduce_pairs"}) and isinstance(node.args[0], ast.Dict):
            firsts = [k for k in node.args[0].keys if k is not None]
        for first in firsts:
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                if re.fullmatch(r"[A-Z][A-Z0-9_]*", first.value):
                    names.add(first.value)
    return names


def make_line_names(source: str, where: str) -> tuple[set[str], list[str]]:
    """(the names the make lines of `source` are built from, the make_line calls whose pairs do
    not go through the table: reproduce_pairs or checked_pairs, or a variable one of them made)."""
    names: set[str] = set()
    bare: list[str] = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [n for n in ast.walk(function) if _called(n, {"make_line", *WRAPPERS})]
        if not calls:
            continue
        names |= _pair_names(function)
        made = {
            t.id
            for n in ast.walk(function)
            if isinstance(n, (ast.Assign, ast.AnnAssign))
            and n.value is not None
            and _called(n.value, WRAPPERS)
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Name)
        }
        for call in calls:
            if not _called(call, {"make_line"}) or len(call.args) < 2:
                continue
            pairs = call.args[1]
            if not (_called(pairs, WRAPPERS) or (isinstance(pairs, ast.Name) and pairs.id in made)):
                bare.append(f"{where}:{call.lineno}")
    return names, bare


def repro_sources() -> dict[str, str]:
    skip = {"repro/core/makeline.py", "repro/core/make_options.py"}  # the builder and the table
    files = sorted((REPO / "repro").rglob("*.py"))
    return {str(p.relative_to(REPO)): p.read_text() for p in files if str(p.relative_to(REPO)) not in skip}


def line_names(line: str) -> list[str]:
    """The NAME of each NAME=value after `make TARGET` in a printed line."""
    words = shlex.split(line)
    after = words[words.index("make") + 2 :]
    return [w.split("=", 1)[0] for w in after]


# -- the checks ----------------------------------------------------------------------------------
def test_the_table_is_whole_and_well_formed() -> None:
    assert len(OPTIONS) >= 70 and len(NAMES) == len(OPTIONS), "one entry per make variable"
    for o in OPTIONS:
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", o.name), o
        assert o.flag is None or re.fullmatch(r"--[a-z][a-z-]*", o.flag), o
        assert o.targets and len(set(o.targets)) == len(o.targets), o
        assert o.help and "\n" not in o.help, o
        assert not (o.switch and o.via_environment), o
    assert {"ENV", "CMD", "PACKAGES", "AXIS", "BUNDLE"} <= LINE_NAMES <= NAMES
    assert make_options.option("WORLD_SIZE").flag == "--world-size"
    with pytest.raises(KeyError, match="not a make option"):
        make_options.option("NOT_AN_OPTION")


def test_the_order_is_the_probe_lines_order() -> None:
    # The order the probe lines were printed in before the table (tests/bisect/test_bisect.py and
    # tests/project/test_makeline.py hold whole lines); reproduce_pairs writes every line in it.
    probe_line = ["ENV", "TORCH", "DEEPSPEED", "DS_REPO", "DEEPSPEED_COMMIT", "ENGINE", "SCENARIO", "PATCH"]
    probe_line += ["DTYPE", "TRANSPORT", "STEPS", "WORLD_SIZE", "TIMEOUT", "CMD", "WORKDIR", "LOSS_REGEX"]
    probe_line += ["REQUIREMENTS", "PACKAGES"]
    order = [o.name for o in OPTIONS]
    assert [n for n in order if n in probe_line] == probe_line
    shuffled = {name: name.lower() for name in reversed(probe_line)}
    assert [name for name, _ in reproduce_pairs(shuffled)] == probe_line


def test_reproduce_pairs_and_checked_pairs_refuse_a_name_the_table_lacks() -> None:
    assert reproduce_pairs({"PACKAGES": "six", "ENV": "cpu"}) == [("ENV", "cpu"), ("PACKAGES", "six")]
    assert checked_pairs([("PACKAGES", "six"), ("ENV", "cpu")]) == [("PACKAGES", "six"), ("ENV", "cpu")]
    for refused in ("WORLDSIZE", "DRY_RUN"):  # a typo; an option no printed line carries
        with pytest.raises(ValueError, match=refused):
            reproduce_pairs({"ENV": "cpu", refused: 1})
        with pytest.raises(ValueError, match=refused):
            checked_pairs([("ENV", "cpu"), (refused, 1)])


def test_user_variables_are_the_tables_names() -> None:
    assert listed(MAKEFILE.read_text(), "USER_VARIABLES") == NAMES
    # made up: a Makefile that forgot one
    text = MAKEFILE.read_text().replace(" WORLD_SIZE\n", "\n", 1)
    assert NAMES - listed(text, "USER_VARIABLES") == {"WORLD_SIZE"}


def test_switches_are_the_tables_switches() -> None:
    switches = {o.name for o in OPTIONS if o.switch}
    assert len(switches) >= 10
    assert listed(MAKEFILE.read_text(), "SWITCHES") == switches
    text = MAKEFILE.read_text().replace("SWITCHES := ALLOW_PRIVILEGES ", "SWITCHES := ", 1)
    assert switches - listed(text, "SWITCHES") == {"ALLOW_PRIVILEGES"}


def test_each_target_passes_each_option_on_as_the_tables_flag() -> None:
    text = MAKEFILE.read_text()
    recipe_of = recipes(text)
    from_makefile = passed_flags(recipe_of)
    assert len(from_makefile) >= 200 and ("WORLD_SIZE", "probe") in from_makefile
    assert disagreements(from_makefile, table_flags(OPTIONS)) == []
    runs_the_tool = {t for t, recipe in recipe_of.items() if "-m repro" in recipe}
    assert runs_the_tool == set(make_options.TOOL_TARGETS)
    every_target = set(phony_targets(text)) | set(recipe_of)
    assert {t for o in OPTIONS for t in o.targets} <= every_target
    # made up: a recipe that passes WORLD_SIZE on as another flag, and a target the table forgot
    wrong = {**recipe_of, "probe": recipe_of["probe"].replace("WORLD_SIZE,world-size", "WORLD_SIZE,ranks")}
    wrong["shell"] += " $(call flag,STEPS,steps)"
    assert disagreements(passed_flags(wrong), table_flags(OPTIONS)) == [
        "STEPS in make shell: Makefile --steps, table None",
        "WORLD_SIZE in make probe: Makefile --ranks, table --world-size",
    ]


def test_each_flag_is_an_option_of_the_subcommand_its_targets_run() -> None:
    recipe_of = recipes(MAKEFILE.read_text())
    assert subcommand(recipe_of["pr-regression"]) == "pr-regression" and subcommand(recipe_of["help"]) is None
    # RESUME= too: make hands it over in the environment, the parsers take it as --resume
    assert flags_missing_from_parsers(OPTIONS, recipe_of) == []
    made_up = [MakeOption("SEED", "--seed", ("repro", "probe"), "made up")]
    assert flags_missing_from_parsers(made_up, recipe_of) == [
        "SEED: make repro -> python -m repro repro lacks --seed",
        "SEED: make probe -> python -m repro probe lacks --seed",
    ]


def test_every_option_is_documented_in_options_md() -> None:
    text = DOCS.read_text()
    assert NAMES - documented(text) == set()
    assert documented(text) - NAMES == set(), "docs/options.md names a variable the table lacks"
    forgotten = text.replace("| `FORCE=1` |", "| `FORCE` |", 1)
    assert NAMES - documented(forgotten) == {"FORCE"}


def test_every_make_line_is_built_from_table_names() -> None:
    names: set[str] = set()
    bare: list[str] = []
    for where, source in repro_sources().items():
        found, unchecked = make_line_names(source, where)
        names |= found
        bare += unchecked
    assert bare == [], "make_line pairs that bypass repro/core/make_options.py"
    assert names - LINE_NAMES == set()
    assert len(names) >= 30
    # made up: a literal list handed to make_line, and a name the table lacks
    found, unchecked = make_line_names(
        "def a(e):\n    return make_line('repro', [('ENV', e)])\n"
        "def b(e):\n    return make_line('repro', reproduce_pairs({'ENV': e, 'SEED': 1}))\n"
        "def c(e):\n    pairs = checked_pairs([('GOOD' if e else 'SEEDS', e)])\n"
        "    return make_line('run', pairs)\n",
        "made-up.py",
    )
    assert unchecked == ["made-up.py:2"]
    assert found - LINE_NAMES == {"SEED", "SEEDS"}


def test_the_lines_the_builders_print_hold_table_names(tmp_path: Path) -> None:
    in_table_order, in_own_order = _lines_through_the_table(tmp_path), _lines_in_their_own_order(tmp_path)
    assert len(in_table_order) >= 3 and len(in_own_order) >= 6
    for line in in_table_order + in_own_order:
        printed = line_names(line)
        assert printed and set(printed) <= LINE_NAMES, line
    order = [o.name for o in OPTIONS]
    for line in in_table_order:
        assert line_names(line) == sorted(line_names(line), key=order.index), line
    assert set(line_names("make repro ENV=cpu SEED=1")) - LINE_NAMES == {"SEED"}  # made up


JOB = {"command": "python train.py", "workdir": "w", "loss_regex": "loss=(?P<loss>\\S+)"}
DEPS = {"requirements": "r.txt", "packages": "six"}


def _probe_options() -> ProbeSpec:
    return ProbeSpec(env_id="cpu", engine="venv", timeout_s=60.0, world_size=2, **JOB, **DEPS)


def _lines_through_the_table(tmp_path: Path) -> list[str]:
    """A line of each builder that uses reproduce_pairs, every value it can print given."""
    pins = {"env_id": "cpu", "torch": "2.1.0", "deepspeed": "0.12.6", "dtype": "fp32", "steps": 3}
    repro = ProbeSpec(**pins, transport="sync", world_size=2)
    commit = ProbeSpec(**pins, transport="sync", deepspeed_commit="abc", deepspeed_repo="~/ds", **JOB, **DEPS)
    return [
        repro.repro_command(),
        commit.repro_command(),
        make_line("probe", _probe_options().make_pairs("cpu")),
    ]


def _lines_in_their_own_order(tmp_path: Path) -> list[str]:
    """A line of each builder that keeps its own order (checked_pairs), every value given."""
    argv = [
        "repro",
        "--env",
        "cpu",
        "--engine",
        "venv",
        "--torch",
        "2.1.0",
        "--config",
        "c.json",
        "--steps",
        "3",
    ]
    run = JobRequest(
        env_id="cpu",
        command="python t.py",
        patches=("fixed",),
        workdir=tmp_path,
        transport="sync",
        timeout_s=60.0,
        stall_s=30.0,
        network=True,
        engine="docker",
        deps=JobDeps((), "r.txt", "six"),
    )
    walk = Walk("deepspeed", "cpu", ("0.19.2", "0.19.3"), {"torch": "2.3.1"}, ProbeSpec(env_id="cpu"))
    walked = {
        "versions": "0.19.2,0.19.3",
        "commits": True,
        "ds_repo": "~/ds",
        "parallel": 2,
        "runner": "slurm",
    }
    req = WalkRequest("deepspeed", _probe_options(), Folder(tmp_path), **walked)
    bisect = BisectMode(req, walk)
    return [
        run_make_line("repro", build_parser().parse_args(argv)),
        reproduce_line(run),
        *bundle_steps("cpu", "make repro ENV=cpu", docker=False)[1],
        bisect.make_command("0.19.2", "0.19.3"),
        SurveyMode(req, walk).command,
        bisect._other_axis("0.19.3", "older") or "",
    ]
