"""Where things are: the repository checkout, the default results root and the per-machine cache.

Defined once so that moving a module never changes what a relative `__file__` climb resolves to.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
REPO_ROOT = PACKAGE_ROOT.parent
DEFAULT_RESULTS_ROOT = REPO_ROOT / "results"
DEFAULT_MATRIX = REPO_ROOT / "env_matrix" / "envs.toml"
PATCH_DIR = REPO_ROOT / "patches"


def cache_root() -> Path:
    """Root of every cache this tool keeps (wheelhouse, venvs, build logs, release lists)."""
    override = os.environ.get("MICS_REPRO_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "mics-repro"
