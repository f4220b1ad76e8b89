"""Layers are the env (issue #29 items 1 and 2; repro/engines/venv/layer_env.py): every venv
layered over an env's venv (a release probe's, a DeepSpeed checkout's, a job's) is made by the
base venv's own interpreter, not the tool's, and runs the base's console scripts (torchrun...)
under its own interpreter, so they import what only the layer has.

Real but cheap: tiny venvs without pip, made by stand-in interpreters (links to this Python under
two different names, as a host's pyenv Python and the env's /usr/bin/python3.11 are two), a
stand-in `torchrun` console script as pip writes them; pip installs are faked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from repro.bisect.ds_layer import DeepSpeedLayer
from repro.core import cmd
from repro.core.cmd import CmdResult
from repro.core.errors import BuildError
from repro.engines import jobdeps
from repro.engines.base import EngineKind, Prepared
from repro.engines.venv import joblayer
from repro.engines.venv.engine import MARKER, VenvEngine, VenvMarker
from repro.engines.venv.layer import link_base
from repro.engines.venv.layer_env import base_interpreter, carry_scripts
from repro.engines.wheelhouse import Wheelhouse
from repro.matrix.schema import load_matrix
from tests.fixtures.stand_in_engine import StandInEngine

pytestmark = pytest.mark.usefixtures("real_subprocess")

MINOR = f"{sys.version_info[0]}.{sys.version_info[1]}"
REAL_PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
# What pip writes for a console-script entry point (`torchrun = fakerun:main`).
CONSOLE_SCRIPT = (
    "# -*- coding: utf-8 -*-\n"
    "import re\n"
    "import sys\n"
    "from fakerun import main\n"
    "if __name__ == '__main__':\n"
    "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
    "    sys.exit(main())\n"
)
# The package behind it lives in the base; it reports what the running interpreter imports.
FAKERUN = (
    "import sys\n"
    "def main():\n"
    "    import layer_only\n"
    "    print(layer_only.WHERE, sys.executable, sep='\\n')\n"
    "    return 0\n"
)


def stand_in_python(root: Path, name: str) -> Path:
    """An interpreter at a path of its own (a link to this Python's binary)."""
    bin_dir = root / name / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / f"python{MINOR}").symlink_to(REAL_PYTHON)
    return bin_dir / f"python{MINOR}"


def purelib(venv: Path) -> Path:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def cfg(venv: Path) -> dict[str, str]:
    pairs = (line.partition("=") for line in (venv / "pyvenv.cfg").read_text().splitlines())
    return {k.strip(): v.strip() for k, _, v in pairs}


def make_base(venv: Path, python: Path) -> Path:
    """The env's venv: made by `python`, with the fakerun package and a `torchrun` console script
    (plain #! line) and a `ds_report` one in pip's /bin/sh trampoline form (long paths)."""
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(venv)], check=True)
    (purelib(venv) / "fakerun.py").write_text(FAKERUN)
    py = venv / "bin" / "python"
    plain = len(str(py)) < 125 and " " not in str(py)  # else pip writes the trampoline for it too
    trampoline = f"#!/bin/sh\n'''exec' \"{py}\" \"$0\" \"$@\"\n' '''\n"
    (venv / "bin" / "torchrun").write_text(
        f"#!{py}\n{CONSOLE_SCRIPT}" if plain else trampoline + CONSOLE_SCRIPT
    )
    (venv / "bin" / "ds_report").write_text(trampoline + CONSOLE_SCRIPT)
    for name in ("torchrun", "ds_report"):
        (venv / "bin" / name).chmod(0o755)
    return venv


def run_on_path(layer: Path, command: str) -> list[str]:
    """`command` as the job runner runs a job: `bash -c` with the layer's bin/ first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{layer / 'bin'}{os.pathsep}/usr/bin:/bin"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"
    return done.stdout.splitlines()


def assert_is_the_env(layer: Path, base: Path, env_python: Path) -> None:
    """The layer runs the base's interpreter (pyvenv.cfg and bin/python), not the host's."""
    assert base_interpreter(base) == env_python
    assert base_interpreter(layer) == env_python
    assert cfg(layer)["home"] == cfg(base)["home"] == str(env_python.parent)


# -- (a)+(b) a release probe's layer (repro/engines/venv/engine.py), then a job's over it --------
def test_a_release_layer_and_a_job_layer_over_it_are_the_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_python = stand_in_python(tmp_path / "pythons", "env")  # made the env's venv (/usr/bin/python3.11)
    host_python = stand_in_python(tmp_path / "pythons", "host")  # runs this tool (pyenv's 3.11.7)
    matrix = load_matrix()
    root_env, probe_env = matrix.get("cpu"), matrix.derive("cpu", deepspeed="0.14.0")
    engine = VenvEngine(root=tmp_path / "venvs", wheelhouse=Wheelhouse(tmp_path / "wh", offline=True))
    base = make_base(engine.root / "cpu-base", env_python)
    (base / MARKER).write_text(VenvMarker(root_env.id, root_env.pins(), MINOR).to_json())

    interp = type("I", (), {"path": str(host_python), "minor": MINOR, "version": "host", "why": "stub"})()
    monkeypatch.setattr(engine, "interpreter", lambda env: interp)
    monkeypatch.setattr("repro.engines.preflight.check_python", lambda *a, **k: None)
    monkeypatch.setattr(engine, "_verify", lambda env, py: None)

    def fake_pip(argv: list[str], environment: Any, tmp: Path, env: Any, what: str) -> None:
        # What `pip install deepspeed==0.14.0` puts in the layer: a package only the layer has.
        (purelib(tmp) / "layer_only.py").write_text("WHERE = 'release-layer'\n")

    monkeypatch.setattr(engine, "_pip", fake_pip)

    prepared = engine.prepare(probe_env)
    layer = Path(prepared.handle)
    assert prepared.details["layered_on"] == str(base) and layer != base
    assert_is_the_env(layer, base, env_python)
    # The env's commands are the layer's: torchrun (and a trampoline script) run on the layer's
    # interpreter and import the layer's packages.
    python = str(layer / "bin" / "python")
    assert run_on_path(layer, "torchrun --nproc_per_node 2") == ["release-layer", python]
    assert run_on_path(layer, "ds_report") == ["release-layer", python]
    # Why a link to the base's script would not do: it runs the base's interpreter, blind to the layer.
    direct = subprocess.run([str(base / "bin" / "torchrun")], capture_output=True, text=True)
    assert direct.returncode != 0 and "layer_only" in direct.stderr

    # A job's packages over that probe layer (make run DEEPSPEED=... REQUIREMENTS=...).
    def fake_install(argv: list[str], log: Path, what: str, **kw: Any) -> tuple[CmdResult, str]:
        site = purelib(Path(argv[0]).parent.parent)
        (site / "layer_only.py").write_text("WHERE = 'job-layer'\n")
        info = site / "layer_only-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: layer-only\nVersion: 1.0\n")
        return CmdResult(tuple(argv), 0), ""

    monkeypatch.setattr(cmd, "run_logged", fake_install)
    deps = jobdeps.parse(None, "layer-only==1.0")
    assert deps is not None
    job = joblayer.ensure_layer(
        layer, deps, env_id=probe_env.id, sources=[], wheelhouse=tmp_path / "wh", offline=True
    )
    assert job.packages == {"layer-only": "1.0"}
    assert_is_the_env(job.path, layer, env_python)
    job_python = str(job.path / "bin" / "python")
    assert run_on_path(job.path, "torchrun") == ["job-layer", job_python]
    assert run_on_path(job.path, "ds_report") == ["job-layer", job_python]


def test_a_cached_layer_of_the_old_format_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer made before this change (another Python, no torchrun) must not be reused."""
    matrix = load_matrix()
    root_env, probe_env = matrix.get("cpu"), matrix.derive("cpu", deepspeed="0.14.0")
    engine = VenvEngine(root=tmp_path / "venvs", wheelhouse=Wheelhouse(tmp_path / "wh", offline=True))
    base = engine.root / "cpu-base"
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "python").touch()
    (base / MARKER).write_text(VenvMarker(root_env.id, root_env.pins(), MINOR).to_json())
    old = engine.venv_dir(probe_env)
    (old / "bin").mkdir(parents=True)
    (old / "bin" / "python").touch()
    layered = {
        "venv": str(base),
        "env_id": "cpu",
        "pins": dict(root_env.pins()),
        "installed": [],
        "unused": [],
    }
    (old / MARKER).write_text(VenvMarker(probe_env.id, probe_env.pins(), MINOR, layered).to_json())
    interp = type("I", (), {"path": "py", "minor": MINOR, "version": "x", "why": "stub"})()
    monkeypatch.setattr(engine, "interpreter", lambda env: interp)
    monkeypatch.setattr("repro.engines.preflight.check_python", lambda *a, **k: None)
    monkeypatch.setattr("repro.engines.venv.intact.damage", lambda sites: None)
    rebuilt: list[Path] = []
    monkeypatch.setattr(
        engine, "_build_layer", lambda env, i, want, final, plan: rebuilt.append(final) or want
    )
    assert not engine.prepare(probe_env).reused and rebuilt == [old]


# -- (a)+(b) a DeepSpeed checkout's layer (repro/bisect/ds_layer.py) ------------------------------
class _CachedBase(StandInEngine):
    def __init__(self, venv: Path) -> None:
        self.venv = venv

    def prepare(self, env: Any) -> Prepared:
        return Prepared(EngineKind.VENV, env.id, str(self.venv), str(self.venv), True, {})


def test_a_deepspeed_checkout_layer_is_the_env(tmp_path: Path) -> None:
    env_python = stand_in_python(tmp_path / "pythons", "env")
    base = make_base(tmp_path / "venvs" / "cpu-latest-abc", env_python)
    (tmp_path / "DeepSpeed").mkdir()
    overlay = DeepSpeedLayer(_CachedBase(base), tmp_path / "DeepSpeed", cmd.run, venv_only="test")  # type: ignore[arg-type]
    made = overlay.layer_venv(type("E", (), {"id": "cpu-latest"})(), with_pip=False)
    assert_is_the_env(made.path, base, env_python)
    (made.site / "layer_only.py").write_text("WHERE = 'checkout-layer'\n")
    assert run_on_path(made.path, "torchrun") == ["checkout-layer", str(made.python)]
    assert run_on_path(made.path, "ds_report") == ["checkout-layer", str(made.python)]


def test_an_old_checkout_layer_on_another_python_is_remade_and_the_work_tree_it_links_is_kept(
    tmp_path: Path,
) -> None:
    env_python = stand_in_python(tmp_path / "pythons", "env")
    host_python = stand_in_python(tmp_path / "pythons", "host")
    base = make_base(tmp_path / "venvs" / "cpu-latest-abc", env_python)
    tree = tmp_path / "DeepSpeed"
    (tree / "deepspeed").mkdir(parents=True)
    (tree / "deepspeed" / "__init__.py").write_text("# the user's work tree\n")
    overlay = DeepSpeedLayer(_CachedBase(base), tree, cmd.run, venv_only="test")  # type: ignore[arg-type]
    env = type("E", (), {"id": "cpu-latest"})()
    first = overlay.layer_venv(env, with_pip=False)
    # As an older version of the tool left it: made by another Python, linking the work tree.
    shutil.rmtree(first.path)
    subprocess.run([str(host_python), "-m", "venv", "--without-pip", str(first.path)], check=True)
    (purelib(first.path) / "deepspeed").symlink_to(tree / "deepspeed", target_is_directory=True)
    assert base_interpreter(first.path) == host_python
    again = overlay.layer_venv(env, with_pip=False)
    assert base_interpreter(again.path) == env_python and (again.path / "bin" / "torchrun").is_file()
    assert (tree / "deepspeed" / "__init__.py").read_text() == "# the user's work tree\n"


def test_scripts_the_layer_has_and_scripts_of_other_interpreters_are_left_alone(tmp_path: Path) -> None:
    base, layer = tmp_path / "base", tmp_path / "layer"
    for venv in (base, layer):
        (venv / "bin").mkdir(parents=True)
    (base / "bin" / "deepspeed").write_text(f"#!{base}/bin/python\nprint('base release')\n")
    (layer / "bin" / "deepspeed").write_text(f"#!{layer}/bin/python\nprint('layer release')\n")
    (base / "bin" / "other").write_text("#!/usr/bin/python3\nprint('system')\n")
    (base / "bin" / "activate").write_text(f"VIRTUAL_ENV={base}\n")
    (base / "bin" / "long").write_text(f"#!{base}/bin/python3.11 -E\nprint('x')\n")
    assert carry_scripts(base, layer) == ("long",)
    assert "layer release" in (layer / "bin" / "deepspeed").read_text()
    assert (layer / "bin" / "long").read_text() == f"#!{layer}/bin/python -E\nprint('x')\n"
    assert os.access(layer / "bin" / "long", os.X_OK)


# -- long and awkward paths, hostile scripts ------------------------------------------------------
@pytest.mark.parametrize("name", ["d" * 130, "with space"])
def test_a_layer_at_a_long_or_spaced_path_gets_the_sh_trampoline_and_runs(tmp_path: Path, name: str) -> None:
    env_python = stand_in_python(tmp_path / "pythons", "env")
    base = make_base(tmp_path / name / "base", env_python)
    layer = tmp_path / name / "layer"
    subprocess.run([str(env_python), "-m", "venv", "--without-pip", str(layer)], check=True)
    (purelib(layer) / "layer_only.py").write_text("WHERE = 'layer'\n")
    link_base(purelib(layer), str(purelib(base)))
    assert set(carry_scripts(base, layer)) == {"torchrun", "ds_report"}
    assert (layer / "bin" / "torchrun").read_text().startswith("#!/bin/sh\n'''exec' ")
    python = str(layer / "bin" / "python")
    assert run_on_path(layer, "torchrun && ds_report") == ["layer", python, "layer", python]


def test_a_path_the_trampoline_cannot_quote_is_a_build_error_and_odd_scripts_stay_behind(
    tmp_path: Path,
) -> None:
    base = tmp_path / "base"
    layer = tmp_path / ("$(touch pwned)" + "e" * 130) / "layer"
    for venv in (base, layer):
        (venv / "bin").mkdir(parents=True)
    (base / "bin" / "torchrun").write_text(f"#!{base}/bin/python\nprint('x')\n")
    with pytest.raises(BuildError) as err:
        carry_scripts(base, layer)
    assert "MICS_REPRO_CACHE" in err.value.fix and not (tmp_path / "pwned").exists()
    # Not one of pip's scripts: options that are not interpreter flags are never carried.
    (base / "bin" / "torchrun").write_text(f"#!{base}/bin/python -c 'import os'; touch x\nprint('x')\n")
    (base / "bin" / "bin.so").write_bytes(b"\x7fELF" + bytes(range(256)))
    assert carry_scripts(base, tmp_path / "base") == ()
