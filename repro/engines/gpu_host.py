"""What the host's GPUs look like, read from /dev, /sys and `nvidia-smi`: facts, no verdicts.

Every root is a field of `GpuHost`, so the default test tier describes any machine (an MI100 node,
an H100 node, a laptop, a user outside the render group) with a fake tree in a temporary folder;
`nvidia-smi` goes through the one subprocess door (repro.core.cmd), which tests fake.
"""

from __future__ import annotations

import grp
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from repro.core import cmd
from repro.core.errors import MissingToolError
from repro.matrix import compat

# Variables that narrow which GPUs a process sees. HIP honours CUDA_VISIBLE_DEVICES too, and
# ROCR_VISIBLE_DEVICES is applied below HIP, so on ROCm every one of them can only shrink the set.
ROCM_VISIBILITY = (
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
)
CUDA_VISIBILITY = ("CUDA_VISIBLE_DEVICES",)
KFD_NODES = "class/kfd/kfd/topology/nodes"
# Where Docker looks for CDI specs when `docker info` does not say (its defaults).
CDI_DEFAULT_DIRS = ("/etc/cdi", "/var/run/cdi")


@dataclass(frozen=True)
class NvidiaGpu:
    index: str
    name: str
    driver: str


@dataclass(frozen=True)
class SmiAnswer:
    """`nvidia-smi`'s answer: absent (not installed), failed (no driver reachable) or a GPU list."""

    installed: bool
    ok: bool = False
    gpus: tuple[NvidiaGpu, ...] = ()
    message: str = ""


@dataclass(frozen=True)
class GpuHost:
    """The machine the preflight checks look at (defaults: this one)."""

    dev: Path = Path("/dev")
    sys: Path = Path("/sys")
    root: Path = Path("/")  # prefix for the CDI spec dirs `docker info` names
    environ: Mapping[str, str] | None = None  # None: os.environ at call time
    uid: int | None = None  # None: this process's effective uid
    gids: frozenset[int] | None = None  # None: this process's groups
    group_names: Mapping[int, str] = field(default_factory=dict)  # overrides /etc/group lookups

    # -- who is asking -------------------------------------------------------------------------
    def env(self) -> Mapping[str, str]:
        return os.environ if self.environ is None else self.environ

    def user(self) -> tuple[int, frozenset[int]]:
        uid = os.geteuid() if self.uid is None else self.uid
        gids = frozenset((*os.getgroups(), os.getegid())) if self.gids is None else self.gids
        return uid, gids

    def group_name(self, gid: int) -> str:
        if gid in self.group_names:
            return self.group_names[gid]
        try:
            return grp.getgrgid(gid).gr_name
        except KeyError:
            return str(gid)

    # -- AMD ---------------------------------------------------------------------------------
    @property
    def kfd(self) -> Path:
        return self.dev / "kfd"

    def render_nodes(self) -> list[Path]:
        return sorted((self.dev / "dri").glob("renderD*"))

    def gfx_arches(self) -> list[str]:
        """The gfx arch of every GPU KFD lists (CPU nodes have gfx_target_version 0), in node order;
        HSA_OVERRIDE_GFX_VERSION replaces them all, as it does for the ROCm runtime."""
        arches = []
        for node in sorted((self.sys / KFD_NODES).glob("*"), key=lambda p: (len(p.name), p.name)):
            try:
                text = (node / "properties").read_text()
            except OSError:
                continue
            props = dict(line.split(None, 1) for line in text.splitlines() if len(line.split(None, 1)) == 2)
            try:
                name = compat.gfx_name(int(props.get("gfx_target_version", "0")))
            except ValueError:
                name = None
            if name is not None:
                arches.append(name)
        override = compat.gfx_from_override(self.env().get("HSA_OVERRIDE_GFX_VERSION", ""))
        return [override for _ in arches] if override and arches else arches

    def unopenable(self, nodes: list[Path]) -> list[tuple[Path, int]]:
        """(node, owning gid) for each device node this user may not read and write."""
        uid, gids = self.user()
        refused = []
        for node in nodes:
            try:
                st = node.stat()
            except OSError:
                continue
            mode = st.st_mode
            can = (
                uid == 0
                or mode & 0o006 == 0o006
                or (st.st_uid == uid and mode & 0o600 == 0o600)
                or (st.st_gid in gids and mode & 0o060 == 0o060)
            )
            if not can:
                refused.append((node, st.st_gid))
        return refused

    # -- NVIDIA ------------------------------------------------------------------------------
    def nvidia_device_nodes(self) -> list[Path]:
        return sorted(p for p in self.dev.glob("nvidia[0-9]*"))

    def nvidia_smi(self) -> SmiAnswer:
        argv = ["nvidia-smi", "--query-gpu=index,name,driver_version", "--format=csv,noheader"]
        try:
            done = cmd.run(argv, capture=True, timeout_s=60, echo=False)
        except MissingToolError:
            return SmiAnswer(installed=False)
        text = (done.stdout or "") + (done.stderr or "")
        if not done.ok:
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            first = lines[0] if lines else f"exit {done.returncode}"
            return SmiAnswer(installed=True, ok=False, message=first)
        gpus = []
        for line in (done.stdout or "").splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 3 and parts[0].isdigit():
                gpus.append(NvidiaGpu(parts[0], ", ".join(parts[1:-1]), parts[-1]))
        return SmiAnswer(installed=True, ok=True, gpus=tuple(gpus))

    def cdi_specs_name_nvidia(self, dirs: tuple[str, ...]) -> bool:
        """Whether a CDI spec in `dirs` (on this host, under `root`) declares NVIDIA GPUs."""
        for folder in dirs or CDI_DEFAULT_DIRS:
            base = self.root / folder.lstrip("/")
            for spec in sorted(base.glob("*")) if base.is_dir() else []:
                try:
                    if spec.is_file() and "nvidia.com/gpu" in spec.read_text(errors="replace"):
                        return True
                except OSError:
                    continue
        return False


def _listed(value: str) -> int:
    """Devices a visibility list names: the runtimes stop at the first negative entry ("-1" hides all)."""
    count = 0
    for item in (part.strip() for part in value.split(",")):
        if not item or item.startswith("-"):
            break
        count += 1
    return count


# Set but empty, these hide nothing: HIP ignored an empty HIP_VISIBLE_DEVICES and still showed every
# AMD GPU (ROCm 5.2, ROCm/hip#3001), where an empty ROCR_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES hid
# them all. Counting it as "no GPUs" stopped gpu-check and the preflight on a host whose GPUs torch sees.
EMPTY_HIDES_NOTHING = frozenset({"HIP_VISIBLE_DEVICES"})


def visible_limit(environ: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    """The fewest GPUs any set visibility variable allows (an empty value hides all, except where
    EMPTY_HIDES_NOTHING says the runtime ignores it), None if none narrows the set."""
    limits = [
        _listed(environ[n])
        for n in names
        if n in environ and not (n in EMPTY_HIDES_NOTHING and not environ[n].strip())
    ]
    return min(limits) if limits else None


def visible_count(found: int, environ: Mapping[str, str], names: tuple[str, ...]) -> int:
    limit = visible_limit(environ, names)
    return found if limit is None else min(found, limit)
