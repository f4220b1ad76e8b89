"""Renders the Dockerfile of an env: one generator for the committed docker/*.Dockerfile and for
derived envs (written under build/docker/ on demand).

    python -m repro dockerfiles --check  # exit 1 when a committed file differs from the matrix
    python -m repro dockerfiles --write  # regenerate docker/<id>.Dockerfile, every named env

Layer order (docker/README.md says why): base -> OS packages and CA certificates -> venv ->
pip/setuptools -> torch (+numpy) -> DeepSpeed's deps -> DeepSpeed -> verification -> workload.
Everything an env pins is written literally into its file; only what a builder may legitimately
vary (base image, wheel sources, CA certificates, strictness of the stack check) is a build ARG.
"""

from __future__ import annotations

import dataclasses
import enum
import shlex
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from repro.core import paths
from repro.matrix import compat
from repro.matrix.model import PYPI_INDEX, Env, InstallStep, Matrix, Platform
from repro.workload.record import PATCHES, SCENARIOS

REPO_ROOT = paths.REPO_ROOT
IMAGE_ROOT = "/opt/mics-repro"
VENV = "/opt/venv"
RESULTS = "/results"
SUITE_SCENARIOS = ",".join(SCENARIOS)
SUITE_PATCHES = ",".join(PATCHES)
LABEL_PREFIX = "mics-repro."
# The base image's vendor apt sources are parked by this script before `apt-get update` (GPU images).
VENDOR_APT_SCRIPT = "docker/disable-vendor-apt.sh"
# Installs pip from its wheel into a venv made --without-pip (Ubuntu 20.04 bases, see needs_pip_bootstrap).
PIP_BOOTSTRAP_SCRIPT = "docker/bootstrap_pip.py"
WIDTH = 100


def os_packages(env: Env) -> str:
    """Distro packages for the GPU bases (Ubuntu); the CPU bases already have Python and venv."""
    if env.platform is Platform.CPU:
        return ""
    py = f"python{env.python}"
    # g++ and the headers: DeepSpeed JIT-compiles its ops (FusedAdam...) on first use.
    packages = f"{py} {py}-venv {py}-dev g++"
    # bootstrap_pip.py fetches pip's wheel with Python's own TLS, which trusts the system store.
    return f"{packages} ca-certificates" if needs_pip_bootstrap(env) else packages


def needs_pip_bootstrap(env: Env) -> bool:
    """Ubuntu 20.04 bases (rocm56): `python3.9 -m venv` there bootstraps the distribution's pip
    20.0.2, built for Python 3.8, which needs a distutils Python 3.9 does not have there. Their
    venv is made --without-pip and pip installed from its own wheel (docker/bootstrap_pip.py)."""
    focal = "ubuntu-20.04" in env.base_image or "ubuntu:20.04" in env.base_image
    return env.platform is not Platform.CPU and focal


def python_command(env: Env) -> str:
    return "python3" if env.platform is Platform.CPU else f"python{env.python}"


def label_key(pin: str) -> str:
    return LABEL_PREFIX + pin.replace("_", "-")


def expected_labels(env: Env) -> dict[str, str]:
    """Our own labels: the env, its pins key and every pin (lint compares these to the matrix)."""
    labels = {label_key("env"): env.id, label_key("pins_key"): env.pins_key()}
    labels.update({label_key(k): v for k, v in env.pins().items()})
    return labels


def suite_command(env: Env) -> list[str]:
    """The image's default command: what `make repro` runs in it without overrides (the same
    flags as repro.run.orchestrate.suite_args). `--device` is the env's platform, so a GPU image
    never falls back to CPU; no `--dtype`, so the suite picks the precision the make path gets
    (fp16, the reporter's, on GPUs; fp32 on CPU)."""
    return [
        "python",
        "-m",
        "repro.workload.suite",
        "--env",
        env.id,
        "--out",
        RESULTS,
        "--scenarios",
        SUITE_SCENARIOS,
        "--patches",
        SUITE_PATCHES,
        "--transports",
        "async",
        "--device",
        env.platform.value,
    ]


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH - 2, initial_indent="# ", subsequent_indent="# ") or ["#"]


def _run(commands: Iterable[str]) -> list[str]:
    """A RUN whose shell lines are joined with continuations, each line indented by four."""
    lines = list(commands)
    out = [f"RUN {lines[0]}"]
    out += [f"    {line}" for line in lines[1:]]
    return [line + " \\" for line in out[:-1]] + [out[-1]]


def _wrapped_words(prefix: str, words: Iterable[str], suffix: str = "") -> list[str]:
    """`prefix w1 w2 ...` broken into continuation lines that stay under WIDTH."""
    lines, current = [], prefix
    for word in words:
        if len(current) + 1 + len(word) > WIDTH - 6:
            lines.append(current)
            current = "    " + word
        else:
            current += " " + word
    lines.append(current + suffix)
    return lines


def _pip(step: InstallStep) -> list[str]:
    head = "python -m pip install"
    if step.index_url is not None:
        head += ' --index-url "$TORCH_INDEX_URL" --extra-index-url "$PIP_INDEX_URL"'
    if step.no_deps:
        head += " --no-deps"
    if step.no_build_isolation:
        head += " --no-build-isolation"
    env_prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in step.environment)  # '' for hidden GPUs
    if env_prefix:
        head = f"{env_prefix} {head}"
    lines = _wrapped_words(head, step.specs)
    if step.check:
        lines[-1] += " &&"
        lines.append("python -m pip check")
    return lines


def _header(env: Env) -> list[str]:
    if env.is_derived:
        origin = [
            "# (a derived env: rendered on demand by repro.engines.docker.dockerfiles.materialize, "
            "never committed)."
        ]
    else:
        origin = ["# by `python -m repro dockerfiles --write`: edit the matrix, not this file."]
    return [
        f"# Env {env.id}: generated from env_matrix/envs.toml",
        *origin,
        "#",
        *_comment(env.notes),
        "#",
        "# Build from the repository root (plain `docker build`, no BuildKit needed):",
        f"#   docker build -f {env.dockerfile} -t {env.image_tag()} .",
        "# Build arguments, stand-in builds and how to run it (GPU devices): docker/README.md.",
        "",
    ]


def rocm_arch(env: Env) -> str:
    """PYTORCH_ROCM_ARCH of a ROCm image: what DeepSpeed's JIT-compiled ops are built for."""
    return ";".join(compat.rocm_jit_arches(env.rocm))


def _vendor_apt(env: Env) -> tuple[list[str], list[str]]:
    """(COPY lines, shell lines) that park the base's vendor apt sources; none on CPU bases."""
    if env.platform is Platform.CPU:
        return [], []
    script = f"{IMAGE_ROOT}/{Path(VENDOR_APT_SCRIPT).name}"
    copy = [
        "# GPU bases carry AMD's/NVIDIA's apt sources, whose signing keys expire and rotate: they are parked",
        "# before `apt-get update` (docker/README.md), as only the distribution's own packages are needed.",
        f"COPY {VENDOR_APT_SCRIPT} {script}",
    ]
    return copy, [f"sh {script};"]


def _base_and_os(env: Env) -> list[str]:
    vendor_copy, vendor_run = _vendor_apt(env)
    return [
        f"ARG BASE_IMAGE={env.base_image}",
        "FROM ${BASE_IMAGE}",
        "ARG BASE_IMAGE",
        "",
        *vendor_copy,
        "# Extra CA certificates for a TLS-intercepting proxy: any *.crt/*.pem in docker/certs/ are added",
        "# to a bundle that apt and pip then use. With none there, nothing changes.",
        f"COPY docker/certs/ {IMAGE_ROOT}/certs/",
        f'ARG OS_PACKAGES="{os_packages(env)}"',
        "ARG DEBIAN_FRONTEND=noninteractive",
        *_run(
            [
                f"set -eu; bundle={IMAGE_ROOT}/ca-bundle.pem;",
                f"for cert in {IMAGE_ROOT}/certs/*.crt {IMAGE_ROOT}/certs/*.pem; do",
                '    [ -f "$cert" ] || continue;',
                '    if [ ! -f "$bundle" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then',
                '        cp /etc/ssl/certs/ca-certificates.crt "$bundle"; fi;',
                '    cat "$cert" >> "$bundle";',
                "done;",
                'if [ -f "$bundle" ] && [ -d /etc/apt/apt.conf.d ]; then',
                '    echo "Acquire::https::CAInfo \\"$bundle\\";" > /etc/apt/apt.conf.d/99mics-repro-ca; fi;',
                *vendor_run,
                'if [ -n "$OS_PACKAGES" ]; then',
                "    apt-get update;",
                "    apt-get install -y --no-install-recommends $OS_PACKAGES;",
                "    rm -rf /var/lib/apt/lists/*; fi",
            ]
        ),
        "",
    ]


def _wheel_sources() -> list[str]:
    return [
        "# Wheel sources. PIP_FIND_LINKS: a local wheelhouse (URL or path) tried besides the indexes;",
        "# PIP_NO_INDEX=1 installs from it alone; PIP_TRUSTED_HOST lets pip use a plain-http wheelhouse.",
        "# pip reads all of these from the environment.",
        f"ARG PIP_INDEX_URL={PYPI_INDEX}",
        "ARG PIP_FIND_LINKS=",
        "ARG PIP_NO_INDEX=0",
        "ARG PIP_TRUSTED_HOST=",
    ]


def _venv(env: Env) -> list[str]:
    pip_conf = [
        f"if [ -f {IMAGE_ROOT}/ca-bundle.pem ]; then",
        f"    printf '[global]\\ncert = {IMAGE_ROOT}/ca-bundle.pem\\n' > {VENV}/pip.conf; fi",
    ]
    intro = ["# A venv at a fixed path: nothing depends on the distro's pip or site-packages."]
    commands = [f'set -eu; "$PYTHON" -m venv {VENV};', *pip_conf]
    if needs_pip_bootstrap(env):
        script = f"{IMAGE_ROOT}/{Path(PIP_BOOTSTRAP_SCRIPT).name}"
        intro = [
            "# A venv at a fixed path: nothing depends on the distro's pip or site-packages. Made without",
            "# pip: Ubuntu 20.04's bootstrap pip (20.0.2, built for Python 3.8) needs a distutils Python 3.9",
            "# lacks there; pip installs itself from its own wheel instead (docker/bootstrap_pip.py).",
            f"COPY {PIP_BOOTSTRAP_SCRIPT} {script}",
        ]
        pip_conf[-1] += ";"
        commands = [
            f'set -eu; "$PYTHON" -m venv --without-pip {VENV};',
            *pip_conf,
            f"{VENV}/bin/python {script} pip=={env.package_pins()['pip']}",
        ]
    return [
        *intro,
        *_wheel_sources(),
        f"ARG PYTHON={python_command(env)}",
        *_run(commands),
        f"ENV VIRTUAL_ENV={VENV} \\",
        f"    PATH={VENV}/bin:$PATH \\",
        "    PIP_DISABLE_PIP_VERSION_CHECK=1 \\",
        "    PIP_NO_CACHE_DIR=1 \\",
        "    PYTHONUNBUFFERED=1",
        "",
    ]


def _installs(env: Env) -> list[str]:
    steps = {step.name: step for step in env.install_steps()}
    rocm = (
        [
            "# The GPU architectures DeepSpeed's JIT-compiled ops (FusedAdam...) are built for: MI100, MI200",
            "# (and MI300 on ROCm 6+), so a user config with such an op runs on all of them.",
            f'ARG ROCM_ARCH="{rocm_arch(env)}"',
            "ENV PYTORCH_ROCM_ARCH=${ROCM_ARCH}",
            "",
        ]
        if env.rocm
        else []
    )
    index = [f"ARG TORCH_INDEX_URL={env.torch_index}"] if env.torch_index else []
    torch_step = steps["torch"]
    if env.torch_index:
        # The build's torch (with its local label, e.g. +rocm5.6) as an ARG, so a stand-in build on
        # another base (TORCH_INDEX_URL=PyPI, which has no labelled builds) can name PyPI's own.
        spec = env.torch_requirements()[0]
        # hadolint cannot see the pin through the ARG (our own lint expands it: MR rules).
        index += [f"ARG TORCH_SPEC={spec}", "# hadolint ignore=DL3013"]
        torch_step = dataclasses.replace(
            torch_step, specs=tuple('"$TORCH_SPEC"' if s == spec else s for s in torch_step.specs)
        )
    return [
        "# pip, setuptools, wheel: pinned.",
        *_run(_pip(steps["tooling"])),
        "",
        "# torch: the heaviest layer; it is reused as long as torch and numpy stay the same.",
        *index,
        *_run(_pip(torch_step)),
        "",
        "# DeepSpeed's runtime deps, all pinned, no resolver; `pip check` proves the set complete.",
        *_run(_pip(steps["deepspeed-deps"])),
        "",
        "# DeepSpeed's setup.py imports torch (no build isolation); its ops are JIT-compiled on use. GPUs",
        "# hidden: on a GPU it runs nvcc / reads ROCM_HOME (harmless here, where a build sees none).",
        *_run(_pip(steps["deepspeed"])),
        "",
        *rocm,
    ]


def _verify(env: Env) -> list[str]:
    stack = f"--python {env.python}"
    if env.rocm:
        stack += f" --rocm {env.rocm}"
    index = compat.index_for_url(env.platform, env.torch, env.torch_index) if env.torch_index else None
    built_for = index.platform_version if index else None
    if built_for and env.platform is Platform.ROCM:
        stack += f" --torch-hip {built_for}"
    elif built_for and env.platform is Platform.CUDA:
        stack += f" --torch-cuda {built_for}"
    pins = [f"{name}=={version}" for name, version in sorted(env.package_pins().items())]
    return [
        "# Fail the build unless every pin (and, with STRICT=1, the Python/ROCm/CUDA stack) is what the",
        "# matrix says. Stand-in builds on another base pass STRICT=0.",
        "ARG STRICT=1",
        f"COPY docker/verify_image.py {IMAGE_ROOT}/verify_image.py",
        *_run(
            [
                *_wrapped_words(
                    f'python {IMAGE_ROOT}/verify_image.py --strict "$STRICT" {stack}', pins, " &&"
                ),
                f"python -m pip freeze --all > {IMAGE_ROOT}/pip-freeze.txt &&",
                f"mkdir -p {RESULTS}",
            ]
        ),
        "",
    ]


def _workload_and_metadata(env: Env) -> list[str]:
    labels = {
        "org.opencontainers.image.title": f"mics-repro {env.id}",
        "org.opencontainers.image.description": (
            f"DeepSpeed MiCS + torch _IllegalWork reproduction: torch {env.torch}, DeepSpeed {env.deepspeed}"
        ),
        "org.opencontainers.image.version": f"{env.id}-{env.pins_key()}",
        "org.opencontainers.image.base.name": "${BASE_IMAGE}",
        **expected_labels(env),
    }
    label_lines = [f'{key}="{value}"' for key, value in labels.items()]
    cmd = ", ".join(f'"{word}"' for word in suite_command(env))
    return [
        "# The workload last: editing it rebuilds only these layers.",
        f"COPY repro/__init__.py {IMAGE_ROOT}/src/repro/__init__.py",
        f"COPY repro/workload/ {IMAGE_ROOT}/src/repro/workload/",
        f"ENV PYTHONPATH={IMAGE_ROOT}/src",
        f"WORKDIR {RESULTS}",
        "",
        "LABEL " + " \\\n      ".join(label_lines),
        "",
        "# The reproduction suite; results (suite.json, logs, ds_report) land in /results.",
        f"CMD [{cmd}]",
    ]


def render(env: Env) -> str:
    parts = (
        _header(env)
        + _base_and_os(env)
        + _venv(env)
        + _installs(env)
        + _verify(env)
        + _workload_and_metadata(env)
    )
    return "\n".join(parts) + "\n"


def materialize(env: Env, root: Path = REPO_ROOT) -> Path:
    """The env's Dockerfile on disk: the committed one, or a derived env's freshly written one."""
    path = root / env.dockerfile
    if env.is_derived:
        _write_if_changed(path, render(env))
    return path


def _write_if_changed(path: Path, text: str) -> bool:
    if path.is_file() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


class Drift(enum.Enum):
    MISSING = "missing: run `python -m repro dockerfiles --write`"
    DIFFERS = "differs from the matrix: run `python -m repro dockerfiles --write`"
    STALE = "names no env in the matrix: remove it (or add the env)"


@dataclass(frozen=True)
class SyncProblem:
    path: str  # repo-relative
    drift: Drift

    def render(self) -> str:
        return f"{self.path}: {self.drift.value}"


def out_of_sync(matrix: Matrix, root: Path = REPO_ROOT) -> list[SyncProblem]:
    """Committed Dockerfiles that differ from the generator's output, are missing, or are stale."""
    problems = []
    expected = {env.dockerfile: render(env) for env in map(matrix.get, matrix.ids())}
    for rel, text in expected.items():
        path = root / rel
        if not path.is_file():
            problems.append(SyncProblem(rel, Drift.MISSING))
        elif path.read_text() != text:
            problems.append(SyncProblem(rel, Drift.DIFFERS))
    for path in sorted((root / "docker").glob("*.Dockerfile")):
        rel = path.relative_to(root).as_posix()
        if rel not in expected:
            problems.append(SyncProblem(rel, Drift.STALE))
    return problems


def write_all(matrix: Matrix, root: Path = REPO_ROOT) -> list[Path]:
    envs = map(matrix.get, matrix.ids())
    return [root / env.dockerfile for env in envs if _write_if_changed(root / env.dockerfile, render(env))]
