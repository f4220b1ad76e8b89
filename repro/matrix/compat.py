"""What is known about torch and DeepSpeed releases, as data: wheel indexes, Python support, deps.

Sources (see /work/shared/FACTS.md and env_matrix/README.md): the torch -> ROCm index table is
FACTS section 5; the torch -> Python table was read off PyPI's file listing of torch (linux x86_64
wheels, every release 2.0 to 2.15); DeepSpeed's requirements were read from the release sdists named
below. Entries marked `certain=False` are believed, not checked here: derived envs that use them
say so in their notes.
"""

from __future__ import annotations

import enum
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
        """"5.6" for rocm5.6, "12.1" for cu121, None for cpu."""
        if self.tag.startswith("rocm"):
            return self.tag[len("rocm"):]
        if self.tag.startswith("cu"):
            digits = self.tag[len("cu"):]
            return f"{digits[:-1]}.{digits[-1]}"
        return None


def _indexes(*tags: str, certain: bool = True) -> tuple[WheelIndex, ...]:
    return tuple(WheelIndex(tag, certain) for tag in tags)


# torch release range -> the indexes that carry its wheels (FACTS section 5; "likely" ones uncertain).
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

# FACTS checks only torch 2.1 (cu118/cu121); the rest follows PyTorch's release notes from memory.
CUDA_INDEXES: tuple[tuple[str, tuple[WheelIndex, ...]], ...] = (
    (">=2.0,<2.1", _indexes("cu117", "cu118", certain=False)),
    (">=2.1,<2.2", _indexes("cu118", "cu121")),
    (">=2.2,<2.4", _indexes("cu118", "cu121", certain=False)),
    (">=2.4,<2.6", _indexes("cu118", "cu121", "cu124", certain=False)),
    (">=2.6,<2.7", _indexes("cu118", "cu124", "cu126", certain=False)),
    (">=2.7,<2.8", _indexes("cu118", "cu126", "cu128", certain=False)),
    (">=2.8,<2.9", _indexes("cu126", "cu128", "cu129", certain=False)),
    (">=2.9,<2.10", _indexes("cu126", "cu128", "cu130", certain=False)),
)

CPU_INDEX = WheelIndex("cpu")

# torch minor -> (oldest, newest) CPython with manylinux x86_64 wheels on PyPI.
TORCH_PYTHONS: dict[str, tuple[str, str]] = {
    "2.0": ("3.8", "3.11"), "2.1": ("3.8", "3.11"),
    "2.2": ("3.8", "3.12"), "2.3": ("3.8", "3.12"), "2.4": ("3.8", "3.12"),
    "2.5": ("3.9", "3.13"), "2.6": ("3.9", "3.13"), "2.7": ("3.9", "3.13"), "2.8": ("3.9", "3.13"),
    "2.9": ("3.10", "3.14"), "2.10": ("3.10", "3.14"), "2.11": ("3.10", "3.14"),
    "2.12": ("3.10", "3.14"), "2.13": ("3.10", "3.14"), "2.14": ("3.10", "3.14"),
    "2.15": ("3.11", "3.15"),
}


def minor(version: str) -> str:
    """"2.1" for "2.1.0+rocm5.6"."""
    release = Version(version).release
    return f"{release[0]}.{release[1] if len(release) > 1 else 0}"


def _py_tuple(python: str) -> tuple[int, ...]:
    return tuple(int(part) for part in python.split("."))


def torch_pythons(torch: str) -> tuple[str, str] | None:
    """The Python range torch's wheels cover, None when this release is not in the table."""
    return TORCH_PYTHONS.get(minor(torch))


def torch_supports_python(torch: str, python: str) -> bool | None:
    """True/False when known, None for a torch release the table does not cover."""
    span = torch_pythons(torch)
    if span is None:
        return None
    return _py_tuple(span[0]) <= _py_tuple(python) <= _py_tuple(span[1])


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
    return _py_tuple(a)[:2] == _py_tuple(b)[:2]


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
    # ROCm builds must not get NVML: DeepSpeed would try to talk to an NVIDIA driver (FACTS section 5).
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
