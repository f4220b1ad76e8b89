"""Layered probe venvs (repro/engines/venv/layer.py, repro/engines/venv/engine.py): the decision, the engine's
use of it with subprocesses faked, one real two-venv layering (cheap: no pip, no torch), and the
hard-linking of identical files between probe venvs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from repro.core import cmd
from repro.core.cmd import CmdResult
from repro.core.errors import BuildError
from repro.engines.venv.engine import MARKER, VenvEngine, VenvMarker, pip_error, share_identical_files
from repro.engines.venv.layer import BASE_PTH, Candidate, layer_base, link_base
from repro.engines.wheelhouse import Wheelhouse
from repro.matrix.schema import load_matrix
from tests.fixtures.fake_dist import install_fake, install_pins

BASE = {
    "recipe": "1",
    "platform": "cpu",
    "base_image": "python:3.11-slim-bookworm",
    "python": "3.11",
    "torch_index": "https://pypi.org/simple",
    "torch": "2.1.0",
    "numpy": "1.26.4",
    "pip": "26.3",
    "setuptools": "80.10.2",
    "wheel": "0.48.0",
    "deepspeed": "0.13.1",
    "hjson": "3.1.0",
    "pynvml": "13.0.1",
}


def want(**changes: str | None) -> dict[str, str]:
    out = dict(BASE, **{k: v for k, v in changes.items() if v is not None})
    return {k: v for k, v in out.items() if changes.get(k, "") is not None}


# -- the decision (pure) -----------------------------------------------------------------------
def test_only_deepspeed_differs_layers_and_installs_only_deepspeed() -> None:
    plan = layer_base(want(deepspeed="0.14.0"), "3.11", [Candidate("cpu-abc", BASE, "3.11")])
    assert plan is not None and plan.base == "cpu-abc"
    assert plan.install == ("deepspeed==0.14.0",) and plan.unused == ()


def test_newer_deepspeed_deps_go_into_the_layer_and_base_extras_are_listed() -> None:
    wanted = want(deepspeed="0.16.0", einops="0.8.2", pynvml=None)
    plan = layer_base(wanted, "3.11", [Candidate("b", BASE, "3.11")])
    assert plan is not None
    assert plan.install == ("deepspeed==0.16.0", "einops==0.8.2") and plan.unused == ("pynvml",)


@pytest.mark.parametrize(
    "change",
    [
        {"torch": "2.2.2"},
        {"numpy": "2.4.6"},
        {"torch_index": "https://download.pytorch.org/whl/cpu"},
        {"setuptools": "84.2.1"},
        {"hjson": "3.0.0"},  # a package both pin, at another version
        {"base_image": "other"},
    ],
)
def test_anything_but_deepspeed_differing_means_a_full_venv(change: dict[str, str]) -> None:
    assert layer_base(want(deepspeed="0.14.0", **change), "3.11", [Candidate("b", BASE, "3.11")]) is None


def test_no_layer_on_another_python_a_layer_or_a_stack_key_the_base_lacks() -> None:
    w = want(deepspeed="0.14.0")
    assert layer_base(w, "3.10", [Candidate("b", BASE, "3.11")]) is None
    assert layer_base(w, "3.11", [Candidate("b", BASE, "3.11", layered=True)]) is None
    assert layer_base(dict(w, rocm="5.6"), "3.11", [Candidate("b", BASE, "3.11")]) is None
    assert layer_base(w, "3.11", []) is None


def test_the_env_it_derives_from_wins_then_the_fewest_installs() -> None:
    other = dict(BASE, deepspeed="0.14.0")
    cands = [Candidate("a-other", other, "3.11"), Candidate("z-root", BASE, "3.11", preferred=True)]
    plan = layer_base(want(deepspeed="0.14.0"), "3.11", cands)
    assert plan is not None and plan.base == "z-root"
    cands = [Candidate("z", BASE, "3.11"), Candidate("a", other, "3.11")]
    plan = layer_base(want(deepspeed="0.14.0"), "3.11", cands)
    assert plan is not None and plan.base == "a" and plan.install == ()


# -- the engine, subprocesses faked ------------------------------------------------------------
class FakeRun:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[Any], **kw: Any) -> CmdResult:
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        out = ""
        if "venv" in argv[1:3]:
            target = Path(argv[-1])
            (target / "bin").mkdir(parents=True)
            (target / "bin" / "python").touch()
            (target / "pyvenv.cfg").write_text(f"home = {target}\n")
        elif "sysconfig" in argv[-1]:
            out = str(Path(argv[0]).parent.parent / "lib" / "site-packages") + "\n"
        elif "importlib.metadata" in argv[-1]:
            out = "2.1.0 0.14.0\n2.1.0 - 12.1\n"  # the second line: torch's build (PyPI's)
        elif argv[2:4] == ["pip", "install"]:
            install_pins(Path(argv[0]).parent.parent / "lib" / "site-packages", argv)
        return CmdResult(tuple(argv), 0, out, "")


def _base_venv(root: Path, env: Any) -> Path:
    base = root / "cpu-base"
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "python").touch()
    (base / MARKER).write_text(VenvMarker(env.id, env.pins(), "3.11").to_json())
    install_fake(base / "lib" / "site-packages", "torch", "2.1.0")
    install_fake(base / "lib" / "site-packages", "deepspeed", "0.13.1")
    return base


def test_engine_layers_a_deepspeed_probe_on_the_cached_base_and_reuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = load_matrix()
    root_env, probe_env = matrix.get("cpu"), matrix.derive("cpu", deepspeed="0.14.0")
    engine = VenvEngine(root=tmp_path / "venvs", wheelhouse=Wheelhouse(tmp_path / "wh", offline=False))
    base = _base_venv(engine.root, root_env)
    fake = FakeRun()
    monkeypatch.setattr(cmd, "run", fake)
    interp = type("I", (), {"path": "py3", "minor": "3.11", "version": "3.11.7", "why": "stub"})()
    monkeypatch.setattr(engine, "interpreter", lambda env: interp)
    monkeypatch.setattr("repro.engines.preflight.check_python", lambda *a, **k: None)

    first = engine.prepare(probe_env)
    assert not first.reused and first.details["layered_on"] == str(base)
    installs = [c for c in fake.calls if c[2:4] == ["pip", "install"]]
    assert [c[-1] for c in installs] == ["deepspeed==0.14.0"]  # torch is never reinstalled
    assert "--no-build-isolation" in installs[0] and "--without-pip" in fake.calls[0]
    marker = json.loads((Path(first.handle) / MARKER).read_text())
    assert marker["layered_on"]["venv"] == str(base)
    assert marker["layered_on"]["installed"] == ["deepspeed==0.14.0"]
    pth = Path(first.handle) / "lib" / "site-packages" / BASE_PTH
    assert str(base / "lib" / "site-packages") in pth.read_text()

    fake.calls.clear()
    again = engine.prepare(probe_env)
    assert again.reused and again.details["layered_on"] == str(base) and fake.calls == []

    # The base changed under the layer: the layer is rebuilt, not reused.
    (base / MARKER).write_text(VenvMarker("cpu", dict(root_env.pins(), hjson="0"), "3.11").to_json())
    monkeypatch.setenv("MICS_REPRO_NO_LAYER", "1")
    built: list[bool] = []
    monkeypatch.setattr(engine, "_build", lambda *a, **k: built.append(k["no_cache"]))
    monkeypatch.setattr("repro.engines.venv.engine.share_identical_files", lambda *a, **k: 0)
    assert not engine.prepare(probe_env).reused
    assert built == [True]  # a derived env's full build skips the wheelhouse and pip's cache


# -- one real layering: the layer's package shadows the base's, the base's others stay visible --
def test_real_layer_shadows_the_base(tmp_path: Path, real_subprocess: None) -> None:
    def make(name: str) -> tuple[Path, Path]:
        venv = tmp_path / name
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        out = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        )
        return venv, Path(out.stdout.strip())

    base, base_lib = make("base")
    layer, layer_lib = make("layer")
    (base_lib / "fakeds.py").write_text("VERSION = 'base'\n")
    (base_lib / "fakeds_dep.py").write_text("OK = True\n")
    (base_lib / "basehook.pth").write_text("import os; os.environ['BASE_PTH_RAN'] = '1'\n")
    (layer_lib / "fakeds.py").write_text("VERSION = 'layer'\n")
    link_base(layer_lib, str(base_lib))
    probe = "import os, fakeds, fakeds_dep; print(fakeds.VERSION, fakeds_dep.OK, os.environ['BASE_PTH_RAN'])"
    out = subprocess.run(
        [str(layer / "bin" / "python"), "-c", probe], check=True, capture_output=True, text=True
    )
    assert out.stdout.split() == ["layer", "True", "1"]


# -- hard links between probe venvs ------------------------------------------------------------
def test_identical_big_files_are_hard_linked_to_a_finished_peer(tmp_path: Path) -> None:
    def venv(name: str, payload: bytes, marker: bool = True) -> Path:
        d = tmp_path / name
        f = d / "lib" / "site-packages" / "nvidia" / "libbig.so"
        f.parent.mkdir(parents=True)
        f.write_bytes(payload)
        (d / "lib" / "site-packages" / "small.py").write_bytes(b"x")
        if marker:
            (d / MARKER).write_text("{}")
        return d

    big = b"A" * 4096
    new, same, other = venv("new", big), venv("same", big), venv("other", b"B" * 4096)
    half = venv("unfinished", big, marker=False)
    saved = share_identical_files(new, [half, other, same], min_bytes=1024)
    lib = Path("lib/site-packages/nvidia/libbig.so")
    assert saved == 4096
    assert (new / lib).stat().st_ino == (same / lib).stat().st_ino
    assert (new / lib).read_bytes() == big and (new / lib).stat().st_nlink == 2
    assert (half / lib).stat().st_nlink == 1 and (other / lib).stat().st_nlink == 1
    assert share_identical_files(new, [same], min_bytes=1024) == 0  # already linked


# -- a failed pip step names its cause ---------------------------------------------------------
def test_pip_error_ends_with_the_last_exception() -> None:
    text = """Collecting deepspeed==0.19.7
      File "deepspeed/compile/custom_ops/all_to_all.py", line 12, in <module>
          @torch.library.custom_op("autosp::all_to_all", mutates_args=())
      AttributeError: module 'torch.library' has no attribute 'custom_op'
      [end of output]
  note: This error originates from a subprocess, and is likely not a problem with pip.
error: metadata-generation-failed
"""
    cause = "AttributeError: module 'torch.library' has no attribute 'custom_op'"
    assert pip_error(text).splitlines()[-1] == cause
    assert pip_error("") == "see the output above"


def test_a_deepspeed_that_does_not_build_on_the_base_is_a_build_error_with_its_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = load_matrix()
    engine = VenvEngine(root=tmp_path / "venvs", wheelhouse=Wheelhouse(tmp_path / "wh", offline=False))
    _base_venv(engine.root, matrix.get("cpu"))
    fake = FakeRun()

    def failing(argv: Sequence[Any], **kw: Any) -> CmdResult:
        if [str(a) for a in argv][2:4] == ["pip", "install"]:
            kw["tee"].write_text("AttributeError: module 'torch.amp' has no attribute 'custom_fwd'\nerr\n")
            return CmdResult(tuple(map(str, argv)), 1, "", "")
        return fake(argv, **kw)

    monkeypatch.setattr(cmd, "run", failing)
    interp = type("I", (), {"path": "py3", "minor": "3.11", "version": "3.11.7", "why": "stub"})()
    monkeypatch.setattr(engine, "interpreter", lambda env: interp)
    monkeypatch.setattr("repro.engines.preflight.check_python", lambda *a, **k: None)
    with pytest.raises(BuildError) as info:
        engine.prepare(matrix.derive("cpu", deepspeed="0.18.8"))
    assert info.value.why.endswith("AttributeError: module 'torch.amp' has no attribute 'custom_fwd'")
    left = [p.name for p in engine.root.iterdir() if "0.18.8" in p.name and not p.name.endswith(".lock")]
    assert left == []  # nothing half-built kept
