"""The env matrix: named environments from env_matrix/envs.toml, and envs derived from them.

`repro.matrix.schema.load_matrix()` reads and validates the file into a `Matrix` (this module holds
only the model, so the schema depends on it and never the other way). `Matrix.get()` returns a named
env, `Matrix.derive()` one with torch/DeepSpeed overridden. An `Env` knows every pin it installs and
the ordered pip steps that install them (`install_steps()`): the Dockerfile generator and the venv
engine both walk those steps, so an image and a venv of one env hold the same packages.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from repro.core import paths
from repro.core.errors import PythonVersionError, UnknownEnvError, UsageError
from repro.matrix import compat
from repro.matrix.compat import Platform
from repro.workload.device import HIDE_GPUS

__all__ = [
    "DEFAULT_MATRIX",
    "HIDE_GPUS",
    "PYPI_INDEX",
    "RECIPE",
    "Env",
    "InstallStep",
    "Matrix",
    "PinTables",
    "Platform",
    "PythonChoice",
]

DEFAULT_MATRIX = paths.DEFAULT_MATRIX
PYPI_INDEX = "https://pypi.org/simple"
# Revision of the install recipe (the steps below and the Dockerfile template). Part of pins(), so a
# change to how envs are built changes every pins_key and no stale image or venv is reused.
RECIPE = "2"  # 2: torch pinned with its build's local label; GPUs hidden with ROCR_VISIBLE_DEVICES too
DERIVED_DOCKERFILE_DIR = "build/docker"
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
TOOLING = ("pip", "setuptools", "wheel")  # installed first, into the fresh venv
# Where an env's torch comes from (envs.toml `torch_from`): its wheel index (every env of the lab's
# own matrix), or the Python the venv is made from, as that host has it installed (an air-gapped or
# HPC GPU host whose torch cannot be downloaded there; the venv engine only: docs/gpu-hosts.md).
TORCH_FROM_INDEX = "index"
TORCH_FROM_HOST = "host"
TORCH_FROM = (TORCH_FROM_INDEX, TORCH_FROM_HOST)
# DeepSpeed's setup.py (0.13.x) runs `nvcc` whenever torch sees a CUDA GPU; on a ROCm torch that sees
# one without ROCM_HOME (no /opt/rocm), its is_rocm_pytorch() answers False and it asks
# installed_cuda_version() instead, which raises MissingCUDAException (no CUDA_HOME). DS_BUILD_OPS=0
# skips neither. A host with only a driver must therefore hide its GPUs from the install step
# (venv engine, Dockerfiles, source overlays alike); `docker build` sees none anyway. HIDE_GPUS
# (repro/workload/device.py) says why it takes three variables.


@dataclass(frozen=True)
class InstallStep:
    """One `pip install` run. Steps run in order; each is one image layer."""

    name: str  # "tooling" | "torch" | "deepspeed-deps" | "deepspeed"
    specs: tuple[str, ...]
    index_url: str | None = None  # replaces the default index for this step (torch's wheel index)
    no_deps: bool = False
    no_build_isolation: bool = False
    environment: tuple[tuple[str, str], ...] = ()
    check: bool = False  # run `pip check` afterwards: proves the pinned closure is complete

    def pip_install_args(self, default_index: str = PYPI_INDEX) -> tuple[str, ...]:
        args: list[str] = ["install"]
        if self.index_url is not None:
            args += ["--index-url", self.index_url, "--extra-index-url", default_index]
        if self.no_deps:
            args.append("--no-deps")
        if self.no_build_isolation:
            args.append("--no-build-isolation")
        return (*args, *self.specs)


@dataclass(frozen=True)
class PinTables:
    """The version tables of envs.toml that do not belong to a single env."""

    pins: Mapping[str, str]
    pins_for_python: Mapping[str, Mapping[str, str]]
    pin_requires: Mapping[str, tuple[str, ...]]
    numpy1_below_torch: str
    numpy1: str

    def version(self, package: str, python: str) -> str:
        return self.pins_for_python.get(python, {}).get(package, self.pins[package])

    def oldest_python(self) -> str | None:
        """The oldest Python the tables have pins for: the oldest [pins_for_python] table. [pins]
        itself holds the newest releases, which need a newer Python, so an older one would be sent
        to pip with versions that do not install there (it fails as a misleading download error)."""
        return min(self.pins_for_python, key=compat.py_tuple, default=None)

    def serves(self, python: str) -> bool:
        oldest = self.oldest_python()
        return oldest is None or compat.py_tuple(python) >= compat.py_tuple(oldest)

    def numpy(self, torch: str, python: str) -> str:
        below = tuple(int(p) for p in self.numpy1_below_torch.split("."))
        if tuple(int(p) for p in compat.minor(torch).split(".")) < below:
            return self.numpy1
        return self.version("numpy", python)

    def closure(self, names: tuple[str, ...]) -> tuple[str, ...]:
        out: set[str] = set()
        todo = list(names)
        while todo:
            name = todo.pop()
            if name not in out:
                out.add(name)
                todo.extend(self.pin_requires.get(name, ()))
        return tuple(sorted(out))


@dataclass(frozen=True)
class PythonChoice:
    """The Python a venv of an env is made with, why, and the pins that differ from the image's
    for it (chosen from [pins_for_python], never asked of the network)."""

    python: str  # major.minor the pins are for
    image_python: str  # the env's `python` in envs.toml (its Docker image's)
    changed: tuple[tuple[str, str, str], ...] = ()  # (package, image's pin, this Python's pin)
    why: str = ""  # which interpreter it is and why it was picked (the venv engine says)

    def describe(self) -> str:
        text = f"Python {self.python}"
        if self.why:
            text += f" ({self.why})"
        if self.python == self.image_python:
            return text + ": the env's own Python, its pins as listed"
        if not self.changed:
            return (
                text + f"; the env's image uses {self.image_python}, and its pins hold for {self.python} too"
            )
        moves = ", ".join(f"{name} {old} -> {new}" for name, old, new in self.changed)
        return (
            text + f"; the env's image uses {self.image_python}, so the pins are chosen for {self.python}: "
            f"{moves} (env_matrix/envs.toml [pins_for_python])"
        )


@dataclass(frozen=True)
class Env:
    id: str
    platform: Platform
    base_image: str
    python: str
    torch: str
    torch_index: str | None
    deepspeed: str
    extra_pins: tuple[str, ...]  # torch-layer pins besides torch: numpy (by rule) + the env's own
    rocm: str | None
    cuda: str | None
    notes: str
    derived_from: str | None
    dockerfile: str  # repo-relative; for derived envs a generated file under build/docker/
    tooling: tuple[str, ...] = ()  # pip, setuptools, wheel
    deepspeed_deps: tuple[str, ...] = ()  # DeepSpeed's runtime deps and their closure, all pinned
    uncertain: tuple[str, ...] = field(default=(), compare=False)  # facts this env rests on unchecked
    # The version tables the pins were computed from, so a venv on another Python recomputes them
    # (for_python); None for an Env made by hand, which then keeps its pins.
    tables: PinTables | None = field(default=None, compare=False, repr=False)
    python_choice: PythonChoice | None = field(default=None, compare=False)  # set by for_python
    torch_from: str = TORCH_FROM_INDEX  # TORCH_FROM_HOST: the host Python's own torch, checked, not installed

    @property
    def host_torch(self) -> bool:
        """Whether torch (and what came with it, numpy...) is the host's, not installed by the tool."""
        return self.torch_from == TORCH_FROM_HOST

    @property
    def is_derived(self) -> bool:
        return self.derived_from is not None

    @property
    def image_python(self) -> str:
        return self.python_choice.image_python if self.python_choice else self.python

    def pythons(self) -> tuple[str, ...] | None:
        """Every CPython major.minor a venv of this env may be made with: torch has wheels for it
        (repro/matrix/compat.py) and the pin tables have versions for it. None: torch's range is
        not in the table (left to pip)."""
        span = compat.torch_pythons(self.torch)
        if span is None:
            return None
        low, high = compat.py_tuple(span[0]), compat.py_tuple(span[1])
        minors = (f"{low[0]}.{m}" for m in range(low[1], high[1] + 1))
        return tuple(p for p in minors if self.tables is None or self.tables.serves(p))

    def accepts(self, python: str) -> bool:
        """Whether a venv of this env may be made with CPython `python` (see pythons()); with
        torch's range unknown, only the pin tables decide."""
        accepted = self.pythons()
        if accepted is not None:
            return python in accepted
        return self.tables is None or self.tables.serves(python)

    def python_to_install(self) -> str:
        """The Python to suggest when the host has none of pythons(): the image's, the one the
        pins were made and checked with, unless it is not accepted (then the newest that is)."""
        accepted = self.pythons()
        if not accepted or self.image_python in accepted:
            return self.image_python
        return accepted[-1]

    def for_python(self, python: str, why: str = "") -> Env:
        """This env for a venv made with CPython `python` ("3.9"): the same torch and DeepSpeed,
        every other pin chosen for that Python from the tables. `why` says which interpreter."""
        image = self.image_python
        if python != self.python and self.tables is not None and not self.accepts(python):
            raise no_usable_python(self, f"Python {python}{f' ({why})' if why else ''}")
        moved = self._repinned(python)
        base = moved if python == image else self._repinned(image)
        mine, theirs = moved.package_pins(), base.package_pins()
        changed = tuple((n, theirs[n], v) for n, v in sorted(mine.items()) if theirs.get(n, v) != v)
        return replace(moved, python_choice=PythonChoice(python, image, changed, why))

    def _repinned(self, python: str) -> Env:
        if self.tables is None or python == self.python:
            return self  # no tables (an Env made by hand): its pins stay as given
        own = tuple(p for p in self.extra_pins if not p.startswith("numpy=="))
        tooling, extra, deps = compute_pins(
            self.tables, self.platform, python, self.torch, self.deepspeed, own
        )
        return replace(self, python=python, tooling=tooling, extra_pins=extra, deepspeed_deps=deps)

    def torch_requirements(self) -> list[str]:
        return [compat.torch_spec(self.torch, self.torch_index), *self.extra_pins]

    def torch_version(self) -> str | None:
        """The exact torch.__version__ the pin installs ("2.1.0+rocm5.6", PyPI's "2.1.0"); None
        when the index does not say which build it serves (only the public version is known)."""
        spec = compat.torch_spec(self.torch, self.torch_index)
        return spec.partition("==")[2].removeprefix("=") if "+" in spec or "===" in spec else None

    def requirements(self) -> list[str]:
        """pip specs for torch and everything DeepSpeed needs (not pip/setuptools nor DeepSpeed)."""
        return [*self.torch_requirements(), *self.deepspeed_deps]

    def install_steps(self) -> tuple[InstallStep, ...]:
        # A host torch is not installed: the host's is checked against the pin instead.
        torch = () if self.host_torch else tuple(self.torch_requirements())
        return (
            InstallStep("tooling", self.tooling),
            InstallStep("torch", torch, index_url=self.torch_index),
            InstallStep("deepspeed-deps", self.deepspeed_deps, no_deps=True, check=True),
            # DeepSpeed's setup.py imports torch, and its own ops stay unbuilt (JIT-compiled on use).
            InstallStep(
                "deepspeed",
                (f"deepspeed=={self.deepspeed}",),
                no_deps=True,
                no_build_isolation=True,
                environment=(("DS_BUILD_OPS", "0"), *HIDE_GPUS),
            ),
        )

    def package_pins(self) -> dict[str, str]:
        """Every installed package -> exact version (torch and DeepSpeed included)."""
        out: dict[str, str] = {}
        if self.host_torch:  # not installed, still pinned: the host's must be this one
            out["torch"] = compat.split_pin(compat.torch_spec(self.torch, self.torch_index))[1]
        for step in self.install_steps():
            for spec in step.specs:
                name, version = compat.split_pin(spec)
                out[name] = version
        return out

    def pins(self) -> dict[str, str]:
        """Every pin: the stack (base image, Python, wheel index, ROCm/CUDA) and every package."""
        out = {
            "recipe": RECIPE,
            "platform": self.platform.value,
            "base_image": self.base_image,
            "python": self.python,
            "torch_index": self.torch_index or PYPI_INDEX,
        }
        if self.rocm is not None:
            out["rocm"] = self.rocm
        if self.cuda is not None:
            out["cuda"] = self.cuda
        if self.host_torch:  # only then: every other env keeps its pins_key (and venv, image)
            out["torch_from"] = self.torch_from
            out["torch_build"] = self.torch_version() or self.torch
        out.update(self.package_pins())
        return dict(sorted(out.items()))

    def pins_key(self) -> str:
        blob = json.dumps(self.pins(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def image_tag(self) -> str:
        return f"mics-repro:{_TAG_UNSAFE.sub('-', self.id)}-{self.pins_key()}"


def no_usable_python(env: Env, found: str) -> PythonVersionError:
    """No interpreter on this host can hold `env`'s venv: which Python to install, and how."""
    accepted = env.pythons() or ()
    want = env.python_to_install()
    span = compat.torch_pythons(env.torch)
    torch_range = (
        f"torch {compat.minor(env.torch)} has wheels for CPython {span[0]} to {span[1]}" if span else ""
    )
    oldest = env.tables.oldest_python() if env.tables else None
    pins_range = f"the pins in env_matrix/envs.toml start at Python {oldest}" if oldest else ""
    return PythonVersionError(
        f"no usable Python for env {env.id} (torch {env.torch} and its pins): {found}",
        why="; ".join(p for p in (torch_range, pins_range) if p)
        + (f"; accepted: {', '.join(accepted)}" if accepted else ""),
        fix=f"install Python {want} (`uv python install {want}`, or your distribution's python{want}) and "
        f"rerun with MICS_REPRO_PYTHON=$(uv python find {want}) (or --python /path/to/python{want}); "
        "or use ENGINE=docker, whose image brings its own Python",
    )


def named_dockerfile(env_id: str) -> str:
    return f"docker/{env_id}.Dockerfile"


def derived_dockerfile(env_id: str) -> str:
    return f"{DERIVED_DOCKERFILE_DIR}/{_TAG_UNSAFE.sub('-', env_id)}.Dockerfile"


def compute_pins(
    tables: PinTables,
    platform: Platform,
    python: str,
    torch: str,
    deepspeed: str,
    own: tuple[str, ...],
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(tooling, extra_pins, deepspeed_deps) for a stack; `own` are the env's own extra pins."""
    tooling = tuple(f"{n}=={tables.version(n, python)}" for n in tables.closure(TOOLING))
    extra = (f"numpy=={tables.numpy(torch, python)}", *own)
    names = tables.closure(compat.deepspeed_packages(deepspeed, platform))
    deps = tuple(f"{n}=={tables.version(n, python)}" for n in names)
    return tooling, extra, deps


class Matrix:
    """Mapping-like: named env id -> Env, plus derived envs on request (`get`, `derive`)."""

    def __init__(self, path: Path, default_id: str, envs: Mapping[str, Env], tables: PinTables) -> None:
        self.path = path
        self.default_id = default_id
        self.tables = tables
        self._envs = dict(envs)

    def __getitem__(self, env_id: str) -> Env:
        return self.get(env_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._envs)

    def __len__(self) -> int:
        return len(self._envs)

    def __contains__(self, env_id: object) -> bool:
        return env_id in self._envs

    def ids(self) -> list[str]:
        return list(self._envs)

    def default(self) -> Env:
        return self._envs[self.default_id]

    def get(self, env_id: str) -> Env:
        """A named env, or a derived one spelt "BASE+torchX+dsY" (as results records name them)."""
        if env_id in self._envs:
            return self._envs[env_id]
        if "+" in env_id:
            base, torch, deepspeed = parse_derived_id(env_id)
            if base in self._envs:
                return self.derive(base, torch=torch, deepspeed=deepspeed)
        raise unknown_env(env_id, self.ids(), self.path)

    def derive(self, env_id: str, torch: str | None = None, deepspeed: str | None = None) -> Env:
        """`env_id` with torch and/or DeepSpeed replaced; pins and wheel index recomputed."""
        base = self.get(env_id)
        torch = _override("TORCH", torch, base.torch)
        deepspeed = _override("DEEPSPEED", deepspeed, base.deepspeed)
        if torch == base.torch and deepspeed == base.deepspeed:
            return base
        root = base.derived_from or base.id
        parts = [root]
        if torch != self._envs[root].torch:
            parts.append(f"torch{torch}")
        if deepspeed != self._envs[root].deepspeed:
            parts.append(f"ds{deepspeed}")
        new_id = "+".join(parts)
        if new_id == root:
            return self._envs[root]
        supported = compat.torch_supports_python(torch, base.python)
        if supported is False:
            low, high = compat.torch_pythons(torch) or ("?", "?")
            raise PythonVersionError(
                f"torch {torch} has no wheels for Python {base.python}, the Python of env '{root}'",
                why=f"torch {compat.minor(torch)} wheels exist for CPython {low} to {high}",
                fix="pick a torch release for that Python, or derive from an env with another Python",
            )
        index, notes, uncertain = self._derived_index(base, torch)
        own = tuple(p for p in base.extra_pins if not p.startswith("numpy=="))
        tooling, extra, deps = compute_pins(self.tables, base.platform, base.python, torch, deepspeed, own)
        change = ", ".join(
            f"{what} {old} -> {new}"
            for what, old, new in (("torch", base.torch, torch), ("deepspeed", base.deepspeed, deepspeed))
            if old != new
        )
        if not compat.has_mics(deepspeed):
            notes.append(f"DeepSpeed {deepspeed} has no MiCS: MiCS runs are expected to be unsupported.")
        if supported is None:
            notes.append(f"torch {torch}'s Python support is not in repro/matrix/compat.py: not checked.")
            uncertain = (*uncertain, "python support")
        return replace(
            base,
            id=new_id,
            torch=torch,
            deepspeed=deepspeed,
            torch_index=index,
            extra_pins=extra,
            tooling=tooling,
            deepspeed_deps=deps,
            derived_from=root,
            dockerfile=derived_dockerfile(new_id),
            notes=" ".join([f"Derived from {root} ({change}).", *notes]),
            uncertain=uncertain,
        )

    def _derived_index(self, base: Env, torch: str) -> tuple[str | None, list[str], tuple[str, ...]]:
        if base.platform is Platform.CPU:
            return base.torch_index, [], ()
        have = base.rocm if base.platform is Platform.ROCM else base.cuda
        index = compat.pick_index(base.platform, torch, have)
        if index is None:
            raise UsageError(
                f"no {base.platform.label} wheel index is known for torch {torch}",
                why="repro/matrix/compat.py lists which PyTorch index carries each torch release "
                f"for {base.platform.value}, and torch {compat.minor(torch)} is not in it",
                fix="pick a listed torch release (env_matrix/README.md), "
                "or add the index to repro/matrix/compat.py",
            )
        notes: list[str] = []
        uncertain: tuple[str, ...] = ()
        if (
            index.platform_version is not None
            and have is not None
            and not compat.same_minor(index.platform_version, have)
        ):
            notes.append(
                f"torch {torch} is built for {base.platform.label} {index.platform_version}; "
                f"the base image has {have}."
            )
        if not index.certain:
            notes.append(f"That torch {torch} is on the {index.tag} index is likely, not checked.")
            uncertain = ("wheel index",)
        return index.url, notes, uncertain


_DERIVED = re.compile(r"^(?P<base>[^+]+)(?:\+torch(?P<torch>[^+]+))?(?:\+ds(?P<ds>[^+]+))?$")


def parse_derived_id(env_id: str) -> tuple[str, str | None, str | None]:
    match = _DERIVED.match(env_id)
    if match is None:
        return env_id, None, None
    return match["base"], match["torch"], match["ds"]


def _override(name: str, value: str | None, current: str) -> str:
    if value is None or value == "":
        return current
    from packaging.version import InvalidVersion, Version

    try:
        parsed = Version(value)
    except InvalidVersion:
        raise UsageError(
            f"{name}={value} is not a version", fix=f"give a release number, e.g. {name}={current}"
        ) from None
    if parsed.local is not None:
        raise UsageError(
            f"{name}={value} names a local build",
            why="the wheel index is chosen from the platform; the local label (+rocm..., +cpu) follows it",
            fix=f"drop the label: {name}={parsed.public}",
        )
    return str(parsed)


def unknown_env(env_id: str, valid: list[str], path: Path) -> UnknownEnvError:
    import difflib

    close = difflib.get_close_matches(env_id, valid, n=1, cutoff=0.5)
    fix = f"did you mean '{close[0]}'?" if close else "use one of the ids above"
    return UnknownEnvError(
        f"no env named '{env_id}' in {path}",
        why=f"valid envs: {', '.join(valid)}",
        fix=fix,
    )
