"""A custom job's packages as a layer over an env's venv (`make run REQUIREMENTS=... ENGINE=venv`).

The same layering as the DeepSpeed probe layers (repro/engines/venv/layer.py): a small venv
whose site-packages has a .pth that adds the env venv's site-packages after its own. The job's
packages are installed into the layer by the env's own pip with every package the env holds
(`pip freeze --all`) as a constraint, so the env's torch, DeepSpeed and numpy are what the job
imports; the env venv itself is never written to. The layer is made by the env venv's own
interpreter, and the env's console scripts (torchrun, deepspeed, ds_report, pip) get a copy in the
layer's bin/ that starts the layer's interpreter, so the ranks a launcher starts see the job's
packages too (repro/engines/venv/layer_env.py).

Layers are cached by (env venv, requirements digest) next to the env venvs and reused while their
base still holds the pins it had; a marker (the venv engine's, with `layered_on`, so no probe ever
layers on a job layer) is written last. The packages the layer added are downloaded into the
wheelhouse (`pip download --no-deps`, from pip's cache), so a bundle carries them and an offline
host installs them again.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from repro.core import cmd, console
from repro.core.errors import BuildError
from repro.engines import jobdeps
from repro.engines.base import safe_name
from repro.engines.venv.layer import build_lock
from repro.engines.venv.layer_env import LAYER_FORMAT, building, carry_scripts, check_step, make_layer_venv
from repro.matrix.model import HIDE_GPUS
from repro.workload.record import DepsRecord, LayerRecord

JOB_MARKER = "mics-repro-job.json"
VENV_MARKER = "mics-repro-venv.json"  # repro/engines/venv/engine.py MARKER: only a finished venv has it
CONSTRAINTS = ".mics-repro-constraints.txt"
REQUIREMENTS = ".mics-repro-requirements.txt"


@dataclass(frozen=True)
class JobLayer:
    """A finished layer: where it is, what it stands on and what it added."""

    path: Path
    base: Path
    packages: Mapping[str, str]  # added by the layer, name -> version
    reused: bool

    def record(self, deps: jobdeps.JobDeps) -> LayerRecord:
        return {
            **deps.record(),
            "layer": str(self.path),
            "base": str(self.base),
            "added": dict(self.packages),
        }


# The layer's JOB_MARKER: its base venv and the pins there, what it added, and the job's packages.
class _JobMarker(DepsRecord):
    base: str
    base_pins: dict[str, str]
    added: dict[str, str]
    format: int  # LAYER_FORMAT


def layer_dir(base: Path, deps: jobdeps.JobDeps) -> Path:
    return base.with_name(f"{base.name}+job-{deps.digest()}")


def ensure_layer(
    base: Path, deps: jobdeps.JobDeps, *, env_id: str, sources: Sequence[str], wheelhouse: Path, offline: bool
) -> JobLayer:
    """The layer for `deps` over the finished env venv `base`: reused, or built and swapped in."""
    final = layer_dir(base, deps)
    with build_lock(final.with_name(f".{final.name}.lock")):
        base_pins = _freeze(base / "bin" / "python", env_id, "the env's packages")
        # The refusal comes before anything is installed: the env's pins, then all it holds.
        python = _python_version(str(base / "bin" / "python"), env_id)
        jobdeps.check_pins(deps, base_pins, env_id=env_id, python=python)
        info = _read(final)
        if (
            info is not None
            and info.get("base_pins") == base_pins
            and info.get("format") == LAYER_FORMAT  # older layers: another Python, no env commands
            and (final / "bin" / "python").exists()
        ):
            console.info(f"venv: reusing the job layer {final} ({deps.describe()})")
            return JobLayer(final, base, dict(info.get("added") or {}), True)
        return _Build(base, final, deps, base_pins, python, env_id, sources, wheelhouse, offline).run()


@dataclass(frozen=True)
class _Build:
    """One build of a job layer: `final` over the env venv `base`, which holds `base_pins` and runs
    CPython `python` (the layer is made by that same interpreter)."""

    base: Path
    final: Path
    deps: jobdeps.JobDeps
    base_pins: Mapping[str, str]
    python: str  # "3.10.12"
    env_id: str
    sources: Sequence[str]
    wheelhouse: Path
    offline: bool

    def run(self) -> JobLayer:
        """Build the layer in a temporary folder and swap it in at `final`; nothing half-built is kept."""
        started = time.monotonic()
        env = _pip_env()
        with building(self.final) as tmp:
            console.info(f"venv: the job's packages as a layer over {self.base}: {self.deps.describe()}")
            subject = f"job layer for {self.env_id}"
            py = make_layer_venv(self.base, tmp, subject, what="the job layer", base_is="the env's", env=env)
            self._stage_inputs(tmp)
            self._install(py, tmp, env)
            added = self._added(py)
            if not self.offline and added:
                _to_wheelhouse(py, added, self.wheelhouse, env)
            carry_scripts(self.base, tmp)
            self._write_markers(tmp, added)
        console.info(
            f"venv: job layer ready in {time.monotonic() - started:.0f} s: {self.final} "
            f"(added {', '.join(f'{k}=={v}' for k, v in added.items()) or 'nothing'})"
        )
        return JobLayer(self.final, self.base, added, False)

    def _stage_inputs(self, tmp: Path) -> None:
        """Copy the job's wheels into the wheelhouse and write pip's constraints and requirements."""
        self.wheelhouse.mkdir(parents=True, exist_ok=True)
        for wheel in self.deps.wheels:  # the job's own wheels travel with the wheelhouse (bundles, offline)
            shutil.copy2(wheel, self.wheelhouse / Path(wheel).name)
        (tmp / CONSTRAINTS).write_text(jobdeps.constraints(self.base_pins))
        (tmp / REQUIREMENTS).write_text(self.deps.requirements_text())

    def _install(self, py: str, tmp: Path, env: Mapping[str, str]) -> None:
        """Install the job's packages into the layer under the env's pins; BuildError when pip fails."""
        # The env's pip, run by the layer's interpreter, installs into the layer; GPUs hidden as
        # for every install step (a package's setup.py may import torch).
        argv = [py, "-m", "pip", "install", *self.sources]
        argv += ["-c", str(tmp / CONSTRAINTS), "-r", str(tmp / REQUIREMENTS)]
        # pip's output goes to the env's venv log (the layer's folder is removed on failure), shown in
        # full when it fails; streamed only with VERBOSE=1.
        log = self.final.parent.parent / "logs" / f"venv-{safe_name(self.env_id)}-job.log"
        what = "venv: installing the job's packages"
        with console.task(f"{what}: {self.deps.describe()}", plain=False):
            result, text = cmd.run_logged(argv, log, what, env=env, extra_env=dict(HIDE_GPUS))
        if not result.ok:
            raise BuildError(
                f"installing the job's packages over {self.env_id} failed (exit {result.returncode})",
                why=_pip_cause(text),
                fix="a requirement (or one of its dependencies) needs another version of a package the "
                "env pins (listed in the constraints above), or is not on PyPI/in the wheelhouse; "
                "pick versions contemporary with the env's torch; nothing was kept",
            )

    def _added(self, py: str) -> dict[str, str]:
        """The packages the layer added; BuildError if it moved any of the env's."""
        after = _freeze(Path(py), self.env_id, "the layer's packages")
        changed = jobdeps.moved(self.base_pins, after)
        if changed:  # cannot happen with the constraints; checked, because it is the promise
            what = f"the job layer over {self.env_id} changed the env's packages"
            raise BuildError(what, why="; ".join(changed))
        return jobdeps.new_packages(self.base_pins, after)

    def _write_markers(self, tmp: Path, added: dict[str, str]) -> None:
        """Write the job marker, then the venv engine's marker (with `layered_on`) that makes it finished."""
        info: _JobMarker = {
            "base": str(self.base),
            "base_pins": dict(self.base_pins),
            "added": added,
            "format": LAYER_FORMAT,
            **self.deps.record(),
        }
        (tmp / JOB_MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        marker = {
            "env_id": self.env_id,
            "pins": {},
            "python": ".".join(self.python.split(".")[:2]),
            "layered_on": {"venv": str(self.base), "job": self.deps.digest(), "pins": {}},
        }
        (tmp / VENV_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")


def layer_freeze(layer: Path) -> dict[str, str]:
    """What the layer's interpreter sees: the env's packages and the job's (tests, records)."""
    return _freeze(layer / "bin" / "python", "?", "the layer's packages")


def _pip_env() -> dict[str, str]:
    # The host's PYTHONPATH must not reach pip: it would see (and resolve against) host packages.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


# Every distribution the interpreter imports, first on sys.path winning as for imports (`pip freeze`
# writes a package installed from a file as `name @ file://...`, which is no version).
_LIST = (
    "import importlib.metadata as m, json\n"
    "seen = {}\n"
    "for d in m.distributions():\n"
    "    seen.setdefault(d.metadata['Name'], d.version)\n"
    "print(json.dumps(seen))\n"
)


def _freeze(python: Path, env_id: str, what: str) -> dict[str, str]:
    result = cmd.run([str(python), "-c", _LIST], capture=True, echo=False, env=_pip_env())
    _check(result, env_id, f"listing {what}")
    found = json.loads(result.stdout.strip().splitlines()[-1])
    return jobdeps.pins_from_freeze("".join(f"{name}=={version}\n" for name, version in found.items()))


def _python_version(python: str, env_id: str) -> str:
    result = cmd.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture=True,
        echo=False,
        env=_pip_env(),
    )
    _check(result, env_id, "asking the layer's Python its version")
    return result.stdout.strip()


def _to_wheelhouse(py: str, added: Mapping[str, str], wheelhouse: Path, env: Mapping[str, str]) -> None:
    argv = [py, "-m", "pip", "download", "--no-deps", "-d", str(wheelhouse), "--find-links", str(wheelhouse)]
    argv += [f"{name}=={version}" for name, version in added.items()]
    if not cmd.run(argv, env=env, capture=True).ok:  # the layer works anyway; only offline reuse is lost
        console.warn(f"warning: could not copy the job's packages into the wheelhouse {wheelhouse}")


def _read(layer: Path) -> _JobMarker | None:
    try:
        data: _JobMarker = json.loads((layer / JOB_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and (layer / VENV_MARKER).is_file() else None


def _pip_cause(text: str, lines: int = 25) -> str:
    tail = text.rstrip().splitlines()[-lines:]
    return "\n".join(tail) or "see the output above"


def _check(result: cmd.CmdResult, env_id: str, what: str) -> None:
    check_step(result, f"job layer for {env_id}", what)
