"""Layered venvs: a small venv on top of a cached one, for probes that change only DeepSpeed.

A DeepSpeed-axis survey derives one env per release (`cpu+ds0.14.0`, ...), and each would
otherwise reinstall torch (4.7 GB for PyPI's CUDA build of torch 2.1). When a cached venv holds
the same stack (torch, its wheel index, numpy, Python, tooling) and the same versions of every
package both envs pin, the probe venv is made small instead: its site-packages gets a .pth file
that adds the base venv's site-packages *after* its own, so the probe's own DeepSpeed shadows
the base's, and only DeepSpeed (plus any dependency the base lacks) is installed into it.
The `--deepspeed-src` overlay (repro/bisect/source_overlay.py) stands on the same two helpers.

`layer_base` is the decision (pure); `link_base` writes the .pth file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

BASE_PTH = "_mics_repro_base.pth"
PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
# Only DeepSpeed may differ between a layer and its base; these must be pinned by both, equal
# (torch_from too: a host-torch venv, repro/engines/venv/host_torch.py, is no base, nor layered).
STACK_KEYS = frozenset(
    "recipe platform base_image python torch_index torch numpy rocm cuda"
    " pip setuptools wheel torch_from".split()
)
MAY_DIFFER = frozenset({"deepspeed"})
NO_LAYER_ENV = "MICS_REPRO_NO_LAYER"


@dataclass(frozen=True)
class Candidate:
    """A cached venv that could serve as a base: its directory name, pins and Python."""

    name: str
    pins: Mapping[str, str]
    python: str
    layered: bool = False  # itself a layer: never a base (no chains)
    preferred: bool = False  # the env the wanted one is derived from


@dataclass(frozen=True)
class LayerPlan:
    base: str  # the chosen candidate's name
    install: tuple[str, ...]  # pinned packages the base lacks or pins differently ("name==v")
    unused: tuple[str, ...]  # packages the base has and the layer does not need (visible anyway)


def layer_base(want: Mapping[str, str], python: str, candidates: Iterable[Candidate]) -> LayerPlan | None:
    """The cached venv to layer `want` on, or None when a full venv must be built.

    A base qualifies when it is a full venv of the same Python, pins every STACK_KEYS entry that
    `want` pins at the same value, and agrees with `want` on every package both pin, DeepSpeed
    aside. Packages `want` pins and the base lacks are installed into the layer (DeepSpeed's
    newer dependencies); packages only the base has stay visible through the .pth and are listed
    as `unused`. Among qualifying bases: the env `want` derives from, then the fewest packages to
    install, then the fewest unused ones, then the name (deterministic).
    """
    if want.get("deepspeed") is None:
        return None
    best: tuple[tuple[int, int, int, str], LayerPlan] | None = None
    for cand in candidates:
        if cand.layered or cand.python != python or "deepspeed" not in cand.pins:
            continue
        if any(want.get(k) != cand.pins.get(k) for k in STACK_KEYS if k in want or k in cand.pins):
            continue
        shared = (set(want) & set(cand.pins)) - MAY_DIFFER
        if any(want[k] != cand.pins[k] for k in shared):
            continue
        install = tuple(sorted(f"{k}=={want[k]}" for k in set(want) - set(cand.pins)))
        if want["deepspeed"] != cand.pins["deepspeed"]:
            install = (f"deepspeed=={want['deepspeed']}", *install)
        unused = tuple(sorted(set(cand.pins) - set(want)))
        rank = (0 if cand.preferred else 1, len(install), len(unused), cand.name)
        if best is None or rank < best[0]:
            best = (rank, LayerPlan(cand.name, install, unused))
    return best[1] if best else None


def layering_disabled() -> bool:
    return os.environ.get(NO_LAYER_ENV, "") not in ("", "0")


def base_pth_line(base_purelib: str) -> str:
    # addsitedir (not a bare path) so the base's own .pth files are processed too, exactly as in
    # the base venv; it appends, so the layer's site-packages keeps precedence.
    return f"import site; site.addsitedir({base_purelib!r})\n"


def link_base(layer_purelib: Path, base_purelib: str) -> None:
    """Make the base venv's site-packages visible from the layer (after the layer's own)."""
    layer_purelib.mkdir(parents=True, exist_ok=True)
    (layer_purelib / BASE_PTH).write_text(base_pth_line(base_purelib))


@contextlib.contextmanager
def build_lock(lock_path: Path) -> Iterator[None]:
    """One build of the same venv or layer at a time between invocations on one machine (the venv
    engine's stale-temp sweep honours these locks)."""
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
