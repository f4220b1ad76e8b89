"""`ds_report` for the artifacts: `python -m repro.workload.ds_report --device cpu|gpu`.

On CPU, DeepSpeed < 0.14.1 cannot even import its CPU accelerator without the placeholder
modules the runs use (cpu_shims), so the report goes through the same preparation. The report
itself is DeepSpeed's own (`deepspeed.env_report.main`), unchanged.

On GPUs it runs with the GPUs visible, but DeepSpeed >= 0.14 wrote the accelerator it saw when it
was installed into `deepspeed/git_version_info_installed.py`, and this lab installs it with the GPUs
hidden (repro.workload.device.HIDE_GPUS says why): that recorded accelerator is `cpu`. The report
then opens with a note saying so, so nobody reads it as the accelerator the runs used.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

# The header of a GPU report whose DeepSpeed recorded the CPU accelerator at install time.
HIDDEN_INSTALL_NOTE = (
    "[mics-repro] note: DeepSpeed {version} was installed with the GPUs hidden "
    "(DS_BUILD_OPS=0 and empty CUDA/HIP/ROCR_VISIBLE_DEVICES, so that its setup.py neither runs nvcc "
    "nor reads ROCM_HOME), so the accelerator it recorded at install is 'cpu' "
    "(deepspeed/git_version_info_installed.py); what depends on that record below (the op table's "
    "'installed' column, 'deepspeed wheel compiled w.') describes that install, not the GPUs. The "
    "runs pick their accelerator when they start: see ran_on in their records."
)


def install_note(device: str) -> str | None:
    """The note to print before a `device` report, or None when the install record is not misleading."""
    if device != "gpu":
        return None
    try:
        from deepspeed import git_version_info
    except Exception:  # noqa: BLE001 - env_report's own import then shows the real error
        return None
    if getattr(git_version_info, "accelerator_name", None) != "cpu":
        return None  # DeepSpeed < 0.14 records none; an install that saw the GPUs records theirs
    return HIDDEN_INSTALL_NOTE.format(version=getattr(git_version_info, "version", "?"))


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
    note = install_note(args.device)
    if note:
        print(note, flush=True)
    from deepspeed import env_report

    env_report.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
