"""Issue 33 item 3: one wheelhouse, several torch builds. With `torch==2.1.0` and the shared
wheelhouse on --find-links, pip took the highest local label (+rocm5.6 over +cu121 over none), so a
CPU or CUDA env could get the ROCm torch. Each env now pins its build, and the venv check reads the
installed torch's own build (torch.version.hip / .cuda).

Tiny stand-in wheels named `torch` (2.1.0 plain, +cu121, +rocm5.6, each with the torch.version an
install of that build has) are made in the test; the real pip of this interpreter picks from them."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from repro.engines.torch_check import PROBE, build_problem
from repro.engines.wheelhouse import DownloadPlan, Wheelhouse
from repro.matrix.model import Env
from repro.matrix.schema import load_matrix

# local label -> (torch.version.hip, torch.version.cuda) of that build
BUILDS = {"": (None, "12.1"), "cu121": (None, "12.1"), "rocm5.6": ("5.6.31061", None)}


def _wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A minimal valid wheel (PEP 427): the files, METADATA, WHEEL and a RECORD with hashes."""
    dist = f"{name}-{version}.dist-info"
    files = {
        **files,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return wheel


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheelhouse")
    for label, (hip, cuda) in BUILDS.items():
        version = f"2.1.0+{label}" if label else "2.1.0"
        _wheel(
            folder,
            "torch",
            version,
            {
                "torch/__init__.py": f"__version__ = {version!r}\nfrom torch import version\n",
                "torch/version.py": f"hip = {hip!r}\ncuda = {cuda!r}\n",
            },
        )
    _wheel(folder, "deepspeed", "0.13.1", {"deepspeed/__init__.py": ""})
    return folder


def _install(wheelhouse: Path, target: Path, spec: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-index"]
    argv += ["--find-links", str(wheelhouse), "--target", str(target), "--no-deps", spec, "deepspeed==0.13.1"]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _probe(target: Path) -> list[str]:
    """What the venv check (repro.engines.torch_check.PROBE) reads from the installed stand-in."""
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True, cwd=target
    )
    return done.stdout.splitlines()


@pytest.mark.parametrize(
    ("env_id", "want"), [("cpu", "2.1.0"), ("cuda", "2.1.0+cu121"), ("rocm56", "2.1.0+rocm5.6")]
)
def test_pip_takes_the_envs_own_build_from_a_shared_wheelhouse(
    real_subprocess: None, wheelhouse: Path, tmp_path: Path, env_id: str, want: str
) -> None:
    env = load_matrix().get(env_id)
    spec = env.torch_requirements()[0]
    done = _install(wheelhouse, tmp_path / "site", spec)
    assert done.returncode == 0, done.stderr
    lines = _probe(tmp_path / "site")
    assert lines[0].split() == ["2.1.0", "0.13.1"]
    assert lines[1].split()[0] == want == env.torch_version()
    assert build_problem(env, lines[1]) is None
    # The wheelhouse counts only the env's own build as present.
    plan = DownloadPlan.for_env(env, "3.11")
    assert spec in plan.requirements
    assert [p.name for p in Wheelhouse(wheelhouse, offline=True).files_for(spec)] == [
        f"torch-{want}-py3-none-any.whl"
    ]


def test_the_plain_pin_is_what_picked_the_rocm_build(
    real_subprocess: None, wheelhouse: Path, tmp_path: Path
) -> None:
    """The old pin, for the record: pip takes the highest label, which the check now refuses."""
    done = _install(wheelhouse, tmp_path / "site", "torch==2.1.0")
    assert done.returncode == 0, done.stderr
    build_line = _probe(tmp_path / "site")[1]
    assert build_line.split()[0] == "2.1.0+rocm5.6"
    cuda: Env = load_matrix().get("cuda")
    cpu: Env = load_matrix().get("cpu")
    problem = build_problem(cuda, build_line)
    assert problem is not None and "ROCm" in problem and "CUDA" in problem
    assert build_problem(cpu, build_line) is not None
    assert build_problem(load_matrix().get("rocm56"), build_line) is None


def test_a_build_line_torch_did_not_write_is_a_problem() -> None:
    env = load_matrix().get("cuda")
    assert build_problem(env, "") is not None
    assert build_problem(env, "2.1.0+cu121 - 12.1") is None
    assert build_problem(env, "2.1.0 - 12.1") is not None  # PyPI's build, not the cu121 index's


def test_pypis_own_torch_may_report_a_label_its_file_name_lacks() -> None:
    # PyPI's torch-2.1.0-cp311-...-manylinux1_x86_64.whl (what `torch===2.1.0` installs for the cpu
    # env) says torch.__version__ == "2.1.0+cu121": a CUDA build, the right one for that pin.
    cpu = load_matrix().get("cpu")
    assert build_problem(cpu, "2.1.0+cu121 - 12.1") is None
    assert build_problem(cpu, "2.2.0+cu121 - 12.1") is not None  # another release all the same
    assert build_problem(cpu, "2.1.0+rocm5.6 5.6.31061 -") is not None  # a ROCm build is not it
