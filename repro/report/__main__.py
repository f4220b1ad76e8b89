"""`python -m repro.report RESULTS_DIR... [--out OUT]`: the same door the CLI's `report` command uses."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from repro.core.errors import ReproError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.report", description=__doc__)
    parser.add_argument("results", nargs="+", type=Path, help="results folders (one per invocation)")
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default: the first results folder)"
    )
    args = parser.parse_args(argv)
    from repro.report.build import build_report

    try:
        paths = build_report(args.results, args.out or args.results[0])
    except ReproError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    print(
        f"report: {paths.html}\nmarkdown: {paths.markdown}\n"
        f"plots: {len(paths.plots)} in {paths.markdown.parent / 'plots'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
