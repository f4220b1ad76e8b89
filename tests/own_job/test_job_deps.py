"""A custom job's own packages (REQUIREMENTS=/PACKAGES=): what is asked for (repro/engines/jobdeps.py),
the refusal of a requirement that would move an env's pin, and one real layer over a small venv
(repro/engines/venv/joblayer.py; a venv with pip and no torch stands in for the env's, a wheel built
here for the package the env lacks)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from repro.cli.main import main
from repro.core.errors import BuildError, UsageError
from repro.core.results import InvocationDir, invocation_meta
from repro.engines import jobdeps
from repro.engines.venv import joblayer
from repro.matrix.schema import load_matrix
from repro.run.job import JobRequest, execute_job
from tests.fixtures.stand_in_engine import RefusedEngine
from tests.fixtures.wheels import build_wheel

PINS = {"torch": "2.1.0", "deepspeed": "0.13.1", "numpy": "1.26.4", "hjson": "3.1.0"}


def test_requirements_file_and_packages_are_read_as_pip_would(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "wheels", "their_pkg", "0.3", "X = 1\n")
    req = tmp_path / "requirements.txt"
    req.write_text(
        "# the job's packages\ntransformers==4.36.2  # pinned\n\naccelerate>=0.25,<0.26\n"
        "wheels/their_pkg-0.3-py3-none-any.whl\n"
    )
    deps = jobdeps.parse(str(req), "sentencepiece einops==0.7.0", cwd=tmp_path)
    assert deps is not None
    assert deps.lines == (
        "transformers==4.36.2",
        "accelerate>=0.25,<0.26",
        str(wheel),
        "sentencepiece",
        "einops==0.7.0",
    )
    assert deps.wheels == (str(wheel),)
    assert deps.requirements_file == str(req.resolve()) and deps.packages == "sentencepiece einops==0.7.0"
    assert [r.name for r in deps.requested][2] == "their-pkg"
    # The layer's name follows the requirements and the wheel's bytes.
    first = deps.digest()
    build_wheel(tmp_path / "wheels", "their_pkg", "0.3", "X = 2\n")
    assert jobdeps.parse(str(req), "sentencepiece einops==0.7.0", cwd=tmp_path).digest() != first  # type: ignore[union-attr]
    assert jobdeps.parse(None, "  ") is None


def test_a_layer_is_named_by_the_wheels_bytes_not_its_folder(tmp_path: Path) -> None:
    # The same wheel built in two folders (a fresh temp dir each test run, another checkout):
    # byte-identical, and one layer name, so the layer or job image is reused, not rebuilt.
    digests, blobs = [], []
    for folder in ("one", "two"):
        wheel = build_wheel(tmp_path / folder, "their_pkg", "0.3", "X = 1\n")
        blobs.append(wheel.read_bytes())
        (tmp_path / folder / "requirements.txt").write_text(f"{wheel}\ntransformers==4.36.2\n")
        deps = jobdeps.parse(str(tmp_path / folder / "requirements.txt"), None, cwd=tmp_path)
        assert deps is not None
        digests.append(deps.digest())
    assert blobs[0] == blobs[1] and digests[0] == digests[1]
    other = build_wheel(tmp_path / "three", "their_pkg", "0.3", "X = 2\n")
    (tmp_path / "three" / "requirements.txt").write_text(f"{other}\ntransformers==4.36.2\n")
    changed = jobdeps.parse(str(tmp_path / "three" / "requirements.txt"), None, cwd=tmp_path)
    assert changed is not None and changed.digest() != digests[0]


@pytest.mark.parametrize(
    "text",
    ["--index-url https://example.org/simple", "-e .", "not a requirement!", "missing-0.1-py3-none-any.whl"],
)
def test_what_is_not_a_package_is_refused(tmp_path: Path, text: str) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text(text + "\n")
    with pytest.raises(UsageError) as err:
        jobdeps.parse(str(req), None)
    assert err.value.exit_code == 2
    with pytest.raises(UsageError):
        jobdeps.parse(str(tmp_path / "nope.txt"), None)


@pytest.mark.parametrize(
    ("packages", "moved"),
    [
        ("torch>=2.2", True),
        ("deepspeed==0.14.0", True),
        ("numpy<1.26", True),
        ("torch@https://x/t.whl", True),
        ("torch", False),
        ("torch==2.1.0", False),
        ("numpy>=1.20,<2", False),
        ("transformers==4.36.2", False),
    ],
)
def test_a_requirement_that_would_move_a_pin_is_refused(packages: str, moved: bool) -> None:
    deps = jobdeps.parse(None, packages)
    assert deps is not None
    if not moved:
        jobdeps.check_pins(deps, PINS, env_id="cpu")
        return
    with pytest.raises(UsageError) as err:
        jobdeps.check_pins(deps, PINS, env_id="cpu")
    name = deps.requested[0].name
    assert err.value.exit_code == 2
    assert f"{name}=={PINS[name]}" in err.value.what and packages in err.value.what


def test_make_run_refuses_a_requirement_moving_torch_before_anything_is_built(tmp_path: Path) -> None:
    env = load_matrix().get("cpu")
    request = JobRequest(
        env_id="cpu",
        command="python train.py",
        workdir=tmp_path,
        deps=jobdeps.parse(None, "transformers==4.36.2 torch==2.2.0"),
    )
    (tmp_path / "out").mkdir()
    engine = RefusedEngine()  # nothing may be built for a refused requirement
    with pytest.raises(UsageError) as err:
        execute_job(request, env, engine, InvocationDir(tmp_path / "out", invocation_meta([], "")), say=print)
    assert (
        err.value.exit_code == 2 and f"torch=={env.torch}" in err.value.what and "prepare" not in engine.calls
    )


# -- one real layer ------------------------------------------------------------------------------
def _freeze(python: Path) -> dict[str, str]:
    """What the interpreter's pip lists (a package installed from a file has no `==` in pip freeze)."""
    done = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(done.stdout)}


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stands in for an env's finished venv: a venv with pip (ensurepip, offline)."""
    root = tmp_path_factory.mktemp("venvs")
    venv = root / "cpu-0123456789ab"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    return venv


def _layer(base: Path, deps: jobdeps.JobDeps, wheelhouse: Path) -> joblayer.JobLayer:
    sources = ["--disable-pip-version-check", "--no-index", "--find-links", str(wheelhouse)]
    return joblayer.ensure_layer(
        base, deps, env_id="cpu", sources=sources, wheelhouse=wheelhouse, offline=True
    )


def test_a_layer_adds_the_jobs_package_and_keeps_every_pin(
    base_venv: Path, tmp_path: Path, real_subprocess: None
) -> None:
    before = _freeze(base_venv / "bin" / "python")
    wheel = build_wheel(tmp_path / "built", "mics_repro_testdep", "1.0", "VALUE = 42\n")
    req = tmp_path / "requirements.txt"
    req.write_text(f"{wheel}\n")
    deps = jobdeps.parse(str(req), None)
    assert deps is not None
    wheelhouse = tmp_path / "wheelhouse"
    layer = _layer(base_venv, deps, wheelhouse)
    assert not layer.reused and layer.packages == {"mics-repro-testdep": "1.0"}
    py = layer.path / "bin" / "python"
    done = subprocess.run(
        [str(py), "-c", "import mics_repro_testdep as m, pip; print(m.VALUE, pip.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    value, pip_file = done.stdout.split()
    assert value == "42" and pip_file.startswith(str(base_venv))  # the env's own pip, seen through the layer
    # Every package of the env at the same version in the layer; the env itself unchanged.
    after = _freeze(py)
    assert {k: after[k] for k in before} == before and set(after) - set(before) == {"mics-repro-testdep"}
    assert _freeze(base_venv / "bin" / "python") == before
    assert (wheelhouse / wheel.name).is_file()  # the job's wheel travels with the wheelhouse
    # The env's console scripts start the layer's interpreter (a launcher's ranks see the package).
    assert (layer.path / "bin" / "pip").read_text().splitlines()[0] == f"#!{py}"
    # The layer is never a base for a DeepSpeed probe layer; the next run reuses it.
    marker = json.loads((layer.path / "mics-repro-venv.json").read_text())
    assert marker["layered_on"]["venv"] == str(base_venv)
    again = _layer(base_venv, deps, wheelhouse)
    assert again.reused and again.path == layer.path and again.packages == layer.packages


def test_a_layer_refuses_a_pin_move_before_installing(
    base_venv: Path, tmp_path: Path, real_subprocess: None
) -> None:
    pip_version = _freeze(base_venv / "bin" / "python")["pip"]
    deps = jobdeps.parse(None, "pip==1.0")
    assert deps is not None
    with pytest.raises(UsageError) as err:
        _layer(base_venv, deps, tmp_path / "wheelhouse")
    assert f"pip=={pip_version}" in err.value.what
    assert not joblayer.layer_dir(base_venv, deps).exists()
    # An indirect requirement that needs another version of a pinned package: pip refuses it
    # while resolving (nothing installed, nothing kept).
    wheel = build_wheel(tmp_path / "built", "needs_new_pip", "1.0", "", requires=("pip>=999",))
    deps = jobdeps.parse(None, str(wheel))
    assert deps is not None
    with pytest.raises(BuildError):
        _layer(base_venv, deps, tmp_path / "wheelhouse")
    assert not joblayer.layer_dir(base_venv, deps).exists()
    assert not [p for p in base_venv.parent.iterdir() if p.name.startswith(".") and p.is_dir()]


def test_the_docker_layer_context(tmp_path: Path, real_subprocess: None) -> None:
    """ENGINE=docker: an image FROM the env's whose one RUN installs with the env's packages as
    constraints and fails if any of them moved (repro/engines/docker/joblayer.py)."""
    import io
    import tarfile

    from repro.engines.docker import joblayer as docker_layer

    wheel = build_wheel(tmp_path / "wheels", "their_pkg", "0.3", "X = 1\n")
    deps = jobdeps.parse(None, f"accelerate==0.30.1 {wheel}")
    assert deps is not None
    ctx = docker_layer.make_context("mics-repro:cpu-abc", "sha256:1", deps)
    with tarfile.open(fileobj=io.BytesIO(ctx.data)) as tar:
        files = {m.name: tar.extractfile(m).read().decode(errors="replace") for m in tar}  # type: ignore[union-attr]
    assert files[ctx.dockerfile].splitlines()[1] == "FROM mics-repro:cpu-abc"
    assert "-c /opt/mics-repro-job/constraints.txt" in files[ctx.dockerfile]
    assert (
        files["job/requirements.txt"]
        == "accelerate==0.30.1\n/opt/mics-repro-job/wheels/their_pkg-0.3-py3-none-any.whl\n"
    )
    assert f"job/wheels/{wheel.name}" in files
    assert docker_layer.make_context("mics-repro:cpu-abc", "sha256:2", deps).digest != ctx.digest
    # packages.py, run by a Python: lists what it imports; --compare fails on a moved package.
    script = tmp_path / "packages.py"
    script.write_text(files["job/packages.py"])
    listed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"^pytest==\S+$", listed, flags=re.M)
    before = tmp_path / "before.txt"
    before.write_text(listed.replace("pytest==", "pytest==0.0.") + "gone-pkg==1.0\n")
    moved = subprocess.run(
        [sys.executable, str(script), "--compare", str(before)], capture_output=True, text=True
    )
    assert moved.returncode == 1 and "pytest" in moved.stderr and "gone-pkg 1.0 -> None" in moved.stderr
    before.write_text("\n".join(line for line in listed.splitlines() if not line.startswith("pytest==")))
    added = subprocess.run(
        [sys.executable, str(script), "--compare", str(before)], capture_output=True, text=True
    )
    assert added.returncode == 0 and "pytest" in json.loads(added.stdout)


def test_the_jobs_packages_go_into_the_wheelhouse_for_the_envs_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from repro.core.cmd import CmdResult
    from repro.engines import wheelhouse as wh

    seen: list[list[str]] = []

    def fake_run(argv: Sequence[str], **kw: Any) -> CmdResult:
        seen.append(list(argv))
        return CmdResult(tuple(argv), 0)

    monkeypatch.setattr(wh.cmd, "run", fake_run)
    house = wh.Wheelhouse(tmp_path / "wheelhouse", offline=False)
    assert house.add(["transformers==4.40.2", "tokenizers==0.19.1"], "3.9")
    [argv] = seen
    assert argv[argv.index("-d") + 1] == str(tmp_path / "wheelhouse") and "--no-deps" in argv
    assert argv[argv.index("--python-version") + 1] == "3.9" and argv[-2:] == [
        "transformers==4.40.2",
        "tokenizers==0.19.1",
    ]


# -- issue #45 item 1: requirements files as pip reads them -------------------------------------
SIX_HASH = "sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254"
SIX_HASH_2 = "sha256:1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926"


def test_a_hashed_requirements_file_is_read_with_its_hashes(tmp_path: Path) -> None:
    # pip-compile --generate-hashes: each --hash on a line of its own, joined by backslashes.
    req = tmp_path / "requirements.txt"
    req.write_text(
        f"# generated\nsix==1.16.0 \\\n    --hash={SIX_HASH} \\\n    --hash {SIX_HASH_2}\n"
        "    # via -r requirements.in\n"
    )
    deps = jobdeps.parse(str(req), None)
    assert deps is not None
    assert [(r.name, r.specifier, r.hashes) for r in deps.requested] == [
        ("six", "==1.16.0", (SIX_HASH, SIX_HASH_2))
    ]
    # pip gets the hashes back, so it checks what it installs; the layer is named by them too
    assert deps.requirements_text() == f"six==1.16.0 --hash={SIX_HASH} --hash={SIX_HASH_2}\n"
    req.write_text(f"six==1.16.0 \\\n    --hash={SIX_HASH}\n")
    assert jobdeps.parse(str(req), None).digest() != deps.digest()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "packages", "said"),
    [
        # pip checks hashes for all requirements or none: say so before anything is built
        (f"six==1.16.0 --hash={SIX_HASH}\naccelerate==0.25.0\n", None, "but not accelerate"),
        (f"six==1.16.0 --hash={SIX_HASH}\n", "einops", "but not einops"),
        (f"six>=1.16 --hash={SIX_HASH}\n", None, "but not six"),
        # another per-requirement option is still not taken
        ("six==1.16.0 \\\n    --config-settings=x=y\n", None, "other than --hash"),
    ],
)
def test_a_hashed_file_pip_would_refuse_is_refused_here(
    tmp_path: Path, text: str, packages: str | None, said: str
) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text(text)
    with pytest.raises(UsageError, match=said) as err:
        jobdeps.parse(str(req), packages)
    assert err.value.exit_code == 2


def test_a_utf8_bom_at_the_start_of_the_file_is_not_part_of_the_first_line(tmp_path: Path) -> None:
    req = tmp_path / "requirements.txt"
    for first in ("six==1.16.0", "# written on Windows"):
        req.write_bytes(f"\ufeff{first}\r\neinops==0.7.0\r\n".encode())
        deps = jobdeps.parse(str(req), None)
        assert deps is not None
        assert deps.lines == (*(("six==1.16.0",) if first.startswith("six") else ()), "einops==0.7.0")


def test_a_requirement_its_marker_excludes_does_not_pin_anything(tmp_path: Path) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text('torch==2.3.0; python_version < "3.8"\ntransformers==4.36.2\n')
    deps = jobdeps.parse(str(req), None)
    assert deps is not None
    # pip skips the line on every Python the lab runs on: torch stays the env's 2.1.0
    jobdeps.check_pins(deps, PINS, env_id="cpu")
    jobdeps.check_pins(deps, PINS, env_id="cpu", python="3.10")
    # the marker is read for the env's Python, not this tool's
    req.write_text('torch==2.3.0; python_version >= "3.11"\n')
    newer = jobdeps.parse(str(req), None)
    assert newer is not None
    jobdeps.check_pins(newer, PINS, env_id="cpu", python="3.10")
    with pytest.raises(UsageError, match="would move cpu's pin torch==2.1.0"):
        jobdeps.check_pins(newer, PINS, env_id="cpu", python="3.11.9")


@pytest.mark.parametrize(
    "packages", ["--extra-index-url=https://example.org/simple", "-ihttps://example.org/simple"]
)
def test_a_pip_option_in_packages_is_refused_with_the_reason(
    tmp_path: Path, packages: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # make passes PACKAGES= as `--packages VALUE`; argparse took a VALUE starting with - for an option
    argv = [
        "run",
        "--results-root",
        str(tmp_path),
        "--engine",
        "venv",
        "--cmd",
        "true",
        "--packages",
        packages,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "pip options are not taken here" in err and "expected one argument" not in err
    assert not list(tmp_path.iterdir())  # refused before anything was made
