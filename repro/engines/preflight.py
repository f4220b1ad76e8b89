"""Checks that run before anything long starts, each failing with a typed, actionable error.

The host is reached through `HostProbe` so the default test tier can describe any machine
(ROCm node, CUDA node, laptop) without touching the real one.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from repro.core import cmd
from repro.core.errors import DeviceUnavailableError, DockerUnavailableError, PythonVersionError

if TYPE_CHECKING:
    from repro.matrix.model import Env

# CPython minor versions with Linux x86_64 torch wheels on PyPI, per torch minor release
# (from `pip index versions torch --python-version X` in 2026-11). Releases not listed are not
# checked: an unknown pairing is left to pip rather than refused.
TORCH_PYTHONS: Mapping[tuple[int, int], tuple[tuple[int, int], tuple[int, int]]] = {
    (1, 13): ((3, 7), (3, 11)),
    (2, 0): ((3, 8), (3, 11)),
    (2, 1): ((3, 8), (3, 11)),
    (2, 2): ((3, 8), (3, 12)),
    (2, 3): ((3, 8), (3, 12)),
    (2, 4): ((3, 8), (3, 12)),
    (2, 5): ((3, 9), (3, 13)),
    (2, 6): ((3, 9), (3, 13)),
    (2, 7): ((3, 9), (3, 13)),
    (2, 8): ((3, 9), (3, 13)),
    (2, 9): ((3, 10), (3, 14)),
    (2, 10): ((3, 10), (3, 14)),
    (2, 11): ((3, 10), (3, 14)),
    (2, 12): ((3, 10), (3, 14)),
    (2, 13): ((3, 10), (3, 14)),
    (2, 14): ((3, 10), (3, 14)),
    (2, 15): ((3, 11), (3, 14)),
}


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _fmt(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def python_range(torch_version: str) -> tuple[tuple[int, int], tuple[int, int]] | None:
    return TORCH_PYTHONS.get(_minor(torch_version))


def check_python(env: Env, python_version: str, python_path: str) -> None:
    """The venv interpreter must have torch wheels for `env.torch` (venv engine only)."""
    supported = python_range(env.torch)
    if supported is None:
        return
    have = _minor(python_version)
    low, high = supported
    if low <= have <= high:
        return
    direction = "too new" if have > high else "too old"
    raise PythonVersionError(
        f"Python {python_version} ({python_path}) is {direction} for torch {env.torch}",
        why=f"torch {env.torch} publishes wheels for CPython {_fmt(low)} to {_fmt(high)} only",
        fix=f"install Python {env.python} (e.g. `apt-get install python{env.python}` or `pyenv install "
        f"{env.python}`) and pass `--python /path/to/python{env.python}` or set MICS_REPRO_PYTHON; "
        "or use ENGINE=docker, whose image brings its own Python",
    )


class HostProbe(Protocol):
    def exists(self, path: str) -> bool: ...
    def glob(self, pattern: str) -> list[str]: ...
    def which(self, tool: str) -> str | None: ...
    def gpu_lines(self, tool: str, args: tuple[str, ...]) -> list[str] | None: ...


class RealHost:
    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def glob(self, pattern: str) -> list[str]:
        return sorted(glob.glob(pattern))

    def which(self, tool: str) -> str | None:
        import shutil

        return shutil.which(tool)

    def gpu_lines(self, tool: str, args: tuple[str, ...]) -> list[str] | None:
        """Output lines of a GPU listing tool, None when the tool is absent or fails."""
        if self.which(tool) is None:
            return None
        result = cmd.run([tool, *args], capture=True, timeout_s=60, echo=False)
        return result.stdout.splitlines() if result.ok else None


@dataclass(frozen=True)
class DockerFacts:
    """The parts of `docker info` the device checks need."""

    runtimes: tuple[str, ...]
    cdi_devices: tuple[str, ...] = ()

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> DockerFacts:
        cdi = info.get("DiscoveredDevices") or []
        return cls(
            tuple(sorted((info.get("Runtimes") or {}).keys())),
            tuple(str(d.get("ID", "")) for d in cdi if isinstance(d, dict)),
        )


def check_rocm(host: HostProbe) -> None:
    missing = [p for p in ("/dev/kfd", "/dev/dri") if not host.exists(p)]
    if missing:
        raise DeviceUnavailableError(
            f"this ROCm env needs {' and '.join(missing)}, which this host does not have",
            why="ROCm reaches AMD GPUs through the amdgpu kernel driver's /dev/kfd and /dev/dri nodes",
            fix="run on a host with an AMD GPU and the amdgpu driver loaded (`ls -l /dev/kfd /dev/dri`), "
            "or pick a CPU env (ENV=cpu) to see the bug with the gloo transport",
        )
    if not host.glob("/dev/dri/renderD*"):
        raise DeviceUnavailableError(
            "no GPU render node under /dev/dri",
            why="/dev/kfd exists but no /dev/dri/renderD* node does, so no GPU is usable",
            fix="check `rocm-smi`/`rocminfo` and that your user may open /dev/dri (groups video, render)",
        )


def check_cuda(host: HostProbe, docker: DockerFacts | None) -> None:
    lines = host.gpu_lines("nvidia-smi", ("-L",))
    if lines is None and not host.glob("/dev/nvidia[0-9]*"):
        raise DeviceUnavailableError(
            "this CUDA env needs an NVIDIA GPU, and none is visible",
            why="`nvidia-smi` is missing or failed and there is no /dev/nvidia<N> node",
            fix="install the NVIDIA driver (check with `nvidia-smi`) or pick a CPU env (ENV=cpu)",
        )
    if lines is not None and not any(line.startswith("GPU ") for line in lines):
        raise DeviceUnavailableError(
            "`nvidia-smi -L` lists no GPU",
            fix="check the driver with `nvidia-smi`; or pick a CPU env (ENV=cpu)",
        )
    if docker is None:
        return
    toolkit = host.which("nvidia-container-runtime-hook") or host.which("nvidia-ctk")
    if "nvidia" in docker.runtimes or toolkit or any("nvidia" in d for d in docker.cdi_devices):
        return
    raise DeviceUnavailableError(
        "Docker cannot give containers the GPU: no NVIDIA container runtime",
        why=f"`docker info` lists runtimes {', '.join(docker.runtimes) or 'none'} and the "
        "NVIDIA Container Toolkit is not installed",
        fix="install nvidia-container-toolkit, run `nvidia-ctk runtime configure --runtime=docker` and "
        "restart Docker; or use ENGINE=venv",
    )


def check_devices(env: Env, host: HostProbe | None = None, docker: DockerFacts | None = None) -> None:
    probe = host if host is not None else RealHost()
    platform = env.platform.value
    if platform == "rocm":
        check_rocm(probe)
    elif platform == "cuda":
        check_cuda(probe, docker)


def docker_unavailable(reason: str) -> DockerUnavailableError:
    return DockerUnavailableError(
        "ENGINE=docker, but no Docker daemon answers",
        why=reason,
        fix="start Docker (`sudo systemctl start docker`, or .ci/start-docker.sh on a Debian CI host), "
        "check DOCKER_HOST / your user's access to the socket; or use ENGINE=venv",
    )


def host_can_run(env: Env, host: HostProbe | None = None) -> tuple[bool, str]:
    """Whether this host has the devices `env` needs (for `list` / `matrix`), with the reason if not."""
    try:
        check_devices(env, host)
    except DeviceUnavailableError as exc:
        return False, exc.what
    return True, ""
