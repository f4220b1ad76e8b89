"""A DeepSpeed commit as a layer that points at its work tree (AXIS=deepspeed-commit probes).

Building a wheel of each commit costs most of a commit probe (60-104 s on 2 cores), and with
DS_BUILD_OPS=0 the wheel is only DeepSpeed's Python files. So the probe venv (a small venv over
the env's cached one, through the same .pth layering as SourceOverlay, repro/engines/venv/layer.py)
gets instead, in its own site-packages (first on sys.path, ahead of the base's release):

- `deepspeed`: a symlink to the work tree's `deepspeed/` (its own links, accelerator/ and
  ops/op_builder, resolve inside the tree as they do in a wheel build);
- `deepspeed-<version>.dist-info`: the metadata importlib.metadata reads (version.txt + the short
  SHA, as setup.py writes it);
and the work tree gets the file setup.py generates, `deepspeed/git_version_info_installed.py`
(version, hash, no ops installed, the env's accelerator and torch info taken from the base's
release, which setup.py computed on the same env).

The layer is reused across commits: the probe venv and the symlink stay, the tree is checked out
anew (repro/bisect/commits.py: `checkout --force` + `clean -ffdx`), so the layer always shows
exactly the commit's files; a file deleted in a later commit is gone from the tree, not left
behind in site-packages as a reinstall could leave it.

A commit that does not import is `unknown`. Importing DeepSpeed (and torch) costs about 6 s on
2 cores, a third of a warm probe, so it is not done up front: a probe that ends crashed or
env-error is checked afterwards (`ImportChecked`), and if the commit does not import, that is
what the probe says (env-error, unknown) instead of a crash that BAD_IF=failed would count as bad.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from repro.bisect.ds_layer import DeepSpeedLayer
from repro.bisect.probe import Evaluate, Observation, ProbeSpec
from repro.core import cmd
from repro.core.errors import UsageError
from repro.core.safe_git import SafeGit
from repro.engines.base import EngineKind, Prepared
from repro.workload.record import Outcome, Signature

if TYPE_CHECKING:
    from repro.engines.base import Engine
    from repro.engines.jobdeps import JobDeps
    from repro.matrix.model import Env
    from repro.workload.record import LayerRecord

GENERATED = "deepspeed/git_version_info_installed.py"
_IMPORT = "import deepspeed; print(deepspeed.__version__)"
_DEFAULT_TORCH_INFO = "{'version': '0.0', 'cuda_version': '0.0', 'hip_version': '0.0'}"


def installed_info(tree: Path, short_sha: str, base_generated: str | None) -> tuple[str, str]:
    """(version, text of git_version_info_installed.py) for the commit in `tree`."""
    version_file = tree / "version.txt"
    base_version = version_file.read_text().strip() if version_file.is_file() else "0.0.0"
    version = f"{base_version}+{short_sha}"

    def from_base(name: str, default: str) -> str:
        match = re.search(rf"^{name}=(.*)$", base_generated or "", re.MULTILINE)
        return match.group(1).strip() if match else default

    text = (
        "# Written by mics-repro (repro/bisect/worktree_layer.py) as DeepSpeed's setup.py would.\n"
        f"version='{version}'\n"
        f"git_hash='{short_sha}'\n"
        "git_branch='HEAD'\n"
        "from .ops.op_builder.all_ops import ALL_OPS as _ALL_OPS\n"
        "installed_ops = dict.fromkeys(_ALL_OPS.keys(), False)  # DS_BUILD_OPS=0\n"
        f"accelerator_name={from_base('accelerator_name', repr(''))}\n"
        f"torch_info={from_base('torch_info', _DEFAULT_TORCH_INFO)}\n"
    )
    return version, text


class WorktreeLayer(DeepSpeedLayer):
    """Venv-engine wrapper: the env's cached venv plus a layer whose DeepSpeed is `tree`."""

    suffix = "dswt"
    failure_fix = "a commit that does not import is unknown and stepped around"

    def __init__(self, inner: Engine, tree: Path, runner: Callable[..., cmd.CmdResult] = cmd.run) -> None:
        super().__init__(inner, tree, runner, venv_only="DeepSpeed commits are probed")
        if not (self.src / "deepspeed" / "__init__.py").is_file():
            raise UsageError(f"{tree} holds no deepspeed/ package", fix="pass a DeepSpeed work tree")
        self.tree = self.src
        self.python: str | None = None  # the layer's interpreter, once prepared

    def describe(self) -> str:
        return f"{self.inner.describe()} + DeepSpeed from the work tree {self.tree}"

    def prepare_job(self, env: Env, prepared: Prepared, deps: JobDeps) -> tuple[Prepared, LayerRecord]:
        """Refused: the work tree changes under the layer at each commit, and a job layer over it
        would be rebuilt for every one (SourceOverlay, a built checkout, takes a job's packages)."""
        raise UsageError(
            "a job's packages (REQUIREMENTS=/PACKAGES=) cannot be added over a DeepSpeed commit's layer",
            fix="install the packages into the env (a derived env in env_matrix/), or drop DEEPSPEED_COMMIT=",
        )

    def _short_sha(self) -> str:
        result = SafeGit(self.runner).run("rev-parse", "--short", "HEAD", where=["-C", str(self.tree)])
        return str(result.stdout).strip() if result.ok and result.stdout.strip() else "unknown"

    def prepare(self, env: Env) -> Prepared:
        made = self.layer_venv(env, with_pip=False)
        site, py = made.site, made.python
        base_generated = Path(made.base_site, GENERATED)
        short = self._short_sha()
        version, text = installed_info(
            self.tree, short, base_generated.read_text() if base_generated.is_file() else None
        )
        (self.tree / GENERATED).write_text(text)
        link = site / "deepspeed"
        if link.is_symlink() or link.exists():
            if not (link.is_symlink() and Path(link.readlink()) == self.tree / "deepspeed"):
                shutil.rmtree(link) if link.is_dir() and not link.is_symlink() else link.unlink()
        if not link.is_symlink():
            link.symlink_to(self.tree / "deepspeed", target_is_directory=True)
        for old in site.glob("deepspeed-*.dist-info"):
            shutil.rmtree(old)
        info = site / f"deepspeed-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: deepspeed\nVersion: {version}\n")
        (info / "INSTALLER").write_text("mics-repro\n")
        (info / "RECORD").write_text("")
        self.python = str(py)
        label = f"{made.path} (DeepSpeed {version} from {self.tree})"
        return Prepared(
            EngineKind.VENV,
            env.id,
            str(made.path),
            label,
            made.base.reused,
            {
                **made.base.details,
                "python": str(py),
                "deepspeed": version,
                "deepspeed_src": str(self.tree),
                "commit": short,
                "layered_on": str(made.base_dir),
            },
        )

    def import_error(self) -> str | None:
        """Why the prepared layer's DeepSpeed does not import (its last line), or None."""
        if self.python is None:
            return None
        result = self.runner([self.python, "-c", _IMPORT], capture=True, echo=False)
        return None if result.ok else (result.tail(1) or f"exit {result.returncode}")


class ImportChecked:
    """An evaluation of a commit probe whose crash or env-error is checked for a commit that does
    not import (then env-error: unknown, with the import error as the reason)."""

    def __init__(self, evaluate: Evaluate, layer: WorktreeLayer) -> None:
        self.evaluate, self.layer = evaluate, layer

    def __call__(self, spec: ProbeSpec) -> Observation:
        obs = self.evaluate(spec)
        if obs.outcome not in (Outcome.CRASHED.value, Outcome.ENV_ERROR.value):
            return obs
        why = self.layer.import_error()
        if why is None:
            return obs
        return replace(
            obs,
            outcome=Outcome.ENV_ERROR.value,
            signature=Signature.NONE.value,
            reason=f"the commit does not import: {why}",
        )
