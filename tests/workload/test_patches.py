"""The shipped patches and the run-time fix are one change.

Each shipped patch is applied with GNU `patch -p1` to a fresh copy of the pristine sdist; the
patched methods must be, AST for AST, what `fix.apply()` compiles, and nothing else in the tree
may differ. The sdists come from the wheelhouse (CI's .ci/run downloads them there); tests
skip with the reason when one is missing. The fix a real install compiles, checked against the
patched sdist (integration tier), is tests/workload/test_patches_integration.py.
"""

from __future__ import annotations

import ast
import builtins
import filecmp
import hashlib
import shutil
import subprocess
import tarfile
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from repro.cli import main as cli
from repro.upstream import patchgen
from repro.workload import fix
from tests.fixtures.deepspeed_sdist import find_method, sdist, unpack


def stand_in_module(target: fix.Target, path: Path) -> ModuleType:
    """A module whose source is the release's file, holding a placeholder class to patch.

    `apply()` reads the source, splices and compiles exactly as it does on a real install; only
    the globals are stand-ins (names the body needs, the release's decorators as identity).
    """
    module = ModuleType(target.module)
    module.__file__ = str(path)
    identity = lambda func=None, **_: func if func is not None else identity  # noqa: E731
    module.__dict__.update(
        {
            "__builtins__": builtins,
            "torch": None,
            "has_coalescing_manager": None,
            "get_coalescing_manager": None,
            "get_accelerator": None,
            "instrument_w_nvtx": None,
            "ZeroParamStatus": None,
            "compiler": SimpleNamespace(disable=identity),
            "disable_compiler_collective": identity,
            "stage_on_cpu": identity,
        }
    )
    setattr(module, target.cls, type(target.cls, (), {target.func: lambda self: None}))
    return module


SHIPPED = pytest.mark.parametrize("version", patchgen.SHIPPED)


@SHIPPED
def test_shipped_patch_is_what_the_generator_makes(version: str) -> None:
    sdist(version)
    text, diffs = patchgen.generate(version, patchgen.default_wheelhouse())
    shipped = patchgen.patch_file(version).read_text()
    assert shipped == text, "run `python -m repro.upstream.patchgen --write`"
    assert [d.path for d in diffs] == sorted({t.path for t in fix.TARGETS})
    assert all(d.added and d.removed for d in diffs)


@SHIPPED
@pytest.mark.usefixtures("real_subprocess")
def test_patch_applies_and_is_the_runtime_fix(
    version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("patch") is None:
        pytest.skip("GNU patch is not installed (apt-get install patch)")
    pristine = unpack(version, tmp_path / "pristine")
    patched = unpack(version, tmp_path / "patched")
    proc = subprocess.run(
        ["patch", "-p1", "--batch", "--forward", "-i", str(patchgen.patch_file(version))],
        cwd=patched,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # (a) run time: apply() on modules whose source is the pristine release file
    monkeypatch.setattr(fix, "_INSTALLED", {})
    modules: dict[str, Any] = {"deepspeed": SimpleNamespace(__version__=version)}
    modules.update({t.module: stand_in_module(t, pristine / t.path) for t in fix.TARGETS})
    assert fix.apply(modules.__getitem__)["source"] == "runtime"
    installed = fix.installed_sources()

    for target in fix.TARGETS:
        before = (pristine / target.path).read_text()
        after = (patched / target.path).read_text()
        # (b) the patch: the method GNU patch produced is the method apply() compiled
        compiled = fix.parse_function(installed[target.qualname])
        assert ast.dump(find_method(after, target)) == ast.dump(compiled)
        assert ast.dump(find_method(after, target)) != ast.dump(find_method(before, target))
        # ...and outside the owned statements the file is byte for byte the release's
        old, new = fix.locate(before, target), fix.locate(after, target)
        old_lines, new_lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
        assert new_lines[: new.start - 1] == old_lines[: old.start - 1]
        assert new_lines[new.end :] == old_lines[old.end :]
        assert new.unchanged and not old.unchanged

    # nothing else in the tree moved (no other file, no .orig/.rej left behind)
    touched = {t.path for t in fix.TARGETS}
    files = {str(p.relative_to(pristine)) for p in pristine.rglob("*") if p.is_file()}
    assert {str(p.relative_to(patched)) for p in patched.rglob("*") if p.is_file()} == files
    _, mismatch, errors = filecmp.cmpfiles(pristine, patched, sorted(files - touched), shallow=False)
    assert mismatch == [] and errors == []


@pytest.mark.usefixtures("real_subprocess")
def test_patch_reverses_cleanly(tmp_path: Path) -> None:
    if shutil.which("patch") is None:
        pytest.skip("GNU patch is not installed (apt-get install patch)")
    version = patchgen.SHIPPED[0]
    tree = unpack(version, tmp_path)
    patch = str(patchgen.patch_file(version))
    for flags in (["--forward"], ["--reverse"]):
        proc = subprocess.run(
            ["patch", "-p1", "--batch", *flags, "-i", patch], cwd=tree, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    for target in fix.TARGETS:
        with tarfile.open(sdist(version)) as tar:
            member = tar.extractfile(f"deepspeed-{version}/{target.path}")
            assert member is not None
            assert (tree / target.path).read_bytes() == member.read()


@SHIPPED
def test_check_catches_a_hand_edited_patch(
    version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheelhouse = str(sdist(version).parent)
    args = ["--patch-dir", str(tmp_path), "--wheelhouse", wheelhouse, "--versions", version]
    assert cli.main(["patches", "--write", *args]) == 0
    assert cli.main(["patches", "--check", *args]) == 0
    path = tmp_path / f"deepspeed-{version}.patch"
    path.write_text(path.read_text().replace("return cm\n", "return reqs[-1]\n"))
    assert cli.main(["patches", "--check", *args]) == patchgen.PatchDriftError.exit_code
    assert "--write" in capsys.readouterr().err


def test_missing_sdist_offline_is_a_typed_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MICS_REPRO_OFFLINE", "1")
    code = cli.main(["patches", "--check", "--wheelhouse", str(tmp_path), "--patch-dir", str(tmp_path)])
    assert code == patchgen.SdistMissingError.exit_code
    err = capsys.readouterr().err
    assert "deepspeed-0.13.1.tar.gz not found" in err and "pip download" in err


def _local_index(root: Path, version: str, *, bad_hash: bool = False) -> str:
    """A file:// simple index holding one deepspeed sdist that builds with no downloads (an in-tree
    PEP 517 backend), so pip's metadata step needs nothing from the network."""
    name = f"deepspeed-{version}"
    src = root / "src" / name
    (src / "deepspeed").mkdir(parents=True)
    (src / "deepspeed" / "__init__.py").write_text("")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "tinybackend"\nbackend-path = ["."]\n'
    )
    (src / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: deepspeed\nVersion: {version}\n")
    (src / "tinybackend.py").write_text(
        "import os\n"
        "def prepare_metadata_for_build_wheel(d, config_settings=None):\n"
        f"    info = os.path.join(d, 'deepspeed-{version}.dist-info')\n"
        "    os.makedirs(info)\n"
        "    with open(os.path.join(info, 'METADATA'), 'w') as f:\n"
        f"        f.write('Metadata-Version: 2.1\\nName: deepspeed\\nVersion: {version}\\n')\n"
        f"    return 'deepspeed-{version}.dist-info'\n"
        "def get_requires_for_build_wheel(config_settings=None):\n"
        "    return []\n"
        "def build_wheel(*a, **k):\n"
        "    raise NotImplementedError\n"
    )
    pkg = root / "simple" / "deepspeed"
    pkg.mkdir(parents=True)
    archive = pkg / f"{name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname=name)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if bad_hash:
        digest = "0" * 64
    (pkg / "index.html").write_text(f'<a href="{archive.name}#sha256={digest}">{archive.name}</a>\n')
    (root / "simple" / "index.html").write_text('<a href="deepspeed/">deepspeed</a>\n')
    return (root / "simple").as_uri()


def test_missing_sdist_is_fetched_from_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_subprocess: None
) -> None:
    # A machine whose wheelhouse never got the sdist (its venv was reused) fetches it itself.
    monkeypatch.delenv("MICS_REPRO_OFFLINE", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", _local_index(tmp_path / "index", "9.9.1"))
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    wheelhouse = tmp_path / "wheelhouse"
    path = patchgen.sdist_path("9.9.1", wheelhouse)
    assert path == wheelhouse / "deepspeed-9.9.1.tar.gz" and path.is_file()


def test_fetched_sdist_with_a_wrong_hash_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_subprocess: None
) -> None:
    monkeypatch.delenv("MICS_REPRO_OFFLINE", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", _local_index(tmp_path / "index", "9.9.2", bad_hash=True))
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    wheelhouse = tmp_path / "wheelhouse"
    with pytest.raises(patchgen.SdistMissingError, match="could not download"):
        patchgen.sdist_path("9.9.2", wheelhouse)
    assert not (wheelhouse / "deepspeed-9.9.2.tar.gz").exists()


def test_release_without_mics_has_no_patch(tmp_path: Path) -> None:
    (tmp_path / "deepspeed-9.9.9").mkdir()
    comm = tmp_path / "deepspeed-9.9.9" / "deepspeed" / "comm"
    comm.mkdir(parents=True)
    (comm / "torch.py").write_text("class TorchBackend:\n    pass\n")
    (tmp_path / "deepspeed-9.9.9" / "deepspeed" / "runtime" / "zero").mkdir(parents=True)
    (tmp_path / "deepspeed-9.9.9" / "deepspeed" / "runtime" / "zero" / "mics.py").write_text("x = 1\n")
    with tarfile.open(tmp_path / "deepspeed-9.9.9.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "deepspeed-9.9.9", arcname="deepspeed-9.9.9")
    with pytest.raises(patchgen.ReproError, match="cannot make a patch for DeepSpeed 9.9.9"):
        patchgen.generate("9.9.9", tmp_path)
