"""The hook's second door: a .pth file in the env's site-packages, which every Python process of
that env reads at start whatever its PYTHONPATH says.

The hook's first door (repro/workload/hook/sitecustomize.py first on PYTHONPATH) is knocked out by
a job that sets its own PYTHONPATH (`CMD="env PYTHONPATH=deps torchrun ..."`) or runs Python with
`-E`/`-I`; site-packages is still read then (only `-S` skips it). The line this module writes does
nothing unless MICS_REPRO_HOOK=1 and MICS_REPRO_ROOT are set, which only the job runner and
`make shell` set; then it puts the lab's repository last on sys.path and activates the hook
(repro/workload/jobhook.py, idempotent, so a process reached through both doors is hooked once).

`python -m repro.workload.hookpth` installs it into the running interpreter's site-packages (the
env's venv, a REQUIREMENTS layer, or the image's Python) and prints the path.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig

PTH_NAME = "_mics_repro_hook.pth"
# Set by the engines for the job runner (repro/workload/job.py), which then installs the .pth.
INSTALL_VAR = "MICS_REPRO_HOOK_PTH"
# One line: site.addpackage executes lines that start with "import". Inert without both variables.
PTH_LINE = (
    "import os, sys; _r = os.environ.get('MICS_REPRO_ROOT', ''); "
    "os.environ.get('MICS_REPRO_HOOK') == '1' and _r and (_r in sys.path or sys.path.append(_r) or True) "
    "and __import__('repro.workload.jobhook', fromlist=['activate']).activate(os.environ)\n"
)


def site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


def install(folder: str | None = None) -> str | None:
    """Write the .pth into `folder` (default: this interpreter's site-packages) unless it is there
    already; returns its path, or None when the folder is not writable (the PYTHONPATH door is
    then the only one, and the judge says so if it was knocked out)."""
    folder = folder or site_packages()
    path = os.path.join(folder, PTH_NAME)
    with contextlib.suppress(OSError), open(path) as fh:
        if fh.read() == PTH_LINE:
            return path
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(folder, exist_ok=True)
        with open(tmp, "w") as fh:
            fh.write(PTH_LINE)
        os.replace(tmp, path)  # atomic: two runs of one env may install it at the same time
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return None
    return path


def main() -> int:
    path = install()
    if path is None:
        print(f"cannot write {PTH_NAME} into {site_packages()}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
