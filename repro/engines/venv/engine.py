"""The venv engine: one cached virtualenv per env pins, for hosts without Docker.

A venv is reused only when the marker written as its last install step matches the requested
pins and interpreter exactly; anything else (half-built, other pins, other Python) is rebuilt.
Venvs are built under a temporary name and renamed into place, so a crash never leaves a
directory that looks complete.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from repro.core import cmd, console
from repro.core.errors import BuildError, PythonVersionError
from repro.core.paths import REPO_ROOT, cache_root
from repro.engines import jobdeps, preflight
from repro.engines.base import SUITE_MODULE, EngineKind, Prepared, SuiteRun, lock_if_free, safe_name
from repro.engines.passthrough import run_environment
from repro.engines.torch_check import PROBE as TORCH_PROBE
from repro.engines.torch_check import build_problem
from repro.engines.venv import host_torch, intact, joblayer, layer_env
from repro.engines.venv.layer import PURELIB, Candidate, LayerPlan, build_lock, layer_base, layering_disabled
from repro.engines.venv.layer_env import LAYER_FORMAT, base_interpreter, building, carry_scripts
from repro.engines.wheelhouse import PYPI_SIMPLE, DownloadPlan, Wheelhouse
from repro.matrix import compat
from repro.matrix.model import no_usable_python

if TYPE_CHECKING:
    from repro.matrix.model import Env
    from repro.workload.record import LayerRecord

MARKER = "mics-repro-venv.json"
SUITE_LOG = "engine.log"
_VERSION = re.compile(r"^3\.\d+\.\d+\S*$")
_VERSION_PROBE = "import sys; print('.'.join(map(str, sys.version_info[:3])))"


@dataclass(frozen=True)
class Interpreter:
    path: str
    version: str  # "3.11.7"
    why: str = ""  # why this one was chosen (the preamble says it)

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])


# A layer's base, in its marker: the base venv, the pins it had, what the layer changed over it.
class LayeredOn(TypedDict):
    venv: str
    env_id: str
    pins: dict[str, str]
    installed: list[str]
    unused: list[str]
    format: int  # LAYER_FORMAT


# The marker file (MARKER) as JSON: VenvMarker's fields.
class _MarkerJson(TypedDict, total=False):
    env_id: str
    pins: dict[str, str]
    python: str
    layered_on: LayeredOn


@dataclass(frozen=True)
class VenvMarker:
    """What a finished venv holds; compared field by field before reuse.

    `layered_on` is set for a layer (repro/engines/venv/layer.py): the base venv's directory and the
    pins it had when the layer was made; the layer is reused only while that base still holds them.
    """

    env_id: str
    pins: Mapping[str, str]
    python: str  # major.minor of the interpreter the venv was made from
    layered_on: LayeredOn | None = None

    def to_json(self) -> str:
        data: _MarkerJson = {"env_id": self.env_id, "pins": dict(self.pins), "python": self.python}
        if self.layered_on is not None:
            data["layered_on"] = self.layered_on.copy()
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def read(cls, venv: Path) -> VenvMarker | None:
        try:
            data: _MarkerJson = json.loads((venv / MARKER).read_text())
            layered = data.get("layered_on")
            return cls(
                str(data["env_id"]),
                dict(data["pins"]),
                str(data["python"]),
                layered.copy() if isinstance(layered, dict) else None,
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def matches(self, other: VenvMarker) -> bool:
        return dict(self.pins) == dict(other.pins) and self.python == other.python


def venv_root() -> Path:
    return cache_root() / "venvs"


class VenvEngine:
    kind = EngineKind.VENV

    def __init__(
        self,
        *,
        python: str | None = None,
        root: Path | None = None,
        wheelhouse: Wheelhouse | None = None,
        repo_root: Path = REPO_ROOT,
        probe: Callable[[str], Interpreter] | None = None,
    ) -> None:
        self.probe = probe or _probe  # an interpreter's path -> its version
        self.python_override = python or os.environ.get("MICS_REPRO_PYTHON") or None
        self.root = root if root is not None else venv_root()
        self.wheelhouse = wheelhouse if wheelhouse is not None else Wheelhouse()
        self.repo_root = repo_root

    def describe(self) -> str:
        return f"venv engine (cache {self.root})"

    def venv_dir(self, env: Env) -> Path:
        return self.root / f"{safe_name(env.id)}-{env.pins_key()}"

    # -- interpreter -------------------------------------------------------------------------
    def interpreter(self, env: Env) -> Interpreter:
        """The override if given, else this Python, else `python<X.Y>` from PATH for each Python
        the env accepts (its image's first): the first one torch has wheels for and the pin tables
        have versions for (Env.pythons).

        The venv is made from this interpreter, its pins are chosen for it (resolve_env) and the
        wheelhouse downloads for it (prepare), so the three always agree: e.g. rocm56 (Python 3.9
        in its image) gets a Python 3.10 venv with 3.10's pins on an Ubuntu 22.04 host, and cuda
        (3.10 in its image) a 3.9 venv with 3.9's pins on Rocky 9."""
        accepted = env.pythons()
        image = env.image_python
        others = sorted((p for p in accepted or () if p != image), key=preflight.minor_of, reverse=True)
        default = [sys.executable, *(f"python{p}" for p in (image, *others))]
        if env.host_torch:  # the Python whose torch the env takes, never another one found on PATH
            default = [sys.executable]
        candidates = [self.python_override] if self.python_override else default
        seen: list[Interpreter] = []
        broken: list[str] = []
        for name in candidates:
            assert name is not None
            path = shutil.which(name)
            if path is None or any(s.path == path for s in seen):
                continue
            try:
                found = self.probe(path)
            except PythonVersionError as exc:
                if self.python_override:
                    raise
                broken.append(f"{path} did not answer as a CPython 3 ({exc.why or exc.what})")
                continue  # a broken python3.X on PATH must not hide a working one after it
            if self.python_override or env.accepts(found.minor):
                if self.python_override:
                    why = "given by --python/MICS_REPRO_PYTHON"
                elif seen:
                    why = (
                        f"{seen[0].path} is Python {seen[0].version}, which torch {env.torch} with "
                        "its pins cannot use"
                    )
                else:
                    why = f"the Python running this tool; torch {env.torch} and its pins exist for it"
                return replace(found, why=why)
            seen.append(found)
        if self.python_override:
            raise PythonVersionError(
                f"the Python given by --python/MICS_REPRO_PYTHON ({self.python_override}) was not found",
                fix="pass the path of an installed interpreter",
            )
        raise no_usable_python(env, _found_text(seen, accepted or (), broken))

    def resolve_env(self, env: Env) -> Env:
        """`env` as its venv here holds it: pins for the interpreter the venv is made with, and
        which Python that is and why (Env.python_choice, which the preamble prints)."""
        interp = self.interpreter(env)
        preflight.check_python(env, interp.version, interp.path)
        return env.for_python(interp.minor, why=f"{interp.path}, {interp.version}: {interp.why}")

    def preflight(self, env: Env) -> None:
        preflight.check_devices(self.resolve_env(env))

    # -- prepare -----------------------------------------------------------------------------
    def prepare(self, env: Env) -> Prepared:
        interp = self.interpreter(env)
        preflight.check_python(env, interp.version, interp.path)
        env = env.for_python(interp.minor, why=f"{interp.path}, {interp.version}: {interp.why}")
        assert env.python_choice is not None
        console.info(f"venv: {env.python_choice.describe()}")
        want = VenvMarker(env.id, env.pins(), interp.minor)
        final = self.venv_dir(env)
        self.root.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.root)
        with build_lock(self.root / f".{final.name}.lock"):
            have = VenvMarker.read(final)
            base_ok = have is None or self._base_intact(have)
            damaged = None
            if have is not None and have.matches(want) and base_ok and (final / "bin" / "python").exists():
                # The marker says what was installed; pip's RECORDs say whether it is all still there.
                damaged = intact.damage(self._sites(final, have))
                if damaged is None:
                    if env.host_torch:  # the host may have changed its torch since
                        self._check_host_torch(env, str(final / "bin" / "python"))
                    on = f", layered on {have.layered_on['venv']}" if have.layered_on else ""
                    console.info(f"venv: reusing {final} (pins match{on})")
                    return self._prepared(env, final, reused=True, marker=have)
            if final.exists():
                why = (
                    f"damaged: {damaged}"
                    if damaged
                    else "its base venv changed or is gone, or the layer is of an older format"
                    if not base_ok
                    else "pins or Python differ"
                    if have
                    else "no marker: an unfinished or foreign venv"
                )
                console.info(f"venv: rebuilding {final} ({why})")
            plan = None if layering_disabled() or env.host_torch else self._layer_plan(want, final, env)
            if plan is not None:
                marker = self._build_layer(env, interp, want, final, plan)
                return self._prepared(env, final, reused=False, marker=marker)
            # A derived env's venv is its own cache: copying its torch into the wheelhouse as well
            # would double the disk each torch probe takes (gigabytes), so it installs from the index.
            direct = env.is_derived and not self.wheelhouse.offline
            # The wheelhouse holds wheels for the interpreter the venv is made from, not for the
            # env's image Python: an install with --no-index would otherwise find no torch.
            if direct:
                complete = self.wheelhouse.is_complete(DownloadPlan.for_env(env, interp.minor))
            else:
                complete = self.wheelhouse.ensure(env, python=interp.minor)
            self._build(env, interp, want, final, wheelhouse_only=complete, no_cache=direct)
            if direct:
                share_identical_files(final, [c for c in self.root.iterdir() if c != final])
        return self._prepared(env, final, reused=False, marker=want)

    def _prepared(self, env: Env, venv: Path, *, reused: bool, marker: VenvMarker | None = None) -> Prepared:
        details = {"python": str(venv / "bin" / "python"), "platform": env.platform.value}
        if env.python_choice is not None:  # gpu-check's build step records which Python and why
            details["python_choice"] = env.python_choice.describe()
        if env.host_torch:  # the records say torch is the host's, and from where
            details["torch_from"] = "host: " + ", ".join(host_torch.linked_sites(venv))
        label = str(venv)
        if marker is not None and marker.layered_on:
            details["layered_on"] = str(marker.layered_on["venv"])
            label = f"{venv} (layered on {marker.layered_on['venv']})"
        return Prepared(EngineKind.VENV, env.id, str(venv), label, reused, details)

    # -- layers ------------------------------------------------------------------------------
    def _layer_plan(self, want: VenvMarker, final: Path, env: Env) -> LayerPlan | None:
        """Which finished venv of the cache `final` can be a layer over (layer.py), if any."""
        found = []
        for path in sorted(self.root.iterdir()) if self.root.is_dir() else []:
            if path.name.startswith(".") or path == final or not (path / "bin" / "python").exists():
                continue
            marker = VenvMarker.read(path)
            if marker is None:
                continue
            root = env.derived_from is not None and marker.env_id == env.derived_from
            layered = marker.layered_on is not None
            found.append(Candidate(path.name, marker.pins, marker.python, layered=layered, preferred=root))
        return layer_base(want.pins, want.python, found)

    @staticmethod
    def _sites(venv: Path, marker: VenvMarker) -> list[Path]:
        """Where the venv's packages are: its own site-packages, then its base's for a layer, then
        the host's for a host-torch venv (its torch is there, not in the venv)."""
        base = [Path(str(marker.layered_on["venv"]))] if marker.layered_on else []
        own = [site for folder in (venv, *base) for site in intact.site_packages(folder)]
        return [*own, *(Path(site) for site in host_torch.linked_sites(venv))]

    def _base_intact(self, marker: VenvMarker) -> bool:
        if not marker.layered_on:
            return True
        base = Path(str(marker.layered_on.get("venv", "")))
        have = VenvMarker.read(base)
        return (
            have is not None
            and dict(have.pins) == dict(marker.layered_on.get("pins") or {})
            and (base / "bin" / "python").exists()
            # An older layer runs another interpreter and lacks the env's commands: rebuilt.
            and marker.layered_on.get("format") == LAYER_FORMAT
        )

    def _build_layer(
        self, env: Env, interp: Interpreter, want: VenvMarker, final: Path, plan: LayerPlan
    ) -> VenvMarker:
        base = self.root / plan.base
        base_marker = VenvMarker.read(base)
        assert base_marker is not None
        marker = VenvMarker(
            want.env_id,
            want.pins,
            want.python,
            {
                "venv": str(base),
                "env_id": base_marker.env_id,
                "pins": dict(base_marker.pins),
                "installed": list(plan.install),
                "unused": list(plan.unused),
                "format": LAYER_FORMAT,
            },
        )
        started = time.monotonic()
        with build_lock(self.root / f".{base.name}.lock"), building(final) as tmp:
            what = f"venv: layering {final} on {base} (installs only {', '.join(plan.install)})"
            if str(base_interpreter(base)) != interp.path:
                console.info(f"venv: the layer runs the env venv's Python, {base_interpreter(base)}")
            with console.task(what):
                # No pip of its own: the base's pip (the same pinned version) runs from the layer's
                # interpreter, so it installs into the layer.
                py = layer_env.make_layer_venv(base, tmp, f"venv for {env.id}")
                by_name = {spec.partition("==")[0]: spec for spec in plan.install}
                for step in env.install_steps():
                    specs = tuple(s for s in step.specs if s.partition("==")[0] in by_name)
                    if not specs:
                        continue
                    if step.name not in ("deepspeed-deps", "deepspeed"):
                        raise BuildError(
                            f"layer for {env.id}: step {step.name} would change the base",
                            why=f"{', '.join(specs)} differ from {base}",
                        )
                    install, *rest = replace(step, specs=specs).pip_install_args(PYPI_SIMPLE)
                    argv = [py, "-m", "pip", install, *self._sources(False), *rest]
                    with console.task(f"venv: {step.name} (layer): {' '.join(specs)}"):
                        self._pip(argv, step.environment, tmp, env, f"pip step {step.name}")
                carry_scripts(base, tmp)  # after pip: the layer's own DeepSpeed scripts win
                self._verify(env, py)
                (tmp / MARKER).write_text(marker.to_json())  # last: only a finished venv has one
        console.info(f"venv: layer ready in {time.monotonic() - started:.0f} s: {final}")
        return marker

    def _build(
        self,
        env: Env,
        interp: Interpreter,
        marker: VenvMarker,
        final: Path,
        *,
        wheelhouse_only: bool,
        no_cache: bool = False,
    ) -> None:
        started = time.monotonic()
        creating = f"venv: creating {final} with Python {interp.version} (torch is big: minutes)"
        with building(final) as tmp, console.task(creating):
            # A host torch's Python may be a distribution's without ensurepip (Debian/Ubuntu
            # without python3.X-venv): its venv gets pip from the wheelhouse instead.
            bare = ["--without-pip"] if env.host_torch else []
            self._check(cmd.run([interp.path, "-m", "venv", *bare, str(tmp)]), env, "creating the venv")
            py = str(tmp / "bin" / "python")
            if env.host_torch:
                self._pip_from_wheelhouse(env, interp, py)
                self._link_host_torch(env, interp, py)
            # The same ordered steps the Dockerfiles run (Env.install_steps), so a venv and an image
            # of one env hold the same packages; the wheelhouse is tried first by each of them.
            for step in env.install_steps():
                if not step.specs:
                    continue
                install, *rest = step.pip_install_args(PYPI_SIMPLE)
                argv = [py, "-m", "pip", install, *self._sources(wheelhouse_only), *rest]
                if no_cache:
                    argv.insert(4, "--no-cache-dir")  # pip's own cache would keep a copy of torch
                with console.task(f"venv: {step.name}: {' '.join(step.specs)}"):
                    self._pip(argv, step.environment, tmp, env, f"pip step {step.name}")
                    if step.check:
                        self._pip_check(env, py, step.name)
            self._verify(env, py)
            (tmp / MARKER).write_text(marker.to_json())  # last: only a finished venv has one
        console.info(f"venv: ready in {time.monotonic() - started:.0f} s: {final}")

    def _pip_check(self, env: Env, py: str, step: str) -> None:
        """`pip check`: the pinned closure is complete. With a host torch the venv also sees the
        host's packages; their own broken requirements are noted, not ours to fail on."""
        check = cmd.run([py, "-m", "pip", "check"], capture=True)
        if check.ok or not env.host_torch:
            self._check(check, env, f"pip check after {step}")
            return
        ours = [compat.split_pin(s)[0] for s in (*env.tooling, *env.deepspeed_deps)] + ["deepspeed"]
        fatal, noted = host_torch.foreign_complaints(check.stdout + check.stderr, ours)
        for line in noted:
            console.info(f"venv: pip check (the host's packages, not the env's pins): {line}")
        if fatal:
            raise BuildError(
                f"venv for {env.id}: pip check after {step} failed",
                why="\n".join(fatal),
                fix="fix the cause and rerun; nothing half-built was kept",
            )

    def _pip_from_wheelhouse(self, env: Env, interp: Interpreter, py: str) -> None:
        """pip into a venv made --without-pip: the pinned pip wheel runs itself (`python pip.whl/pip`)."""
        spec = next(s for s in env.tooling if compat.split_pin(s)[0] == "pip")
        wheels = [w for w in self.wheelhouse.files_for(spec, interp.minor) if w.name.endswith(".whl")]
        if not wheels:
            raise BuildError(
                f"venv for {env.id}: the wheelhouse has no {spec} wheel to start pip with",
                why=f"a host-torch venv is made without pip and takes it from {self.wheelhouse.path}",
                fix=f"put the {spec} wheel into the wheelhouse (`pip download --no-deps {spec}`)",
            )
        argv = [py, f"{wheels[0]}/pip", "install", "--no-deps", *self._sources(True), spec]
        self._check(cmd.run(argv, capture=True), env, f"installing {spec} from the wheelhouse")

    def _link_host_torch(self, env: Env, interp: Interpreter, py: str) -> None:
        """torch_from = "host": the new venv sees the host Python's site-packages after its own,
        and the torch it finds there must be the env's pin before anything is installed."""
        found = host_torch.host_sites(interp.path)
        purelib = cmd.run([py, "-c", PURELIB], capture=True, echo=False)
        self._check(purelib, env, "locating the venv's site-packages")
        host_torch.link_host(Path(purelib.stdout.strip()), found.sites)
        console.info(f"venv: torch from the host ({found.torch_dir}), not installed")
        self._check_host_torch(env, py)

    def _check_host_torch(self, env: Env, py: str) -> None:
        result = cmd.run([py, "-c", host_torch.BUILD_PROBE], capture=True, echo=False)
        self._check(result, env, "importing the host's torch")
        lines = result.stdout.splitlines()
        wrong = build_problem(env, lines[0] if lines else "")
        if wrong:
            raise BuildError(
                f'the host\'s torch is not the one env {env.id} pins (torch_from = "host")',
                why=f"{wrong} ({lines[1] if len(lines) > 1 else '?'})",
                fix="install the pinned torch into the host's Python, or pin the host's torch in the env",
            )

    def _sources(self, wheelhouse_only: bool) -> list[str]:
        # With an index too, pip prefers the index's copy of a wheel the wheelhouse already has.
        base = ["--disable-pip-version-check", "--find-links", str(self.wheelhouse.path)]
        return [*base, "--no-index"] if wheelhouse_only or self.wheelhouse.offline else base

    def _verify(self, env: Env, py: str) -> None:
        result = cmd.run([py, "-c", TORCH_PROBE], capture=True)
        self._check(result, env, "importing torch")
        lines = result.stdout.splitlines()
        got = lines[0].split() if lines else []
        if got != [env.torch.split("+")[0], env.deepspeed]:
            raise BuildError(
                f"the venv for {env.id} holds torch/deepspeed {' '.join(got)}, "
                f"not {env.torch} / {env.deepspeed}",
                why="pip resolved different versions than the env pins",
                fix="check the wheelhouse and the torch index in env_matrix/envs.toml",
            )
        wrong_build = build_problem(env, lines[1] if len(lines) > 1 else "")
        if wrong_build:
            raise BuildError(
                f"the venv for {env.id} does not hold the torch build the env pins",
                why=wrong_build,
                fix=f"remove the wrong torch wheel from the wheelhouse ({self.wheelhouse.path}) and "
                "build again; the torch index is set in env_matrix/envs.toml",
            )

    def _pip(
        self, argv: list[str], environment: Sequence[tuple[str, str]], tmp: Path, env: Env, what: str
    ) -> None:
        """Run one pip step with its output kept in the env's build log (shown as it comes only
        with VERBOSE=1: the step's one line is the progress), and shown in full when it fails, so
        a failure names its cause (a probe's env-error reason then says e.g. which torch API a
        DeepSpeed release's setup.py lacks)."""
        log = self.root.parent / "logs" / f"venv-{safe_name(env.id)}.log"
        result, text = cmd.run_logged(argv, log, f"venv: {what}", extra_env=dict(environment))
        if not result.ok:
            raise BuildError(
                f"venv for {env.id}: {what} failed (exit {result.returncode})",
                why=pip_error(text),
                fix=f"fix the cause and rerun (the whole output is in {log}); nothing half-built was kept",
            )

    @staticmethod
    def _check(result: cmd.CmdResult, env: Env, what: str) -> None:
        layer_env.check_step(result, f"venv for {env.id}", what)

    def prepare_job(
        self, env: Env, prepared: Prepared, deps: jobdeps.JobDeps
    ) -> tuple[Prepared, LayerRecord]:
        """The job's packages (REQUIREMENTS=/PACKAGES=) as a layer over the env's venv
        (repro/engines/venv/joblayer.py); runs then use the layer's interpreter."""
        layer = joblayer.ensure_layer(
            Path(prepared.handle),
            deps,
            env_id=env.id,
            sources=self._sources(False),
            wheelhouse=self.wheelhouse.path,
            offline=self.wheelhouse.offline,
        )
        details = {
            **prepared.details,
            "python": str(layer.path / "bin" / "python"),
            "job_layer": str(layer.path),
        }
        # The base's own label: a DeepSpeed checkout's layer says which DeepSpeed it holds.
        label = f"{layer.path} (the job's packages over {prepared.label})"
        layered = Prepared(EngineKind.VENV, env.id, str(layer.path), label, layer.reused, details)
        return layered, layer.record(deps)

    # -- run ---------------------------------------------------------------------------------
    def run_suite(
        self, prepared: Prepared, args: Sequence[str], out_dir: Path, timeout_s: float | None
    ) -> SuiteRun:
        log = out_dir / SUITE_LOG
        result = self._run(prepared, SUITE_MODULE, args, out_dir, timeout_s, cwd=self.repo_root, tee=log)
        return SuiteRun(result.returncode, result.timed_out, result.duration_s, out_dir, log)

    def run_job(
        self,
        prepared: Prepared,
        args: Sequence[str],
        out_dir: Path,
        workdir: Path,
        timeout_s: float | None,
        *,
        network: bool = False,
    ) -> SuiteRun:
        """A custom command (repro/run/job.py): the in-env runner with the venv's Python, which
        puts the venv first on PATH and the startup hook on the job's PYTHONPATH. A venv cannot
        take the network away: `network` is for the Docker engine."""
        # The runner installs the hook's .pth (repro/workload/hookpth.py).
        extra = {"MICS_REPRO_HOOK_PTH": "1"}
        if os.environ.get("PYTHONPATH"):  # the user's own, for the job only (not the runner)
            extra["MICS_REPRO_USER_PYTHONPATH"] = os.environ["PYTHONPATH"]
        result = self._run(prepared, "repro.workload.job", args, out_dir, timeout_s, cwd=workdir, extra=extra)
        return SuiteRun(result.returncode, result.timed_out, result.duration_s, out_dir, out_dir / "job.log")

    def _run(
        self,
        prepared: Prepared,
        module: str,
        args: Sequence[str],
        out_dir: Path,
        timeout_s: float | None,
        *,
        cwd: Path,
        tee: Path | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> cmd.CmdResult:
        """`python -m MODULE *args --out OUT_DIR` with the venv's Python."""
        out_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        # Only the repo root: the venv must not see the host's site-packages through PYTHONPATH.
        env.update(extra or {}, PYTHONPATH=str(self.repo_root))
        # The whole environment reaches a venv run anyway; this names the GPU/NCCL part for the records.
        env.update(run_environment(os.environ, prepared.details.get("platform", "cpu")))
        argv = [str(Path(prepared.handle) / "bin" / "python"), "-m", module, *args, "--out", str(out_dir)]
        return cmd.run(argv, env=env, timeout_s=timeout_s, tee=tee, cwd=cwd)


def dry_run_text(env: Env) -> str:
    """What ENGINE=venv would build for `env` on this host (DRY_RUN): which Python and why, and
    the pins that differ from the image's; or why no Python here can hold it, and what to do."""
    try:
        built = VenvEngine(probe=_probe_known_first).resolve_env(env)
    except PythonVersionError as exc:
        said = (f"  {k}: {v}" for k, v in (("why", exc.why), ("fix", exc.fix)) if v)
        return "\n".join([f"venv (ENGINE=venv): {exc.what}", *said])
    assert built.python_choice is not None
    return f"venv (ENGINE=venv): {built.python_choice.describe()}"


_ERROR_LINE = re.compile(r"^\s*(\w+(\.\w+)*(Error|Exception)\b.*|ERROR: .*)$")


def pip_error(text: str, lines: int = 20) -> str:
    """The output of a failed pip run, ending with its most telling line: the last exception
    (`AttributeError: module 'torch.amp' has no attribute 'custom_fwd'`) or pip's own ERROR."""
    all_lines = text.rstrip().splitlines()
    tail = "\n".join(all_lines[-lines:])
    cause = next((ln.strip() for ln in reversed(all_lines) if _ERROR_LINE.match(ln)), None)
    return f"{tail}\n{cause}" if cause else (tail or "see the output above")


def _found_text(seen: Sequence[Interpreter], accepted: Sequence[str], broken: Sequence[str] = ()) -> str:
    """What the search found, for the error that says which Python to install instead."""
    if not seen and not broken:
        return "no python" + "/".join(accepted) + " on PATH"
    parts = list(broken)
    for interp in seen:
        too_new = accepted and preflight.minor_of(interp.minor) > preflight.minor_of(accepted[-1])
        direction = "too new" if too_new else "too old"
        parts.append(f"{interp.path} is Python {interp.version}, {direction}")
    return "; ".join(parts)


def _probe_known_first(path: str) -> Interpreter:
    """_probe, with this tool's own Python known without a process (a dry run starts none for it)."""
    if os.path.realpath(path) == os.path.realpath(sys.executable):
        return Interpreter(path, ".".join(map(str, sys.version_info[:3])))
    return _probe(path)


def _probe(path: str) -> Interpreter:
    result = cmd.run([path, "-c", _VERSION_PROBE], capture=True, echo=False)
    if not result.ok:
        raise PythonVersionError(f"could not run {path}", why=result.tail())
    version = result.stdout.strip()
    if not _VERSION.match(version):  # a wrapper script or another program: its pins cannot be chosen
        raise PythonVersionError(
            f"{path} is not a CPython interpreter this tool can use",
            why=f"asked for its version, it printed {version[:80]!r}",
            fix="pass the path of a CPython 3 interpreter with --python or MICS_REPRO_PYTHON",
        )
    return Interpreter(path, version)


SHARE_MIN_BYTES = 1 << 20


def share_identical_files(venv: Path, others: Sequence[Path], min_bytes: int = SHARE_MIN_BYTES) -> int:
    """Hard-link big files of a just-built venv to byte-identical files at the same path in other
    finished venvs (torch probes share gigabytes of nvidia-* libraries); returns bytes saved.

    Safe because a finished venv is never modified: a rebuild renames it away and deletes it,
    which leaves the other venv's link intact. Only venvs with a marker take part.
    """
    peers = [o for o in others if not o.name.startswith(".") and (o / MARKER).is_file() and o.is_dir()]
    saved = 0
    lib = venv / "lib"
    if not peers or not lib.is_dir():
        return 0
    for path in lib.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        st = path.stat()
        if st.st_size < min_bytes:
            continue
        rel = path.relative_to(venv)
        for peer in peers:
            other = peer / rel
            try:
                ost = other.stat()
            except OSError:
                continue
            same_kind = (ost.st_size, ost.st_dev, ost.st_mode) == (st.st_size, st.st_dev, st.st_mode)
            if ost.st_ino == st.st_ino or not same_kind or not filecmp.cmp(path, other, shallow=False):
                continue
            tmp = path.with_name(f".{path.name}.link")
            os.link(other, tmp)
            os.replace(tmp, path)
            saved += st.st_size
            break
    if saved:
        console.info(
            f"venv: {saved / 2**30:.1f} GiB of {venv.name} hard-linked to identical files of other venvs"
        )
    return saved


def remove_stale_temps(root: Path) -> list[Path]:
    """Delete half-built venvs that a killed run left behind (GBs each with torch); returns them.

    A build works in `.<venv>.<random>` (or swaps through `.<venv>.stale`) while it holds
    `.<venv>.lock`, and the kernel drops that lock when the builder dies, however it dies. So a
    temporary folder whose lock can be taken right now has no live builder; one whose lock is
    held is another invocation's build in progress and is left alone.
    """
    removed: list[Path] = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not path.name.startswith(".") or path.is_symlink() or not path.is_dir():
            continue
        owner = path.name[1:].rpartition(".")[0]
        if not owner:
            continue
        with lock_if_free(root / f".{owner}.lock", create=True) as free:
            if free:
                console.info(f"venv: removing {path} (left by an interrupted build; no build holds its lock)")
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed
