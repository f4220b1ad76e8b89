"""An env whose torch is the host's (`torch_from = "host"` in the matrix): a venv that sees it.

On an air-gapped or HPC GPU host torch is installed already (a site venv, a module, a vendor
image) and cannot be downloaded. The env's venv is then made from that host Python, and its
site-packages get a .pth file that adds the host's site-packages *after* the venv's own (the same
link a layer has to its base, repro/engines/venv/layer.py): torch and what came with it (numpy,
the CUDA libraries) are the host's, every other pin is installed into the venv from the
wheelhouse and shadows the host's copy. `--system-site-packages` would not do: made from a
Python that is itself a venv (`/opt/torch/.venv/bin/python3`), it shows the *base* interpreter's
packages, not that venv's, and torch would be missing.

The host's torch is checked against the env's pin (version and build label, with
repro/engines/torch_check.py) before anything is installed and whenever the venv is reused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from repro.core import cmd
from repro.core.errors import BuildError
from repro.engines.venv.layer import base_pth_line

HOST_PTH = "_mics_repro_host.pth"
# Run by the host's Python: its site-packages folders and the folder torch is found in (a user
# site or PYTHONPATH entry counts too), without importing torch (seconds, and a GPU runtime).
SITES_PROBE = (
    "import importlib.util, json, os, site; "
    "spec = importlib.util.find_spec('torch'); "
    "where = os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else None; "
    "print(json.dumps({'sites': [p for p in site.getsitepackages() if os.path.isdir(p)], 'torch': where}))"
)
# Run by the venv's Python: torch as the venv sees it (through the link), in torch_check's form.
BUILD_PROBE = (
    "import torch; v = torch.version; "
    "print(torch.__version__, getattr(v, 'hip', None) or '-', getattr(v, 'cuda', None) or '-'); "
    "print(torch.__file__)"
)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class HostSites:
    sites: tuple[str, ...]  # what the venv's .pth adds, in order
    torch_dir: str


def host_sites(python: str) -> HostSites:
    """The host Python's site-packages and where its torch is; BuildError when it has none."""
    done = cmd.run([python, "-c", SITES_PROBE], capture=True, echo=False)
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.ok else {}
    except (ValueError, IndexError):
        found = {}
    torch_dir = found.get("torch")
    if not torch_dir:
        raise BuildError(
            f'{python} has no torch: an env with torch_from = "host" takes the host Python\'s own',
            why=done.tail() if not done.ok else "importlib finds no torch module there",
            fix="install the env's torch into that Python, or point MICS_REPRO_PYTHON (--python) at the "
            "Python that has it",
        )
    sites = [str(s) for s in found.get("sites") or []]
    return HostSites(tuple(dict.fromkeys([*sites, str(torch_dir)])), str(torch_dir))


def link_host(venv_purelib: Path, sites: Iterable[str]) -> None:
    """Make the host's site-packages visible from the venv, after its own."""
    venv_purelib.mkdir(parents=True, exist_ok=True)
    (venv_purelib / HOST_PTH).write_text("".join(base_pth_line(site) for site in sites))


def linked_sites(venv: Path) -> list[str]:
    """What a built venv's .pth adds (for the records): the host folders its torch comes from."""
    out: list[str] = []
    for pth in sorted(venv.glob(f"lib/python*/site-packages/{HOST_PTH}")):
        out += re.findall(r"addsitedir\('([^']*)'\)", pth.read_text())
    return out


def foreign_complaints(check_output: str, ours: Iterable[str]) -> tuple[list[str], list[str]]:
    """`pip check`'s complaints split into (those about a package the venv installed or one it
    pins, which fail the build; those only about the host's own packages, which are noted):
    a host venv holds packages (transformers, accelerate...) whose requirements are not ours."""
    mine = {canonicalize_name(n) for n in ours}
    fatal: list[str] = []
    noted: list[str] = []
    for line in check_output.splitlines():
        words = {canonicalize_name(m.group(0)) for m in (_NAME.match(w) for w in line.split()) if m}
        if not line.strip() or line.startswith("No broken requirements"):
            continue
        (fatal if words & mine else noted).append(line.strip())
    return fatal, noted
