"""What is known about torch and DeepSpeed releases, as data: wheel indexes, Python support, deps.

Sources (see docs/background.md and env_matrix/README.md): the torch -> ROCm index table is
docs/background.md section 6; the torch -> Python table was read off PyPI's file listing of torch
(linux x86_64 wheels, every release 2.0 to 2.15); DeepSpeed's requirements were read from the
release sdists named below. Entries marked `certain=False` are believed, not checked here: derived
envs that use them say so in their notes.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

PYTORCH_WHEEL_ROOT = "https://download.pytorch.org/whl"


class Platform(enum.Enum):
    ROCM = "rocm"
    CUDA = "cuda"
    CPU = "cpu"

    @property
    def label(self) -> str:
        return {"rocm": "ROCm", "cuda": "CUDA", "cpu": "CPU"}[self.value]


@dataclass(frozen=True)
class WheelIndex:
    """One of PyTorch's wheel indexes, e.g. tag "rocm5.6" -> .../whl/rocm5.6."""

    tag: str
    certain: bool = True

    @property
    def url(self) -> str:
        return f"{PYTORCH_WHEEL_ROOT}/{self.tag}"

    @property
    def platform_version(self) -> str | None:
        """ "5.6" for rocm5.6, "12.1" for cu121, None for cpu."""
        if self.tag.startswith("rocm"):
            return self.tag[len("rocm") :]
        if self.tag.startswith("cu"):
            digits = self.tag[len("cu") :]
            return f"{digits[:-1]}.{digits[-1]}"
        return None


def _indexes(*tags: str, certain: bool = True) -> tuple[WheelIndex, ...]:
    return tuple(WheelIndex(tag, certain) for tag in tags)


# torch release range -> the indexes that carry its wheels (docs/background.md section 6; "likely"
# ones uncertain).
ROCM_INDEXES: tuple[tuple[str, tuple[WheelIndex, ...]], ...] = (
    (">=2.0,<2.1", _indexes("rocm5.4.2")),
    (">=2.1,<2.2", _indexes("rocm5.6")),
    ("==2.2.0", _indexes("rocm5.6")),
    (">=2.2.1,<2.3", _indexes("rocm5.7")),
    (">=2.3,<2.4", _indexes("rocm6.0")),
    (">=2.4,<2.5", _indexes("rocm6.1")),
    (">=2.5,<2.6", _indexes("rocm6.1", "rocm6.2")),
    (">=2.6,<2.7", _indexes("rocm6.2.4")),
    (">=2.7,<2.8", _indexes("rocm6.3", certain=False)),
    (">=2.8,<2.9", _indexes("rocm6.3", "rocm6.4", certain=False)),
    (">=2.9,<2.10", _indexes("rocm6.4")),
)

# Checked for torch 2.1 only (cu118/cu121); the rest follows PyTorch's release notes from memory.
CUDA_INDEXES: tuple[tuple[str, tuple[WheelIndex, ...]], ...] = (
    (">=2.0,<2.1", _indexes("cu117", "cu118", certain=False)),
    (">=2.1,<2.2", _indexes("cu118", "cu121")),
    (">=2.2,<2.4", _indexes("cu118", "cu121", certain=False)),
    (">=2.4,<2.6", _indexes("cu118", "cu121", "cu124", certain=False)),
    (">=2.6,<2.7", _indexes("cu118", "cu124", "cu126", certain=False)),
    (">=2.7,<2.8", _indexes("cu118", "cu126", "cu128", certain=False)),
    (">=2.8,<2.9", _indexes("cu126", "cu128", "cu129", certain=False)),
    (">=2.9,<2.10", _indexes("cu126", "cu128", "cu130", certain=False)),
    (">=2.10,<2.12", _indexes("cu126", "cu128", "cu130", certain=False)),
)

CPU_INDEX = WheelIndex("cpu")

# torch minor -> (oldest, newest) CPython with manylinux x86_64 wheels on PyPI (from `pip index
# versions torch --python-version X`, 2026-11). The one table: the venv engine's interpreter check
# (engines/preflight.py) and the matrix's Python pins both read it.
TORCH_PYTHONS: dict[str, tuple[str, str]] = {
    "1.13": ("3.7", "3.11"),
    "2.0": ("3.8", "3.11"),
    "2.1": ("3.8", "3.11"),
    "2.2": ("3.8", "3.12"),
    "2.3": ("3.8", "3.12"),
    "2.4": ("3.8", "3.12"),
    "2.5": ("3.9", "3.13"),
    "2.6": ("3.9", "3.13"),
    "2.7": ("3.9", "3.13"),
    "2.8": ("3.9", "3.13"),
    "2.9": ("3.10", "3.14"),
    "2.10": ("3.10", "3.14"),
    "2.11": ("3.10", "3.14"),
    "2.12": ("3.10", "3.14"),
    "2.13": ("3.10", "3.14"),
    "2.14": ("3.10", "3.14"),
    "2.15": ("3.11", "3.15"),
}


# PyTorch's own indexes name the build in the last URL segment and in the wheels' local version
# label (".../whl/rocm5.6" -> "2.1.0+rocm5.6"); PyPI's torch of the same version is another build.
_TORCH_BUILD = re.compile(r"^(cpu|cu\d+|rocm\d+(\.\d+)*)$")


def torch_build(index_url: str | None) -> str | None:
    """The local version label of the torch wheels on `index_url` ("rocm5.6"), or None (PyPI, or
    an index whose URL does not name a build)."""
    if not index_url:
        return None
    last = index_url.rstrip("/").rsplit("/", 1)[-1]
    return last if _TORCH_BUILD.match(last) else None


def torch_spec(torch: str, index_url: str | None) -> str:
    """The pip requirement that takes exactly the env's torch build.

    `torch==2.1.0` matches every local label (PEP 440), and pip prefers the highest: with the
    shared wheelhouse on --find-links, a host that fetched the ROCm build once would give it to
    every later env of that version (+rocm5.6 sorts over +cu121 over none). A PyTorch index's
    build is pinned with its label; PyPI's (no label at all) with `===`, which compares the whole
    version string, so no labelled build passes. Another index keeps the plain pin."""
    public = Version(torch).public
    build = torch_build(index_url)
    if build is not None:
        return f"torch=={public}+{build}"
    if not index_url:
        return f"torch==={public}"
    return f"torch=={public}"


def split_pin(spec: str) -> tuple[str, str]:
    """("torch", "2.1.0") for "torch==2.1.0", "torch==2.1.0+rocm5.6" and "torch===2.1.0": the
    name and the public version a pin installs."""
    name, sep, version = spec.partition("==")
    if not sep:
        return spec, ""
    version = version.removeprefix("=")
    return name, Version(version).public if version[:1].isdigit() else version


def minor(version: str) -> str:
    """ "2.1" for "2.1.0+rocm5.6"."""
    release = Version(version).release
    return f"{release[0]}.{release[1] if len(release) > 1 else 0}"


def py_tuple(python: str) -> tuple[int, ...]:
    return tuple(int(part) for part in python.split("."))


def torch_pythons(torch: str) -> tuple[str, str] | None:
    """The Python range torch's wheels cover, None when this release is not in the table."""
    return TORCH_PYTHONS.get(minor(torch))


def torch_supports_python(torch: str, python: str) -> bool | None:
    """True/False when known, None for a torch release the table does not cover."""
    span = torch_pythons(torch)
    if span is None:
        return None
    return py_tuple(span[0]) <= py_tuple(python) <= py_tuple(span[1])


def wheel_indexes(platform: Platform, torch: str) -> tuple[WheelIndex, ...]:
    """PyTorch indexes known to carry `torch` for `platform` (empty: none known)."""
    if platform is Platform.CPU:
        return (CPU_INDEX,)
    table = ROCM_INDEXES if platform is Platform.ROCM else CUDA_INDEXES
    version = Version(Version(torch).public)
    for spec, indexes in table:
        if version in SpecifierSet(spec):
            return indexes
    return ()


def same_minor(a: str, b: str) -> bool:
    """ROCm/CUDA versions match when major.minor agree ("6.2" ~ "6.2.4")."""
    return py_tuple(a)[:2] == py_tuple(b)[:2]


def pick_index(platform: Platform, torch: str, prefer: str | None) -> WheelIndex | None:
    """The index for `torch`: the one matching `prefer` (the ROCm/CUDA of the base) or the newest."""
    indexes = wheel_indexes(platform, torch)
    for index in indexes:
        version = index.platform_version
        if prefer is not None and version is not None and same_minor(version, prefer):
            return index
    return indexes[-1] if indexes else None


def index_for_url(platform: Platform, torch: str, url: str) -> WheelIndex | None:
    """The known index whose URL is `url` for this torch, None when the table has no such pair."""
    for index in wheel_indexes(platform, torch):
        if index.url == url.rstrip("/"):
            return index
    return None


# DeepSpeed's install_requires by release, read from the sdists' requirements/requirements.txt and
# setup.py: 0.13.1 (pynvml), 0.14.5 (nvidia-ml-py, always), 0.15.4 (+msgpack; nvidia-ml-py only on
# CUDA), 0.16.9 / 0.17.6 / 0.18.9 / 0.19.6 / 0.19.8 (+einops). Releases between two checked ones get
# the union of both sides, so an unchecked boundary can only add a harmless extra package.
DS_COMMON = ("hjson", "ninja", "packaging", "psutil", "py-cpuinfo", "pydantic", "tqdm")


def deepspeed_packages(deepspeed: str, platform: Platform) -> tuple[str, ...]:
    """Names of DeepSpeed's runtime deps (numpy and torch excluded: the torch layer pins them)."""
    ds = Version(Version(deepspeed).public)
    names = list(DS_COMMON)
    # ROCm builds must not get NVML: DeepSpeed would try to talk to an NVIDIA driver (docs/background.md
    # section 6).
    if platform is not Platform.ROCM:
        if ds < Version("0.14.5"):
            names.append("pynvml")
        elif ds < Version("0.15.4") or platform is Platform.CUDA:
            names.append("nvidia-ml-py")
    if ds >= Version("0.15.0"):
        names.append("msgpack")
    if ds >= Version("0.16.0"):
        names.append("einops")
    return tuple(sorted(names))


def has_mics(deepspeed: str) -> bool:
    """MiCS was removed in 0.19.7: its sdist has no runtime/zero/mics.py, and a survey on torch
    2.13 measured 0.19.6 reproduced, 0.19.7 and 0.19.8 unsupported."""
    return Version(Version(deepspeed).public) < Version("0.19.7")


# -- GPU architectures and drivers (read by the preflight checks) ------------------------------------

# GPU architectures PyTorch's ROCm wheels are compiled for, by wheel index: the PYTORCH_ROCM_ARCH
# of PyTorch's wheel builder (pytorch/builder manywheel/build_docker.sh, later pytorch's
# .ci/docker/manywheel/build.sh). ROCm 5.x builds: gfx900;gfx906;gfx908;gfx90a;gfx1030 (gfx1100
# added for the 5.6/5.7 wheels, believed); ROCm >= 6.0 adds gfx942; the 6.2.4+ builds add RDNA3/4.
# MI100 = gfx908, MI200 = gfx90a, MI300 = gfx942. An index missing here is not checked.
_ROCM5 = ("gfx900", "gfx906", "gfx908", "gfx90a", "gfx1030")
_ROCM6 = (*_ROCM5, "gfx1100", "gfx942")
_ROCM624 = (*_ROCM6, "gfx1101", "gfx1102", "gfx1200", "gfx1201")
ROCM_WHEEL_ARCHES: dict[str, tuple[str, ...]] = {
    "rocm5.4.2": _ROCM5,
    "rocm5.6": (*_ROCM5, "gfx1100"),
    "rocm5.7": (*_ROCM5, "gfx1100"),
    "rocm6.0": _ROCM6,
    "rocm6.1": _ROCM6,
    "rocm6.2": _ROCM6,
    "rocm6.2.4": _ROCM624,
    "rocm6.3": _ROCM624,
    "rocm6.4": _ROCM624,
}

# What DeepSpeed's JIT-compiled ops (FusedAdam...) are built for in the ROCm images: the
# Instinct accelerators this lab targets (MI100, MI200, MI300). gfx942 is left out for ROCm
# bases older than 6.0, whose compilers predate it.
ROCM_JIT_ARCHES = ("gfx908", "gfx90a", "gfx942")


def rocm_jit_arches(rocm: str | None) -> tuple[str, ...]:
    """PYTORCH_ROCM_ARCH for an image on ROCm `rocm` (None: the newest list)."""
    if rocm is not None and py_tuple(rocm)[:1] < (6,):
        return tuple(a for a in ROCM_JIT_ARCHES if a != "gfx942")
    return ROCM_JIT_ARCHES


def gfx_name(target_version: int) -> str | None:
    """KFD's gfx_target_version (major*10000 + minor*100 + stepping) as an arch name: 90008 ->
    gfx908, 90010 -> gfx90a, 90402 -> gfx942, 100300 -> gfx1030. 0 (a CPU node) -> None."""
    if target_version <= 0:
        return None
    major, minor, step = target_version // 10000, (target_version // 100) % 100, target_version % 100
    return f"gfx{major}{minor:x}{step:x}"


def gfx_from_override(value: str) -> str | None:
    """HSA_OVERRIDE_GFX_VERSION ("9.0.8", "10.3.0") as the arch the runtime then reports."""
    parts = value.strip().split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    major, minor, step = (int(p) for p in parts)
    return gfx_name(major * 10000 + minor * 100 + step)


def rocm_wheel_arches(torch: str, torch_index: str | None) -> tuple[str, ...] | None:
    """The arches a ROCm torch wheel runs on, None when the index is not in the table."""
    if not torch_index:
        return None
    index = index_for_url(Platform.ROCM, torch, torch_index)
    tag = index.tag if index is not None else torch_index.rstrip("/").rsplit("/", 1)[-1]
    return ROCM_WHEEL_ARCHES.get(tag)


# NVIDIA's CUDA compatibility rules (CUDA Toolkit release notes, "CUDA Toolkit and Corresponding
# Driver Versions", Linux x86_64). A CUDA runtime of major version X runs on any driver at least
# DRIVER_FLOOR[X] (minor version compatibility; PTX JIT needs the toolkit's own driver); below it,
# nothing runs. The driver that shipped with each toolkit is what NVIDIA recommends.
CUDA_DRIVER_FLOOR: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
CUDA_TOOLKIT_DRIVER: dict[str, str] = {
    "11.7": "515.43.04",
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}


def driver_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.strip().split(".") if p.isdigit())


def cuda_driver_floor(cuda: str) -> str | None:
    """The oldest NVIDIA driver that runs a CUDA `cuda` runtime, None when the major is unknown."""
    return CUDA_DRIVER_FLOOR.get(py_tuple(cuda)[0])
