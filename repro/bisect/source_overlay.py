"""A DeepSpeed checkout instead of a release in the probe env, for `git bisect run` over
DeepSpeed's history: `python -m repro probe --deepspeed-src PATH` (venv engine only).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.core import cmd
from repro.core.errors import BuildError, UsageError
from repro.engines.base import EngineKind, Prepared
from repro.engines.venv.layer import PURELIB, link_base
from repro.matrix.model import HIDE_GPUS

if TYPE_CHECKING:
    from repro.engines.base import Engine

_STAGE_IGNORE = (".git", "build", "dist", "*.egg-info", "__pycache__")
# Imports DeepSpeed too: a commit that installs but does not import is unknown, not a crash.
_DS_VERSION = "import importlib.metadata as m, deepspeed; print(m.version('deepspeed'))"


class SourceOverlay:
    """Venv-engine wrapper: the env's cached venv (torch and the pins, built once) plus a small
    venv on top whose own site-packages holds DeepSpeed built from a checkout.

    The overlay sees the base venv through a .pth file (repro/engines/venv/layer.py, the same layering
    the venv engine uses for DeepSpeed-release probes), so torch is never reinstalled; its own
    site-packages comes first on sys.path, so the checkout's DeepSpeed shadows the release.
    The checkout is built from a staged copy: an in-tree build would leave build/ behind, and
    setuptools would carry files deleted in a later commit into the next bisect step's wheel.
    """

    def __init__(self, inner: Engine, src: Path, runner: Callable[..., cmd.CmdResult] = cmd.run) -> None:
        if inner.kind is not EngineKind.VENV:
            raise UsageError(
                "--deepspeed-src works with the venv engine only",
                why="a checkout is layered over the env's cached venv",
                fix="add ENGINE=venv (--engine venv)",
            )
        if not (src / "setup.py").is_file() and not (src / "pyproject.toml").is_file():
            raise UsageError(
                f"--deepspeed-src {src} is not a Python project checkout",
                fix="pass the root of a DeepSpeed git checkout (the folder with setup.py)",
            )
        self.inner, self.src, self.runner = inner, src.resolve(), runner
        self.kind = EngineKind.VENV

    def describe(self) -> str:
        return f"{self.inner.describe()} + DeepSpeed built from {self.src}"

    def preflight(self, env: Any) -> None:
        self.inner.preflight(env)

    def run_suite(self, prepared: Any, args: Any, out_dir: Any, timeout_s: Any) -> Any:
        return self.inner.run_suite(prepared, args, out_dir, timeout_s)

    def _out(self, argv: list[str], what: str, env_id: str, extra_env: dict[str, str] | None = None) -> str:
        result = self.runner(argv, capture=True, extra_env=extra_env)
        if not result.ok:
            raise BuildError(
                f"{env_id} with DeepSpeed from {self.src}: {what} failed (exit {result.returncode})",
                why=result.tail() or "see the output above",
                fix="a commit that does not build is skipped by `git bisect run` (exit 125)",
            )
        return str(result.stdout).strip()

    def commit(self) -> str | None:
        """The checkout's short commit, only when SRC is a git work tree root (an unpacked sdist
        inside some other repository must not borrow that repository's commit)."""
        if not (self.src / ".git").exists() or shutil.which("git") is None:
            return None
        result = self.runner(
            ["git", "-C", str(self.src), "rev-parse", "--short", "HEAD"], capture=True, echo=False
        )
        return (result.stdout.strip() or None) if result.ok else None

    def prepare(self, env: Any) -> Prepared:
        base = self.inner.prepare(env)
        base_dir = Path(base.handle)
        digest = hashlib.sha256(str(self.src).encode()).hexdigest()[:10]
        overlay = base_dir.with_name(f"{base_dir.name}+dssrc-{digest}")
        py = overlay / "bin" / "python"
        if not py.exists():
            self._out(
                [str(base_dir / "bin" / "python"), "-m", "venv", str(overlay)],
                "creating the overlay venv",
                env.id,
            )
        purelib = self._out([str(py), "-c", PURELIB], "locating site-packages", env.id)
        base_lib = self._out(
            [str(base_dir / "bin" / "python"), "-c", PURELIB], "locating site-packages", env.id
        )
        link_base(Path(purelib), base_lib)
        commit = self.commit()
        # GPUs hidden as in every DeepSpeed install (repro.matrix.model.HIDE_GPUS says why).
        build = {
            "DS_BUILD_OPS": "0",
            **dict(HIDE_GPUS),
            **({"DS_BUILD_STRING": f"+{commit}"} if commit else {}),
        }
        with tempfile.TemporaryDirectory(prefix="mics-repro-dssrc-") as tmp:
            staged = Path(tmp) / "src"
            shutil.copytree(self.src, staged, ignore=shutil.ignore_patterns(*_STAGE_IGNORE), symlinks=True)
            self._out(
                [
                    str(py),
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--no-build-isolation",
                    "--no-deps",
                    "--force-reinstall",
                    str(staged),
                ],
                "building and installing the checkout",
                env.id,
                build,
            )
        version = self._out([str(py), "-c", _DS_VERSION], "importing the installed DeepSpeed", env.id)
        label = f"{overlay} (DeepSpeed {version} from {self.src}{'@' + commit if commit else ''})"
        return Prepared(
            EngineKind.VENV,
            env.id,
            str(overlay),
            label,
            base.reused,
            {"python": str(py), "deepspeed": version, "deepspeed_src": str(self.src), "commit": commit or ""},
        )
