"""Run the PR's DeepSpeed-style regression test on CPU, stock and patched, and check it discriminates.

    python -m repro pr-regression --python ~/.cache/mics-repro/dev/t21-ds0131/bin/python

The test (patches/pr/tests/unit/runtime/zero/test_mics_coalesced_wait.py) is written for
DeepSpeed's own tree and launcher. Here it runs in an existing venv through our harness
(patches/pr/harness: a stand-in `unit.common` and a pytest plugin that starts one process per rank
over gloo with the project's CPU transport). "patched" puts a copy of the venv's installed
DeepSpeed, with patches/deepspeed-<version>.patch applied by GNU patch, first on PYTHONPATH: the
venv itself is never modified. Outcomes are read from pytest's JUnit XML, not from its output.

The check passes when every test fails on stock DeepSpeed and passes with the patch.
"""

from __future__ import annotations

import enum
import importlib.metadata
import os
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from repro.core import cmd, console, paths
from repro.core.errors import MissingToolError, ReproError, RunError
from repro.core.paths import cache_root

REPO_ROOT = paths.REPO_ROOT
PR_DIR = REPO_ROOT / "patches" / "pr"
TEST_FILE = PR_DIR / "tests" / "unit" / "runtime" / "zero" / "test_mics_coalesced_wait.py"
HARNESS = PR_DIR / "harness"
PLUGIN = "mics_pr_plugin"
# pytest and what it imports, installed with --target when the venv has no pytest: the host's own
# versions, so the harness runs with a pytest this project already tests with.
PYTEST_DISTS = ("pytest", "pluggy", "iniconfig", "pygments")


class RegressionTestError(ReproError):
    """The regression test does not tell stock DeepSpeed from patched DeepSpeed."""

    exit_code = 22


class Variant(enum.Enum):
    STOCK = "stock"
    PATCHED = "patched"


class Outcome(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    ERROR = "error"


@dataclass(frozen=True)
class CaseResult:
    test_id: str
    outcome: Outcome
    message: str


@dataclass(frozen=True)
class VariantRun:
    variant: Variant
    deepspeed: str
    exit_code: int
    results: tuple[CaseResult, ...]

    def outcomes(self) -> dict[str, Outcome]:
        return {r.test_id: r.outcome for r in self.results}


def parse_junit(xml_text: str) -> tuple[CaseResult, ...]:
    """One result per <testcase>: failure/error/skipped children decide the outcome."""
    root = ET.fromstring(xml_text)
    results = []
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '').split('.')[-1]}::{case.get('name', '')}"
        outcome, message = Outcome.PASSED, ""
        for child, kind in (
            (case.find("failure"), Outcome.FAILED),
            (case.find("error"), Outcome.ERROR),
            (case.find("skipped"), Outcome.SKIPPED),
        ):
            if child is not None:
                outcome, message = kind, _failure_text(child)
                break
        results.append(CaseResult(test_id, outcome, message))
    return tuple(results)


def _failure_text(child: ET.Element) -> str:
    """The failure's message: pytest >= 9.2 shortens the `message` attribute of a long failure
    (ending it with "[+N more lines; full report in element text]"); the whole report is then the
    element's text, which also names the exception of every rank."""
    message = child.get("message") or ""
    if message.endswith("full report in element text]") and child.text:
        message = child.text
    return message[:20000]


def discriminates(stock: VariantRun, patched: VariantRun) -> list[str]:
    """Problems that keep the test from proving the fix; empty when it does."""
    problems = []
    stock_o, patched_o = stock.outcomes(), patched.outcomes()
    if not stock_o or not patched_o:
        problems.append("a run collected no test")
    if set(stock_o) != set(patched_o):
        problems.append(f"stock and patched ran different tests: {sorted(set(stock_o) ^ set(patched_o))}")
    for test_id, outcome in sorted(stock_o.items()):
        if outcome is not Outcome.FAILED:
            problems.append(f"stock: {test_id} {outcome.value}, expected failed")
    for test_id, outcome in sorted(patched_o.items()):
        if outcome is not Outcome.PASSED:
            problems.append(f"patched: {test_id} {outcome.value}, expected passed")
    return problems


# -- the environment -------------------------------------------------------------------------------
_FIND_DS = (
    "import importlib.util, importlib.metadata as m, os; s = importlib.util.find_spec('deepspeed'); "
    "print(m.version('deepspeed')); print(os.path.dirname(s.origin))"
)


def installed_deepspeed(python: str) -> tuple[str, Path]:
    """(version, package folder) of the venv's DeepSpeed, found without importing it."""
    result = cmd.run([python, "-c", _FIND_DS], capture=True, echo=False)
    lines = result.stdout.split()
    if not result.ok or len(lines) != 2:
        raise RunError(
            f"{python} has no importable DeepSpeed",
            why=result.tail(),
            fix="pass the python of a venv with torch + DeepSpeed (e.g. a dev venv)",
        )
    return lines[0], Path(lines[1])


def pytest_target(python_minor: str) -> Path:
    """A --target folder with the host's pytest, made once per version set and reused."""
    pins = [f"{d}=={importlib.metadata.version(d)}" for d in PYTEST_DISTS]
    key = "-".join(p.replace("==", "") for p in pins)
    folder = cache_root() / "pr-pytest" / f"py{python_minor}-{key}"
    if (folder / "pytest").is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    try:
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
        result = cmd.run([*pip, "--target", str(tmp), *pins])
        if not result.ok:
            raise RunError(
                "installing pytest for the PR harness failed",
                why=result.tail(),
                fix=f"check that pip reaches an index with {' '.join(pins)}",
            )
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def patch_for(version: str) -> Path:
    path = REPO_ROOT / "patches" / f"deepspeed-{version}.patch"
    if not path.is_file():
        raise RunError(
            f"no patch for DeepSpeed {version} in patches/",
            fix=f"make one: python -m repro patches --print {version} > {path}",
        )
    return path


def patched_copy(package: Path, patch: Path, dest: Path) -> Path:
    """Copy the installed `deepspeed` package into dest/ and apply the patch there (-p1)."""
    if shutil.which("patch") is None:
        raise MissingToolError("GNU patch is not installed", fix="apt-get install patch")
    shutil.copytree(package, dest / "deepspeed", ignore=shutil.ignore_patterns("__pycache__"))
    result = cmd.run(["patch", "-p1", "--batch", "--forward", "-i", str(patch)], cwd=dest, capture=True)
    if not result.ok:
        raise RunError(f"{patch.name} does not apply to the installed DeepSpeed", why=result.tail())
    return dest


def run_variant(python: str, variant: Variant, work: Path, transport: str = "async") -> VariantRun:
    version, package = installed_deepspeed(python)
    patch = patch_for(version) if variant is Variant.PATCHED else None
    patched = patched_copy(package, patch, work / "patched") if patch else None
    console.info(f"== {variant.value}: DeepSpeed {version}{' + ' + patch.name if patch else ''}")
    exit_code, results = run_pytest(python, variant.value, patched, work, transport)
    return VariantRun(variant, version, exit_code, results)


def run_pytest(
    python: str,
    label: str,
    first: Path | None,
    work: Path,
    transport: str = "async",
    test_file: Path = TEST_FILE,
) -> tuple[int, tuple[CaseResult, ...]]:
    """The test file through the harness in `python`, with `first` (a folder holding a `deepspeed`
    package: a patched copy, or a DeepSpeed commit's tree) ahead of the venv's own DeepSpeed."""
    work.mkdir(parents=True, exist_ok=True)
    probe = cmd.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture=True, echo=False
    )
    has_pytest = cmd.run([python, "-c", "import pytest"], capture=True, echo=False).ok
    tools = None if has_pytest else pytest_target(probe.stdout.strip())
    junit = work / f"junit-{label}.xml"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=os.pathsep.join(str(p) for p in (first, tools, HARNESS, REPO_ROOT) if p is not None),
        MICS_PR_TRANSPORT=transport,
        PYTHONDONTWRITEBYTECODE="1",
    )
    argv = [python, "-m", "pytest", "-p", PLUGIN, "-c", os.devnull, "--rootdir", str(test_file.parents[3])]
    argv += ["-p", "no:cacheprovider", "-q", f"--junitxml={junit}", str(test_file)]
    result = cmd.run(argv, env=env, cwd=work, tee=work / f"pytest-{label}.log")
    if not junit.is_file():
        raise RunError(
            f"pytest wrote no report for the {label} run (exit {result.returncode})",
            fix=f"read {work / f'pytest-{label}.log'}",
        )
    return result.returncode, parse_junit(junit.read_text())


def summary(runs: Sequence[VariantRun]) -> str:
    ids = sorted({r.test_id for run in runs for r in run.results})
    width = max((len(i) for i in ids), default=10)
    lines = [f"{'test':<{width}}  " + "  ".join(f"{run.variant.value:<8}" for run in runs)]
    for test_id in ids:
        cells = [run.outcomes().get(test_id, None) for run in runs]
        lines.append(f"{test_id:<{width}}  " + "  ".join(f"{c.value if c else '-':<8}" for c in cells))
    return "\n".join(lines)
