"""Where things are: the repository checkout, the default results root and the per-machine cache.

Defined once so that moving a module never changes what a relative `__file__` climb resolves to.
"""

from __future__ import annotations

import os
from pathlib import Path

from repro.core.errors import UsageError

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
REPO_ROOT = PACKAGE_ROOT.parent
DEFAULT_RESULTS_ROOT = REPO_ROOT / "results"
DEFAULT_MATRIX = REPO_ROOT / "env_matrix" / "envs.toml"
PATCH_DIR = REPO_ROOT / "patches"


def cache_root() -> Path:
    """Root of every cache this tool keeps (wheelhouse, venvs, build logs, release lists)."""
    override = os.environ.get("MICS_REPRO_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "mics-repro"


def confined(root: Path, relpath: str | Path) -> Path | None:
    """`root / relpath` when it stays inside `root` once resolved, else None.

    For paths that come from files (results.json, a bundle's manifest): an absolute path, a `..`
    that climbs out, or a symlink that leads elsewhere all resolve outside `root` and are refused,
    so nothing the file names can make us read or write outside the folder it describes.
    """
    text = str(relpath)
    if not text or "\x00" in text or Path(text).is_absolute():
        return None
    base = Path(root).resolve()
    target = (base / text).resolve()
    return target if target == base or base in target.parents else None


def check_output_folder(out: Path, option: str = "OUT") -> Path:
    """`out` can be made (or is) a folder: it is not a file, and the nearest part of it that exists
    is a folder. Nothing is made here; a UsageError names the file in the way."""
    if out.exists() and not out.is_dir():
        raise UsageError(
            f"{option}={out} is a file, not a folder",
            why="this command writes a folder of files there",
            fix=f"choose a new {option}= folder (it is made with its parents)",
        )
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(
            f"{option}={out} cannot be made: {parent} is a file",
            why="a folder cannot be made inside a file",
            fix=f"choose an {option}= whose parent folders are folders",
        )
    return out
