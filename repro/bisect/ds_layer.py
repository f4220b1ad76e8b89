"""What the two ways of putting a DeepSpeed checkout over an env's cached venv share.

`SourceOverlay` (repro/bisect/source_overlay.py) pip-installs a checkout into a small venv;
`WorktreeLayer` (repro/bisect/worktree_layer.py) links a work tree into one. Both wrap the venv
engine, hand everything but `prepare` to it, and build their small venv the same way: over the
base venv through a .pth file (repro/engines/venv/layer.py), so torch is never reinstalled and
the layer's own site-packages, first on sys.path, shadows the release.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from repro.core import cmd
from repro.core.errors import BuildError, UsageError
from repro.engines.base import Delegating, EngineKind, Prepared
from repro.engines.venv.layer import PURELIB, link_base
from repro.engines.venv.layer_env import base_interpreter as interpreter_of
from repro.engines.venv.layer_env import carry_scripts, venv_argv

if TYPE_CHECKING:
    from repro.engines.base import Engine
    from repro.matrix.model import Env


@dataclass(frozen=True)
class LayerVenv:
    """The small venv over the env's cached one, as `DeepSpeedLayer.layer_venv` made it."""

    base: Prepared  # the env's cached venv, prepared by the inner engine
    base_dir: Path
    path: Path
    python: Path
    site: Path  # the layer's own site-packages
    base_site: str


class DeepSpeedLayer(Delegating):
    """Venv-engine wrapper whose DeepSpeed comes from `src` rather than the env's release
    (subclasses give `describe` and `prepare`; every other step is the venv engine's)."""

    suffix = "ds"  # the layer venv is `<base venv>+<suffix>-<digest of src>`
    failure_fix = ""  # what a failed build or import step means for the bisection
    echo = False  # print each step's command line (a long pip build shows it is under way)

    def __init__(
        self,
        inner: Engine,
        src: Path,
        runner: Callable[..., cmd.CmdResult] = cmd.run,
        *,
        venv_only: str,
    ) -> None:
        if inner.kind is not EngineKind.VENV:
            raise UsageError(
                f"{venv_only} with the venv engine only",
                why="DeepSpeed from a checkout is layered over the env's cached venv",
                fix="add ENGINE=venv (--engine venv)",
            )
        super().__init__(inner)
        self.src, self.runner = src.resolve(), runner

    def out(self, argv: list[str], what: str, env_id: str, extra_env: Mapping[str, str] | None = None) -> str:
        """Run one build step; its stdout, or a BuildError that names the step."""
        result = self.runner(
            argv, capture=True, echo=self.echo, extra_env=dict(extra_env) if extra_env else None
        )
        if not result.ok:
            raise BuildError(
                f"{env_id} with DeepSpeed from {self.src}: {what} failed (exit {result.returncode})",
                why=result.tail() or "see the output above",
                fix=self.failure_fix,
            )
        return str(result.stdout).strip()

    def layer_venv(self, env: Env, *, with_pip: bool) -> LayerVenv:
        """The env's cached venv (built or reused by the inner engine) and the layer venv over it."""
        base = self.inner.prepare(env)
        base_dir = Path(base.handle)
        digest = hashlib.sha256(str(self.src).encode()).hexdigest()[:10]
        path = base_dir.with_name(f"{base_dir.name}+{self.suffix}-{digest}")
        python = path / "bin" / "python"
        if python.exists() and interpreter_of(path) != interpreter_of(base_dir):
            # Made by an older version of this tool, on another Python than the env's: remade.
            shutil.rmtree(path)
        if not python.exists():
            self.out(venv_argv(base_dir, path, with_pip=with_pip), "creating the layer venv", env.id)
        site = Path(self.out([str(python), "-c", PURELIB], "locating site-packages", env.id))
        base_site = self.out(
            [str(base_dir / "bin" / "python"), "-c", PURELIB], "locating site-packages", env.id
        )
        link_base(site, base_site)
        # The env's commands (torchrun, deepspeed...) run the layer's DeepSpeed; a checkout's own
        # scripts, installed into the layer by pip later, replace the copies.
        carry_scripts(base_dir, path)
        return LayerVenv(base, base_dir, path, python, site, base_site)
