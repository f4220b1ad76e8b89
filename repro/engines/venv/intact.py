"""Is a cached venv still whole? Its marker says what was installed; pip's RECORD of each pinned
package says which files that put there. A venv whose files were deleted since (a cleaner, a full
disk, a hand-edited site-packages) would make every run end env-error while the tool reports
success, so it is rebuilt instead, saying why.

Only names are checked (one lstat per file, ~15k for torch: tens of milliseconds), never contents;
byte-code caches are left out (Python rewrites them at will)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

CHECKED = ("torch", "deepspeed")


def site_packages(venv: Path) -> list[Path]:
    # lib/pythonX.Y/site-packages on POSIX (lib/site-packages where a layout has no version part)
    return sorted([*venv.glob("lib/python*/site-packages"), *venv.glob("lib/site-packages")])


def _dist_info(sites: Sequence[Path], name: str) -> Path | None:
    pattern = re.sub(r"[-_.]+", "_", name)
    for site in sites:
        for found in sorted(site.glob("*.dist-info")):
            if re.sub(r"[-_.]+", "_", found.name.split("-")[0]).lower() == pattern.lower():
                return found
    return None


def damage(sites: Sequence[Path], packages: Sequence[str] = CHECKED) -> str | None:
    """What is missing from the packages' installs (the first few files), or None when whole."""
    for name in packages:
        info = _dist_info(sites, name)
        if info is None:
            return f"{name} is not installed in it (no {name}-*.dist-info)"
        record = info / "RECORD"
        try:
            lines = record.read_text(errors="replace").splitlines()
        except OSError:
            return f"{name}'s install record {record.name} is missing"
        missing = []
        for line in lines:
            rel = line.rsplit(",", 2)[0] if line.count(",") >= 2 else line
            if not rel or rel.endswith(".pyc") or "__pycache__" in rel:
                continue
            if not os.path.lexists(info.parent / rel):
                missing.append(rel)
                if len(missing) >= 3:
                    break
        if missing:
            return f"{', '.join(missing)} of {name} {'is' if len(missing) == 1 else 'are'} missing"
    return None
