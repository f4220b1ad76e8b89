"""`ds_report` for the artifacts: `python -m repro.workload.ds_report --device cpu|gpu`.

On CPU, DeepSpeed < 0.14.1 cannot even import its CPU accelerator without the placeholder
modules the runs use (cpu_shims), so the report goes through the same preparation. The report
itself is DeepSpeed's own (`deepspeed.env_report.main`), unchanged.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m repro.workload.ds_report")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    args = p.parse_args(argv)
    if args.device == "cpu":
        from repro.workload.cpu.shims import deepspeed_version, install_placeholders

        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        placed = install_placeholders(deepspeed_version())
        if placed:
            print(f"[mics-repro] empty placeholder modules for this report: {', '.join(placed)}")
    if importlib.util.find_spec("deepspeed") is None:
        print("deepspeed is not installed in this environment", file=sys.stderr)
        return 1
    from deepspeed import env_report

    env_report.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
