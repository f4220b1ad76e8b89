"""Is the torch a venv holds the env's build? Asked after every install (repro/engines/venv/engine.py).

The pin (repro.matrix.compat.torch_spec) makes pip take the env's build; this check proves it did,
from what torch itself says: its full version (with the local label) and `torch.version.hip` /
`torch.version.cuda`. Without it a cuda venv holding a ROCm torch of the right version passed the
version check and then ended every run as env-error (issue 33).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.matrix.compat import Platform
from repro.workload.closed import assert_never

if TYPE_CHECKING:
    from repro.matrix.model import Env

# Two lines: "<torch public version> <deepspeed version>" (what the venv check always read), then
# "<torch.__version__> <torch.version.hip or -> <torch.version.cuda or ->".
PROBE = (
    "import torch, importlib.metadata as m; "
    "print(torch.__version__.split('+')[0], m.version('deepspeed')); "
    "v = torch.version; "
    "print(torch.__version__, getattr(v, 'hip', None) or '-', getattr(v, 'cuda', None) or '-')"
)


def _given(word: str) -> str | None:
    return None if word == "-" else word


def build_problem(env: Env, build_line: str) -> str | None:
    """Why the installed torch (PROBE's second line) is not `env`'s build, or None when it is."""
    words = build_line.split()
    if len(words) != 3:
        return f"torch did not say which build it is (got {build_line!r})"
    version, hip, cuda = words[0], _given(words[1]), _given(words[2])
    kind = f"a ROCm {hip} build" if hip else f"a CUDA {cuda} build" if cuda else "a CPU-only build"
    platform = env.platform
    if platform is Platform.ROCM:
        wrong = hip is None
    elif platform is Platform.CUDA:
        wrong = hip is not None or cuda is None
    elif platform is Platform.CPU:
        wrong = hip is not None  # PyPI's Linux torch is a CUDA build; the cpu index's has neither
    else:
        assert_never(platform)
    want = env.torch_version()
    if wrong:
        return f"torch {version} is {kind}, not the {platform.label} build the env {env.id} pins"
    # PyPI's wheels carry no label in their file name (which the pin `torch===X` matches), yet some
    # report one: PyPI's torch 2.1.0 for Linux says "2.1.0+cu121". There only the public version
    # can be compared; the hip/cuda check above already tells the platform.
    if want is not None and "+" not in want:
        version = version.split("+")[0]
    if want is not None and version != want:
        return f"torch {version} is installed ({kind}), the env {env.id} pins torch {want}"
    return None
