"""Issue #33 item 1: a venv's pins follow the venv's Python (the host's), not the env's image Python.

The host's interpreters are stand-ins: `shutil.which` names them and the one subprocess door
(`repro.core.cmd.run`) answers the version probe, so a Rocky 9 host (Python 3.9) or an Ubuntu 24.04
host (Python 3.12) is described without either being installed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from repro.cli import main as cli
from repro.core import cmd
from repro.core.cmd import CmdResult
from repro.core.errors import PythonVersionError
from repro.engines import base
from repro.engines.venv import engine as engine_venv
from repro.engines.venv.engine import VenvEngine, VenvMarker
from repro.engines.wheelhouse import DownloadPlan, Wheelhouse
from repro.matrix.model import Env, Matrix
from repro.matrix.schema import MatrixProblemsError, load_matrix
from repro.run.orchestrate import Step, describe

ROCKY9_PYTHON = "/usr/bin/python3.9"  # RHEL / Rocky 9's own Python
NOBLE_PYTHON = "/usr/bin/python3.12"  # Ubuntu 24.04's own Python


class RecordingWheelhouse(Wheelhouse):
    """Records what the engine asks it to download (the specs and the Python they are for)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, offline=False)
        self.plans: list[DownloadPlan] = []

    def ensure(self, env: Any, python: str | None = None) -> bool:
        self.plans.append(DownloadPlan.for_env(env, python))
        return True


def host(
    monkeypatch: pytest.MonkeyPatch, interpreters: Mapping[str, str], this: str, torch: str = "2.1.0+cu121"
) -> list[tuple[str, ...]]:
    """A host whose PATH holds `interpreters` (path -> version); this tool runs on `this`.
    Returns the recorded commands; pip and venv succeed and leave what the engine checks."""
    by_name = {Path(p).name: p for p in interpreters}

    def which(name: str) -> str | None:
        if name == sys.executable:
            return this
        return name if name in interpreters else by_name.get(name)

    calls: list[tuple[str, ...]] = []

    def run(argv: Any, **kw: Any) -> CmdResult:
        args = tuple(str(a) for a in argv)
        calls.append(args)
        if args[1:2] == ("-c",) and "sys.version_info" in args[2]:
            return CmdResult(args, 0, stdout=interpreters[args[0]] + "\n")
        if args[1:3] == ("-m", "venv"):
            (Path(args[3]) / "bin").mkdir(parents=True)
            (Path(args[3]) / "bin" / "python").write_text("")
            return CmdResult(args, 0)
        if args[1:2] == ("-c",) and "importlib.metadata" in args[2]:
            return CmdResult(args, 0, stdout=f"{torch_of[0]} {deepspeed_of[0]}\n{build_of[0]}\n")
        return CmdResult(args, 0)

    def run_logged(argv: Any, log: Path, what: str, **kw: Any) -> tuple[CmdResult, str]:
        return run(argv), ""

    # What the built venv's torch probe answers: torch.__version__, .hip, .cuda (PyPI's 2.1.0: CUDA 12.1).
    torch_of, deepspeed_of, build_of = ["2.1.0"], ["0.13.1"], [f"{torch} - 12.1"]
    monkeypatch.setattr(engine_venv.shutil, "which", which)
    monkeypatch.setattr(cmd, "run", run)
    monkeypatch.setattr(cmd, "run_logged", run_logged)
    monkeypatch.delenv("MICS_REPRO_PYTHON", raising=False)
    return calls


@pytest.fixture
def matrix() -> Matrix:
    return load_matrix()


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> VenvEngine:
    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MICS_REPRO_OFFLINE", raising=False)
    return VenvEngine(
        root=tmp_path / "venvs", wheelhouse=RecordingWheelhouse(tmp_path / "wheels"), repo_root=tmp_path
    )


def pins_of(specs: tuple[str, ...] | list[str]) -> dict[str, str]:
    return dict(s.split("==", 1) for s in specs if "==" in s and not s.startswith("torch"))


# -- a Python 3.9 host (RHEL / Rocky 9) -------------------------------------------------------------
@pytest.mark.parametrize("env_id", ["cuda", "rocm61"])
def test_a_python39_host_gets_pins_that_exist_for_39(
    env_id: str, matrix: Matrix, engine: VenvEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    host(monkeypatch, {ROCKY9_PYTHON: "3.9.18"}, this=ROCKY9_PYTHON)
    env = matrix.get(env_id)
    assert env.python == "3.10"  # the image's Python, which [pins] alone were made for
    built = engine.resolve_env(env)
    for_39 = matrix.tables.pins_for_python["3.9"]
    got = built.package_pins()
    # Every package with a 3.9 release chosen in envs.toml gets that release, none keeps the
    # [pins] default that needs a newer Python (pip 26.3, pydantic 2.14.4 ...).
    # numpy follows torch's rule first (numpy 1.26 below torch 2.4), then the Python's table.
    assert got["numpy"] == matrix.tables.numpy(env.torch, "3.9")
    assert {n: got[n] for n in got if n in for_39 and n != "numpy"} == {
        n: v for n, v in for_39.items() if n in got and n != "numpy"
    }
    assert got["pip"] == for_39["pip"] != matrix.tables.pins["pip"]
    assert got["pydantic"] == for_39["pydantic"] != matrix.tables.pins["pydantic"]
    assert built.python == "3.9" and built.pins()["python"] == "3.9"
    assert built.torch == env.torch and built.deepspeed == env.deepspeed
    choice = built.python_choice
    assert choice is not None and (choice.python, choice.image_python) == ("3.9", "3.10")
    assert ("pip", matrix.tables.pins["pip"], for_39["pip"]) in choice.changed
    # The preamble says which Python, why, and which pins moved.
    preamble = describe([Step(built, ())], engine.describe())
    assert f"{env_id}: {choice.describe()}" in preamble and ROCKY9_PYTHON in preamble


def test_the_venv_and_its_wheelhouse_are_built_with_the_39_pins(
    matrix: Matrix, engine: VenvEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = host(monkeypatch, {ROCKY9_PYTHON: "3.9.18"}, this=ROCKY9_PYTHON)
    env = matrix.get("cuda")
    prepared = engine.prepare(env)
    for_39 = matrix.tables.pins_for_python["3.9"]
    assert prepared.details["python_choice"].startswith("Python 3.9")  # gpu-check's build step shows it
    wheelhouse = engine.wheelhouse
    assert isinstance(wheelhouse, RecordingWheelhouse)
    [plan] = wheelhouse.plans
    assert plan.python == "3.9"
    assert pins_of(plan.pinned())["pip"] == for_39["pip"]
    assert pins_of(plan.pinned())["pydantic"] == for_39["pydantic"]
    installs = [c for c in calls if c[1:4] == ("-m", "pip", "install")]
    installed = pins_of([a for c in installs for a in c])
    assert installed["pip"] == for_39["pip"] and installed["pydantic-core"] == for_39["pydantic-core"]
    assert f"pip=={matrix.tables.pins['pip']}" not in {a for c in installs for a in c}
    made = [c for c in calls if c[1:3] == ("-m", "venv")]
    assert made and made[0][0] == ROCKY9_PYTHON
    built = engine.resolve_env(env)
    marker = VenvMarker.read(engine.venv_dir(built))
    assert marker is not None and marker.python == "3.9" and marker.pins == built.pins()


def test_dry_run_shows_the_python_and_the_pins_chosen_for_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    host(monkeypatch, {ROCKY9_PYTHON: "3.9.18"}, this=ROCKY9_PYTHON)
    assert cli.main(["build", "--env", "cuda", "--dry-run"]) == 0
    out = capsys.readouterr().out
    tables = load_matrix().tables
    assert "venv (ENGINE=venv): Python 3.9" in out
    assert f"pip {tables.pins['pip']} -> {tables.pins_for_python['3.9']['pip']}" in out


def test_resolving_twice_gives_the_same_env(
    matrix: Matrix, engine: VenvEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    host(monkeypatch, {ROCKY9_PYTHON: "3.9.18"}, this=ROCKY9_PYTHON)
    once = engine.resolve_env(matrix.get("rocm61"))
    twice = engine.resolve_env(once)
    assert twice.pins() == once.pins() and twice.python_choice == once.python_choice
    assert base.as_built(engine, matrix.get("rocm61")).pins() == once.pins()


def test_rocm56_on_a_310_host_gets_310_pins_not_its_images_39_ones(
    matrix: Matrix, engine: VenvEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    host(monkeypatch, {"/usr/bin/python3.10": "3.10.12"}, this="/usr/bin/python3.10")
    built = engine.resolve_env(matrix.get("rocm56"))
    assert built.python == "3.10" and built.package_pins()["pip"] == matrix.tables.pins["pip"]


def refused(step: Callable[[Env], object], env: Env) -> PythonVersionError:
    """The PythonVersionError `step` (the engine's resolve_env or prepare) raises for `env`."""
    with pytest.raises(PythonVersionError) as err:
        step(env)
    return err.value


# -- a Python 3.12 host (Ubuntu 24.04) --------------------------------------------------------------
@pytest.mark.parametrize(("env_id", "want"), [("cuda", "3.10"), ("cpu", "3.11"), ("rocm56", "3.9")])
def test_a_312_host_is_told_which_python_to_install_for_torch21(
    env_id: str, want: str, matrix: Matrix, engine: VenvEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = host(monkeypatch, {NOBLE_PYTHON: "3.12.3"}, this=NOBLE_PYTHON)
    err = refused(engine.prepare, matrix.get(env_id))
    assert err.exit_code == 12
    assert f"uv python install {want}" in err.fix
    assert f"MICS_REPRO_PYTHON=$(uv python find {want})" in err.fix
    assert "3.12" in err.what + err.why
    assert not [c for c in calls if "pip" in c or "venv" in c]  # refused before any build


def test_a_312_host_with_a_python311_beside_it_uses_that_one(
    matrix: Matrix, engine: VenvEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # deadsnakes' python3.11 next to Ubuntu 24.04's 3.12: no 3.10 (the cuda image's) needed.
    host(monkeypatch, {NOBLE_PYTHON: "3.12.3", "/usr/bin/python3.11": "3.11.9"}, this=NOBLE_PYTHON)
    built = engine.resolve_env(matrix.get("cuda"))
    assert built.python == "3.11"
    assert built.python_choice is not None and "/usr/bin/python3.11" in built.python_choice.why


# -- Pythons the pins do not cover, and interpreters that are not what they say ----------------------
def test_python38_has_torch21_wheels_but_no_pins_so_it_is_refused(
    matrix: Matrix, engine: VenvEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    host(monkeypatch, {"/usr/bin/python3.8": "3.8.10"}, this="/usr/bin/python3.8")
    err = refused(engine.resolve_env, matrix.get("cuda"))
    assert "uv python install 3.10" in err.fix and "3.9" in err.why


def test_an_override_python_without_pins_is_refused_before_the_build(
    matrix: Matrix, engine: VenvEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = host(monkeypatch, {"/opt/py38/python3.8": "3.8.10"}, this="/opt/py38/python3.8")
    monkeypatch.setattr(engine, "python_override", "/opt/py38/python3.8")
    err = refused(engine.prepare, matrix.get("cuda"))
    assert "MICS_REPRO_PYTHON" in err.fix
    assert not [c for c in calls if "pip" in c]


@pytest.mark.parametrize("printed", ["", "Python 3.9.18", "2.7.18", "3.x.y", "3.9.18\nrm -rf /"])
def test_an_interpreter_that_prints_no_cpython_version_is_a_typed_error(
    printed: str, matrix: Matrix, engine: VenvEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    host(monkeypatch, {"/opt/odd/python3": printed}, this="/opt/odd/python3")
    err = refused(engine.resolve_env, matrix.get("cuda"))
    assert "/opt/odd/python3" in err.what


def test_a_broken_python3x_on_path_does_not_hide_a_working_one(
    matrix: Matrix, engine: VenvEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 3.12 host whose python3.11 is a leftover wrapper that prints nonsense, and a good python3.10.
    interpreters = {
        NOBLE_PYTHON: "3.12.3",
        "/usr/local/bin/python3.11": "oops",
        "/usr/bin/python3.10": "3.10.14",
    }
    host(monkeypatch, interpreters, this=NOBLE_PYTHON)
    assert engine.resolve_env(matrix.get("rocm56")).python == "3.10"
    del interpreters["/usr/bin/python3.10"]
    host(monkeypatch, interpreters, this=NOBLE_PYTHON)
    err = refused(engine.resolve_env, matrix.get("rocm56"))
    assert "/usr/local/bin/python3.11" in err.what and "uv python install 3.9" in err.fix


def test_a_torch_outside_the_python_table_still_needs_a_python_the_pins_cover(
    matrix: Matrix, engine: VenvEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    future = matrix.derive("cpu", torch="2.99.0")  # torch's Python range unknown: left to pip
    assert future.pythons() is None
    host(monkeypatch, {"/usr/bin/python3.8": "3.8.10"}, this="/usr/bin/python3.8")
    refused(engine.resolve_env, future)
    host(monkeypatch, {ROCKY9_PYTHON: "3.9.18"}, this=ROCKY9_PYTHON)
    assert engine.resolve_env(future).package_pins()["pip"] == matrix.tables.pins_for_python["3.9"]["pip"]


def test_a_hand_made_env_keeps_its_pins_on_any_python() -> None:
    env = load_matrix().get("cpu")
    bare: Env = replace(env, tables=None)
    assert bare.for_python("3.9").pins() == bare.pins()


# -- the README table: generated from the same data the engine uses ---------------------------------
def test_every_env_accepts_its_images_python_and_the_table_lists_each_env(matrix: Matrix) -> None:
    from repro.matrix import pythons

    table = pythons.render_table(matrix).splitlines()
    assert len(table) == 2 + len(matrix)
    for env_id in matrix.ids():
        env = matrix.get(env_id)
        accepted = env.pythons()
        assert accepted is not None and env.python in accepted, env_id
        assert env.python_to_install() == env.python
        assert any(line.startswith(f"| `{env_id}` |") and ", ".join(accepted) in line for line in table)
    assert matrix.get("cuda").pythons() == ("3.9", "3.10", "3.11")
    assert "3.12" in (matrix.get("rocm61").pythons() or ())


def test_an_env_whose_image_python_the_pins_do_not_cover_is_a_matrix_problem(tmp_path: Path) -> None:
    # torch 2.1 has Python 3.8 wheels, but no [pins_for_python."3.8"] says which pip etc. install there.
    text = load_matrix().path.read_text()
    edited = tmp_path / "envs.toml"
    edited.write_text(text.replace('python = "3.9"\ntorch = "2.1.0"', 'python = "3.8"\ntorch = "2.1.0"', 1))
    assert edited.read_text() != text
    with pytest.raises(MatrixProblemsError) as err:
        load_matrix(edited)
    assert [(p.env, p.key) for p in err.value.problems] == [("rocm56", "python")]


def test_make_repro_records_the_pins_the_venv_holds_and_says_why(
    tmp_path: Path, engine: VenvEngine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the use case: the preamble and results.json carry the venv's pins, not the image's."""
    import json

    from repro.core.errors import SuiteFailedError
    from repro.run.orchestrate import Request
    from repro.run.usecase import RunTarget, run_request

    host(monkeypatch, {ROCKY9_PYTHON: "3.9.18"}, this=ROCKY9_PYTHON, torch="2.1.0")
    matrix = load_matrix()
    target = RunTarget(engine="venv", results_root=tmp_path / "results", out=tmp_path / "out")
    # The faked suite records no run, so the use case ends with its "incomplete" error; what it
    # recorded about the env is the point here.
    with pytest.raises(SuiteFailedError):
        run_request(Request(env_ids=("cpu",)), target, matrix, engine_for=lambda _: engine)
    recorded = json.loads((tmp_path / "out" / "results.json").read_text())["envs"]["cpu"]["pins"]
    for_39 = matrix.tables.pins_for_python["3.9"]
    assert recorded["python"] == "3.9" and recorded["pip"] == for_39["pip"] != matrix.tables.pins["pip"]
    said = capsys.readouterr()
    assert f"cpu: Python 3.9 ({ROCKY9_PYTHON}" in said.out + said.err


def test_the_docs_python_table_is_the_generated_one(matrix: Matrix) -> None:
    """docs/gpu-hosts.md ("Which Python a host needs") holds the table between pythons-table
    markers; it must be what `python -m repro.matrix.pythons` prints."""
    import re

    from repro.core import paths
    from repro.matrix import pythons

    text = (paths.REPO_ROOT / "docs" / "gpu-hosts.md").read_text()
    found = re.search(r"<!-- pythons-table:start[^>]*-->\n(.*?)\n<!-- pythons-table:end -->", text, re.S)
    assert found is not None, (
        "docs/gpu-hosts.md lost its pythons-table markers (see `python -m repro.matrix.pythons`)"
    )
    assert found.group(1).strip() == pythons.render_table(matrix).strip(), (
        "docs/gpu-hosts.md's Python table is stale: regenerate it with `python -m repro.matrix.pythons`"
    )
