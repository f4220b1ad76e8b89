"""The verdict report: results folders in, report.html (self-contained) and REPORT.md out.

Entry point: `build_report(result_dirs, out_dir) -> ReportPaths` (repro.report.build). Imported
lazily here so that `import repro.report` stays cheap (matplotlib loads only when a report is built).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repro.core.scrub import Scrubber
    from repro.report.build import ReportPaths


def build_report(
    result_dirs: Sequence[Path], out_dir: Path, *, scrubber: Scrubber | None = None
) -> ReportPaths:
    from repro.report.build import build_report as build

    return build(result_dirs, out_dir, scrubber=scrubber)


__all__ = ["build_report"]
