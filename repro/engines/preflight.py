"""Checks that run before anything long starts, each failing with a typed, actionable error.

The host is read through `repro.engines.gpu_host.GpuHost`, whose roots (/dev, /sys) and user are
fields, so the default test tier describes any machine (ROCm node, CUDA node, laptop) with a fake
tree. Exit codes: 11 no GPU at all, 41 devices not openable, 42 GPU arch not in the torch wheel,
43 NVIDIA driver missing/too old, 44 Docker cannot pass GPUs, 45 WORLD_SIZE above the GPU count.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.core.errors import (
    ContainerGpuError,
    DevicePermissionError,
    DeviceUnavailableError,
    DockerUnavailableError,
    GpuArchError,
    GpuCountError,
    GpuDriverError,
    PythonVersionError,
    UsageError,
)
from repro.engines.gpu_host import CUDA_VISIBILITY, ROCM_VISIBILITY, GpuHost, visible_count, visible_limit
from repro.matrix import compat

if TYPE_CHECKING:
    from repro.matrix.model import Env


def minor_of(version: str) -> tuple[int, int]:
    """(3, 10) of "3.10", "3.10.12" or "2.1.0+cpu"."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check_python(env: Env, python_version: str, python_path: str) -> None:
    """The venv interpreter must have torch wheels for `env.torch` (venv engine only). The range is
    compat.TORCH_PYTHONS, the one table of it; a release it does not list is left to pip."""
    supported = compat.torch_pythons(env.torch)
    if supported is None:
        return
    have = minor_of(python_version)
    low, high = supported
    if minor_of(low) <= have <= minor_of(high):
        return
    direction = "too new" if have > minor_of(high) else "too old"
    want = env.python_to_install()
    raise PythonVersionError(
        f"Python {python_version} ({python_path}) is {direction} for torch {env.torch}",
        why=f"torch {env.torch} publishes wheels for CPython {low} to {high} only",
        fix=f"install Python {want} (`uv python install {want}`, or your distribution's python{want}) and "
        f"rerun with MICS_REPRO_PYTHON=$(uv python find {want}) (or --python /path/to/python{want}); "
        "or use ENGINE=docker, whose image brings its own Python",
    )


@dataclass(frozen=True)
class DockerFacts:
    """The parts of `docker info` the device checks need."""

    runtimes: tuple[str, ...]
    cdi_devices: tuple[str, ...] = ()  # DiscoveredDevices (Docker 28.2+), e.g. "nvidia.com/gpu=all"
    cdi_spec_dirs: tuple[str, ...] = ()  # CDISpecDirs (Docker 25+): where the daemon reads CDI specs

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> DockerFacts:
        cdi = info.get("DiscoveredDevices") or []
        return cls(
            tuple(sorted((info.get("Runtimes") or {}).keys())),
            tuple(str(d.get("ID", "")) for d in cdi if isinstance(d, dict)),
            tuple(str(d) for d in info.get("CDISpecDirs") or ()),
        )


# -- ROCm ------------------------------------------------------------------------------------------
def check_rocm(host: GpuHost, env: Env | None = None, *, user_opens_devices: bool = False) -> None:
    """/dev/kfd and a render node; with `user_opens_devices` (venv engine) that this user may open
    them; with `env`, that the GPUs' gfx arch is one the env's torch wheel was built for."""
    missing = [p for p in (host.kfd, host.dev / "dri") if not p.exists()]
    if missing:
        raise DeviceUnavailableError(
            f"this ROCm env needs {' and '.join(map(str, missing))}, which this host does not have",
            why="ROCm reaches AMD GPUs through the amdgpu kernel driver's /dev/kfd and /dev/dri nodes",
            fix="run on a host with an AMD GPU and the amdgpu driver loaded (`ls -l /dev/kfd /dev/dri`), "
            "or pick a CPU env (ENV=cpu) to see the bug with the gloo transport",
        )
    renders = host.render_nodes()
    if not renders:
        raise DeviceUnavailableError(
            f"no GPU render node under {host.dev / 'dri'}",
            why="/dev/kfd exists but no /dev/dri/renderD* node does, so no GPU is usable",
            fix="check `rocm-smi`/`rocminfo` and `dmesg | grep amdgpu`; or pick a CPU env (ENV=cpu)",
        )
    if user_opens_devices:
        _check_rocm_access(host, [host.kfd, *renders])
    if env is not None:
        _check_rocm_arch(host, env)


def _check_rocm_access(host: GpuHost, nodes: list[Path]) -> None:
    refused = host.unopenable(nodes)
    if not refused:
        return
    groups = sorted({host.group_name(gid) for _, gid in refused})
    names = ", ".join(str(node) for node, _ in refused)
    raise DevicePermissionError(
        f"this user may not open {names}",
        why=f"ROCm opens /dev/kfd and the render nodes; they belong to group {' and '.join(groups)}, "
        "which this user is not in (torch would then see no GPU, and the runs would fall back to nothing)",
        fix=f"`sudo usermod -aG {','.join(groups)} $USER`, then log out and in again (or `newgrp "
        f"{groups[0]}`); or use ENGINE=docker, which adds those groups to the container itself",
    )


def _check_rocm_arch(host: GpuHost, env: Env) -> None:
    wheel = compat.rocm_wheel_arches(env.torch, env.torch_index)
    arches = host.gfx_arches()
    if wheel is None or not arches:
        return  # unknown wheel or unreadable topology: leave it to the run, which records the arch
    unsupported = sorted({a for a in arches if a not in wheel})
    narrowed = visible_limit(host.env(), ROCM_VISIBILITY) is not None
    if not unsupported or (narrowed and len(unsupported) < len(set(arches))):
        return  # a mixed host where the user already chose GPUs: their choice
    override = host.env().get("HSA_OVERRIDE_GFX_VERSION")
    raise GpuArchError(
        f"this host's GPU ({', '.join(unsupported)}) is not an architecture torch {env.torch} of env "
        f"{env.id} was built for",
        why=f"the ROCm wheel ({env.torch_index}) carries GPU kernels for {', '.join(wheel)} only "
        "(MI100 = gfx908, MI200 = gfx90a, MI300 = gfx942); torch would find no kernel for this GPU"
        + (f" (HSA_OVERRIDE_GFX_VERSION={override} is set)" if override else ""),
        fix="pick an env whose torch supports it (MI300/gfx942 needs a ROCm 6 env: rocm61, rocm62, rocm64)"
        + (
            "; on a host with several GPU kinds, set HIP_VISIBLE_DEVICES to supported ones"
            if len(unsupported) < len(set(arches))
            else ""
        ),
    )


# -- CUDA ------------------------------------------------------------------------------------------
def check_cuda(host: GpuHost, docker: DockerFacts | None, env: Env | None = None) -> None:
    """A GPU and a driver `nvidia-smi` can talk to; with `env`, a driver new enough for its CUDA;
    with `docker` (docker engine), a daemon that can hand GPUs to containers."""
    smi = host.nvidia_smi()
    if not smi.installed:
        if not host.nvidia_device_nodes():
            raise DeviceUnavailableError(
                "this CUDA env needs an NVIDIA GPU, and none is visible",
                why=f"`nvidia-smi` is not installed and there is no {host.dev}/nvidia<N> node",
                fix="install the NVIDIA driver (check with `nvidia-smi`) or pick a CPU env (ENV=cpu)",
            )
    elif not smi.ok:
        raise GpuDriverError(
            "`nvidia-smi` cannot talk to the NVIDIA driver",
            why=f"it says: {smi.message}",
            fix="load/reinstall the driver (`nvidia-smi` must list the GPUs; after a driver update, reboot); "
            "or pick a CPU env (ENV=cpu)",
        )
    elif not smi.gpus:
        raise DeviceUnavailableError(
            "`nvidia-smi` lists no GPU", fix="check the driver with `nvidia-smi`; or pick a CPU env (ENV=cpu)"
        )
    else:
        _check_driver(smi.gpus[0].driver, env)
    if docker is not None:
        _check_container_gpus(host, docker)


def _check_driver(driver: str, env: Env | None) -> None:
    cuda = env.cuda if env is not None else None
    floor = compat.cuda_driver_floor(cuda) if cuda else None
    if floor is None or compat.driver_tuple(driver) >= compat.driver_tuple(floor):
        return
    shipped = compat.CUDA_TOOLKIT_DRIVER.get(cuda or "")
    raise GpuDriverError(
        f"NVIDIA driver {driver} is too old for CUDA {cuda} (env {env.id if env else '?'})",
        why=f"torch's CUDA {cuda} runtime needs a driver >= {floor} (CUDA minor version compatibility)"
        + (f"; {shipped} shipped with CUDA {cuda}" if shipped else ""),
        fix=f"update the NVIDIA driver to {shipped or floor} or newer; or pick a CPU env (ENV=cpu)",
    )


def cuda_via_cdi(docker: DockerFacts, host: GpuHost | None = None) -> bool:
    """Whether the daemon serves NVIDIA GPUs only through CDI (no "nvidia" runtime): the Docker
    engine then requests them as nvidia.com/gpu=all rather than with --gpus."""
    if "nvidia" in docker.runtimes:
        return False
    return any(d.startswith("nvidia.com/gpu") for d in docker.cdi_devices) or (
        host or GpuHost()
    ).cdi_specs_name_nvidia(docker.cdi_spec_dirs)


def _check_container_gpus(host: GpuHost, docker: DockerFacts) -> None:
    # `--gpus` works when the daemon registered NVIDIA's device driver: it does so when it finds
    # nvidia-container-runtime-hook (installed with the runtime `docker info` lists as "nvidia");
    # with NVIDIA CDI specs only, the engine asks for nvidia.com/gpu=all instead. A binary on the
    # client's PATH proves nothing about the daemon, so only the daemon's own answers count here.
    if "nvidia" in docker.runtimes or cuda_via_cdi(docker, host):
        return
    raise ContainerGpuError(
        "Docker cannot give containers the GPU: the daemon has no NVIDIA runtime and no NVIDIA CDI spec",
        why=f"`docker info` lists runtimes {', '.join(docker.runtimes) or 'none'} and no nvidia.com/gpu "
        "device; `docker run --gpus` would fail only after the long image build",
        fix="install nvidia-container-toolkit, run `sudo nvidia-ctk runtime configure --runtime=docker` and "
        "restart Docker (check: `docker info | grep -i nvidia`); or use ENGINE=venv",
    )


# -- all platforms -----------------------------------------------------------------------------------
def check_devices(env: Env, host: GpuHost | None = None, docker: DockerFacts | None = None) -> None:
    """The env's devices on this host. `docker` given: the docker engine (the daemon passes the
    devices and adds their groups); absent: the venv engine (this user opens them)."""
    probe = host if host is not None else GpuHost()
    platform = env.platform.value
    if platform == "rocm":
        check_rocm(probe, env, user_opens_devices=docker is None)
    elif platform == "cuda":
        check_cuda(probe, docker, env)


def gpu_count(env: Env, host: GpuHost | None = None) -> int | None:
    """GPUs a run of `env` would see here (after *_VISIBLE_DEVICES); None for CPU envs or unknown."""
    probe = host if host is not None else GpuHost()
    if env.platform.value == "rocm":
        found = len(probe.gfx_arches()) or len(probe.render_nodes())
        return visible_count(found, probe.env(), ROCM_VISIBILITY) if found else None
    if env.platform.value == "cuda":
        smi = probe.nvidia_smi()
        found = len(smi.gpus) if smi.ok else len(probe.nvidia_device_nodes())
        return visible_count(found, probe.env(), CUDA_VISIBILITY) if found else None
    return None


RANK_MEMORY = 512 << 20  # a CPU twin rank: torch + DeepSpeed imported, the model and its shards
RANKS_PER_CORE = 8


def cpu_rank_limit() -> int:
    """The most ranks of a CPU run this host can hold: by cores and by memory, at least 2."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        memory = 0
    by_memory = memory // RANK_MEMORY if memory > 0 else 1 << 20
    return max(2, min((os.cpu_count() or 1) * RANKS_PER_CORE, by_memory) // 2 * 2)


def check_world_size(env: Env, world_size: int | None, host: GpuHost | None = None) -> None:
    """WORLD_SIZE= asks for one rank per GPU: more ranks than GPUs is refused before any build."""
    if world_size is None:
        return
    if env.platform is compat.Platform.CPU:
        if world_size < 2:
            # Measured: torch 2.1 + DeepSpeed 0.13.1 on CPU crash in ZeRO-3's single-rank wait
            # (the CPU accelerator's current_stream() is None), so the control itself cannot run.
            raise UsageError(
                f"WORLD_SIZE={world_size} cannot run on the CPU env {env.id}",
                why="DeepSpeed's CPU accelerator has no stream for ZeRO-3's single-rank path: the control "
                "crashes, so nothing could be compared",
                fix="use an even WORLD_SIZE >= 2 on CPU (the default is 4); WORLD_SIZE=1 is for a 1-GPU host",
            )
        limit = cpu_rank_limit()
        if world_size > limit:
            raise UsageError(
                f"WORLD_SIZE={world_size} is more ranks than this host can run on CPU (at most {limit})",
                why=f"each CPU rank is a process holding torch and DeepSpeed (about "
                f"{RANK_MEMORY >> 20} MiB) and its own threads: at most {RANKS_PER_CORE} per core "
                f"({os.cpu_count() or 1} cores) and one per {RANK_MEMORY >> 20} MiB of memory",
                fix=f"use an even WORLD_SIZE from 2 to {limit} (the default is 4)",
            )
        return
    count = gpu_count(env, host)
    if count is None or world_size <= count:
        return
    raise GpuCountError(
        f"WORLD_SIZE={world_size} asks for {world_size} ranks, and env {env.id} sees {count} GPU(s) here",
        why="each rank of a GPU run needs its own GPU (NCCL/RCCL refuse two ranks on one device)",
        fix=f"use WORLD_SIZE={count} or less (or leave it unset: the layout is then planned from the "
        "GPUs found); check *_VISIBLE_DEVICES if GPUs are missing",
    )


def docker_unavailable(reason: str) -> DockerUnavailableError:
    return DockerUnavailableError(
        "ENGINE=docker, but no Docker daemon answers",
        why=reason,
        fix="start Docker (`sudo systemctl start docker`, or .ci/start-docker.sh on a Debian CI host), "
        "check DOCKER_HOST / your user's access to the socket; or use ENGINE=venv",
    )


def host_can_run(env: Env, host: GpuHost | None = None) -> tuple[bool, str]:
    """Whether this host has the devices `env` needs (for `list` / `matrix`), with the reason if not."""
    try:
        check_devices(env, host)
    except DeviceUnavailableError as exc:
        return False, exc.what
    return True, ""
