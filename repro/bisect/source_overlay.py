"""A DeepSpeed checkout instead of a release in the env, built and pip-installed into a layer
(venv engine only): for `git bisect run` over DeepSpeed's history (`python -m repro probe
--deepspeed-src PATH`) and for a custom job (`make run DEEPSPEED_SRC=PATH`, pr-verify's sessions of
DeepSpeed's own tests, repro/upstream/pr/suite.py). A job's packages (PACKAGES=) go into a job layer
over this one (repro/engines/venv/joblayer.py): each layer's .pth adds the one below with
`site.addsitedir`, so the job sees its packages, then the checkout's DeepSpeed, then the env.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from repro.bisect.ds_layer import DeepSpeedLayer
from repro.core import cmd, console
from repro.core.errors import UsageError
from repro.core.safe_git import SafeGit
from repro.engines.base import EngineKind, Prepared
from repro.matrix.model import HIDE_GPUS, Env

if TYPE_CHECKING:
    from repro.engines.base import Engine

# Not staged: git's and earlier builds' files, and what running tests leaves in a tree (pytest's
# cache, which pytest-randomly writes at every session), so a tree the tests ran in is the same
# tree to build (the digest below).
_STAGE_IGNORE = (".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis")
# In the layer: the digest of the tree and build settings last installed there. pr-verify runs
# each side's tree in two sessions (plain gloo, the adapter) over one layer; the second finds the
# same digest and imports what the first built instead of building it again.
_INSTALLED = "dssrc-installed.sha256"
# In the layer: the checkout it was made for. A layer is named by that path, so one whose checkout
# is gone (pr-verify's exported trees go with their folder; a test's go with its tmp) is never
# used again: the next prepare over the same env removes it and the job layers over it.
_SOURCE = "dssrc-source"
# Imports DeepSpeed too: a commit that installs but does not import is unknown, not a crash.
_DS_VERSION = "import importlib.metadata as m, deepspeed; print(m.version('deepspeed'))"


class SourceOverlay(DeepSpeedLayer):
    """Venv-engine wrapper: the env's cached venv (torch and the pins, built once) plus a small
    venv on top (repro/bisect/ds_layer.py) whose own site-packages holds DeepSpeed built from a
    checkout. The checkout is built from a staged copy: an in-tree build would leave build/
    behind, and setuptools would carry files deleted in a later commit into the next bisect
    step's wheel.
    """

    suffix = "dssrc"
    failure_fix = "a commit that does not build is skipped by `git bisect run` (exit 125)"
    echo = True

    def __init__(
        self,
        inner: Engine,
        src: Path,
        runner: Callable[..., cmd.CmdResult] = cmd.run,
        *,
        failure_fix: str | None = None,
    ) -> None:
        super().__init__(inner, src, runner, venv_only="--deepspeed-src works")
        if failure_fix is not None:  # `make run DEEPSPEED_SRC=`: no bisection to skip the commit
            self.failure_fix = failure_fix
        if not (self.src / "setup.py").is_file() and not (self.src / "pyproject.toml").is_file():
            raise UsageError(
                f"--deepspeed-src {src} is not a Python project checkout",
                fix="pass the root of a DeepSpeed git checkout (the folder with setup.py)",
            )

    def describe(self) -> str:
        return f"{self.inner.describe()} + DeepSpeed built from {self.src}"

    def commit(self) -> str | None:
        """The checkout's short commit, only when SRC is a git work tree root (an unpacked sdist
        inside some other repository must not borrow that repository's commit)."""
        if not (self.src / ".git").exists() or shutil.which("git") is None:
            return None
        # The checkout is the user's (`git bisect run` exports GIT_DIR to its command): safe_git.
        result = SafeGit(self.runner).run("rev-parse", "--short", "HEAD", where=["-C", str(self.src)])
        return (result.stdout.strip() or None) if result.ok else None

    def prepare(self, env: Env) -> Prepared:
        layer = self.layer_venv(env, with_pip=True)
        (layer.path / _SOURCE).write_text(str(self.src) + "\n")
        _remove_orphans(layer.base_dir, self.suffix)
        py = layer.python
        commit = self.commit()
        # GPUs hidden as in every DeepSpeed install (repro.matrix.model.HIDE_GPUS says why).
        build = {
            "DS_BUILD_OPS": "0",
            **dict(HIDE_GPUS),
            **({"DS_BUILD_STRING": f"+{commit}"} if commit else {}),
        }
        marker = layer.path / _INSTALLED
        with tempfile.TemporaryDirectory(prefix="mics-repro-dssrc-") as tmp:
            staged = Path(tmp) / "src"
            shutil.copytree(self.src, staged, ignore=shutil.ignore_patterns(*_STAGE_IGNORE), symlinks=True)
            digest = _tree_digest(staged, build)
            installed = marker.read_text().strip() if marker.is_file() else ""
            if installed == digest:
                console.info(
                    f"venv: {layer.path.name} holds DeepSpeed built from these same files; not rebuilt"
                )
            else:
                # Gone before the install starts: one cut short leaves no claim of a finished one.
                marker.unlink(missing_ok=True)
                self.out(
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
        printed = self.out([str(py), "-c", _DS_VERSION], "importing the installed DeepSpeed", env.id)
        version = printed.splitlines()[-1]  # DeepSpeed's import may log first (its accelerator)
        marker.write_text(digest + "\n")
        label = f"{layer.path} (DeepSpeed {version} from {self.src}{'@' + commit if commit else ''})"
        return Prepared(
            EngineKind.VENV,
            env.id,
            str(layer.path),
            label,
            layer.base.reused,
            {"python": str(py), "deepspeed": version, "deepspeed_src": str(self.src), "commit": commit or ""},
        )


def _tree_digest(root: Path, build: dict[str, str]) -> str:
    """sha256 of every file's path and bytes under `root` (a link: its target) and the build's
    environment: the same digest means pip would install the same DeepSpeed. Every byte, unlike
    repro.run.job.workdir_digest (files over 1 MiB by size, a time limit): that one names the code
    a run saw, this one stands in for a build. `root` is the staged copy, made by this process."""
    h = hashlib.sha256(json.dumps(build, sort_keys=True).encode())
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if (Path(folder) / d).is_symlink()]:
            path = Path(folder) / name
            h.update(str(path.relative_to(root)).encode() + b"\0")
            h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
    return h.hexdigest()


def _remove_orphans(base_dir: Path, suffix: str) -> None:
    """Remove the layers over `base_dir` whose checkout no longer exists, with their job layers
    (`<layer>+job-...`). A layer without the record of its checkout is left alone."""
    for layer in base_dir.parent.glob(f"{base_dir.name}+{suffix}-*"):
        recorded = layer / _SOURCE
        if "+job-" in layer.name or not recorded.is_file():
            continue
        if not Path(recorded.read_text().strip()).is_dir():
            for path in (layer, *base_dir.parent.glob(f"{layer.name}+job-*")):
                shutil.rmtree(path, ignore_errors=True)
