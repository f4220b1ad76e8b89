"""A custom job's own packages (`REQUIREMENTS=path`, `PACKAGES="a==1 b"`): what they are, and
whether they may go over an env.

Real jobs need packages beyond torch and DeepSpeed (transformers, accelerate, a company's own
trainer). Engines install them as a layer over the env (venv: repro/engines/venv/joblayer.py;
Docker: an image FROM the env's, repro/engines/docker/joblayer.py) with every package the env
holds as a pip constraint, so torch, DeepSpeed, numpy and the rest stay exactly as they are. A
requirement that names one of those at another version is refused here, before anything is
installed (`check_pins`, exit 2); pip refuses the same for indirect requirements while resolving,
which is also before anything is installed.

Pure: parsing and checks only; the engines run pip.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from repro.core.errors import UsageError
from repro.core.smallfile import FileTooLarge, NotRegularFile, read_regular

CONSTRAINT_LINE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)$")


@dataclass(frozen=True)
class Requested:
    """One requirement: its line as pip reads it, and the name/specifier it asks for."""

    line: str  # local wheels: the absolute path of the file
    name: str  # canonical (PEP 503)
    specifier: str  # "" = any version; a local wheel: "==<its version>"
    url: bool = False  # `name @ url`: a version the index does not decide
    wheel: str | None = None  # a local wheel file


@dataclass(frozen=True)
class JobDeps:
    """What the job asked for, from REQUIREMENTS= and/or PACKAGES=."""

    requested: tuple[Requested, ...]
    requirements_file: str | None = None  # as given (the reproduce line repeats it)
    packages: str | None = None

    @property
    def lines(self) -> tuple[str, ...]:
        return tuple(r.line for r in self.requested)

    @property
    def wheels(self) -> tuple[str, ...]:
        return tuple(r.wheel for r in self.requested if r.wheel)

    def digest(self) -> str:
        """Names the layer: the sorted lines, and the bytes of every local wheel. A local wheel's
        line counts by its file name, not its folder: the same wheel from another folder (a
        fresh checkout, a temp dir) installs the same layer, so it is reused, not rebuilt."""
        h = hashlib.sha256()
        for line in sorted(Path(r.wheel).name if r.wheel else r.line for r in self.requested):
            h.update(line.encode() + b"\0")
        for wheel in sorted(self.wheels):
            h.update(hashlib.sha256(Path(wheel).read_bytes()).digest())
        return h.hexdigest()[:12]

    def requirements_text(self, wheel_dir: str | None = None) -> str:
        """The requirements file pip gets; `wheel_dir` relocates local wheels (inside an image)."""
        lines = [
            f"{wheel_dir.rstrip('/')}/{Path(r.wheel).name}" if (r.wheel and wheel_dir) else r.line
            for r in self.requested
        ]
        return "".join(f"{line}\n" for line in lines)

    def describe(self) -> str:
        return " ".join(self.lines)

    def record(self) -> dict[str, object]:
        return {
            "requirements_file": self.requirements_file,
            "packages": self.packages,
            "lines": list(self.lines),
            "digest": self.digest(),
        }


def parse(requirements: str | None, packages: str | None, *, cwd: Path | None = None) -> JobDeps | None:
    """REQUIREMENTS= (a requirements file) and PACKAGES= (a space-separated list); None if neither."""
    if not requirements and not (packages or "").strip():
        return None
    found: list[Requested] = []
    given_file = None
    if requirements:
        path = Path(requirements).expanduser()
        for number, raw in enumerate(read_requirements(requirements).splitlines(), 1):
            line = raw.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                where = f"REQUIREMENTS={requirements}, line {number}"
                found.append(_requested(line, path.resolve().parent, where, quote=False))
        given_file = str(path.resolve())  # absolute: a reproduce line works from any folder
    try:
        words = shlex.split(packages or "")
    except ValueError as exc:  # an unclosed quote: `PACKAGES="'six"`
        raise UsageError(
            f"PACKAGES={packages} cannot be split into packages",
            why=f"{exc} (it is split like a shell command line)",
            fix='close the quote, or drop it: PACKAGES="six numpy==1.26"',
        ) from None
    listed = [_requested(word, (cwd or Path.cwd()).resolve(), "PACKAGES=") for word in words]
    found += listed
    if not found:
        raise UsageError(
            f"REQUIREMENTS={requirements} names no package",
            fix="list one package a line, or drop REQUIREMENTS=",
        )
    # PACKAGES as pip reads them (a local wheel by its absolute path), for the reproduce line.
    return JobDeps(
        tuple(found), requirements_file=given_file, packages=shlex.join(r.line for r in listed) or None
    )


# A requirements file is a few hundred bytes; REQUIREMENTS=/dev/zero or a 200 MB file is a mistake.
REQUIREMENTS_LIMIT = 1 << 20
_FILE_FIX = "give a requirements file (one package a line, as for pip install -r)"


def read_requirements(given: str) -> str:
    """The text of REQUIREMENTS=: a regular file of at most REQUIREMENTS_LIMIT bytes, read with
    that cap, and not a link that leads out of its own folder (a link planted in a project as
    `requirements.txt -> /etc/shadow` would otherwise reach pip and the error messages). Errors
    name the file and what is wrong with it, never what it holds."""
    path = Path(given).expanduser()
    if path.is_symlink():
        target, home = path.resolve(), path.parent.resolve()
        if not target.is_relative_to(home):
            raise UsageError(
                f"REQUIREMENTS={given} is a link to a file outside its folder",
                why="a requirements file that leads elsewhere is not read (it may be planted)",
                fix="give the file it points to by its own path, or copy it next to the link",
            )
    try:
        data = read_regular(path, REQUIREMENTS_LIMIT)
    except FileNotFoundError:
        raise UsageError(f"REQUIREMENTS={given} does not exist", fix=_FILE_FIX) from None
    except NotRegularFile:
        raise UsageError(
            f"REQUIREMENTS={given} is not a regular file (a folder, FIFO, device or socket)", fix=_FILE_FIX
        ) from None
    except FileTooLarge:
        raise UsageError(
            f"REQUIREMENTS={given} is larger than {REQUIREMENTS_LIMIT // 1024} KiB",
            why="a requirements file lists packages, one a line",
            fix=_FILE_FIX,
        ) from None
    except OSError as exc:
        raise UsageError(f"REQUIREMENTS={given} cannot be read: {exc.strerror}", fix=_FILE_FIX) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"REQUIREMENTS={given} is not UTF-8 text", fix=_FILE_FIX) from None


def _requested(text: str, base: Path, where: str, *, quote: bool = True) -> Requested:
    """One requirement. `quote`: the text may be shown in errors (PACKAGES=, which the user typed);
    a file's lines are named by their number only (see read_requirements)."""
    shown = f" {text!r}" if quote else ""
    if text.startswith("-"):
        raise UsageError(
            f"{where}:{shown} pip options are not taken here",
            why="packages come from PyPI and the lab's wheelhouse, with the env's packages as constraints",
            fix="list packages only (name, name==version, or a path to a .whl file); "
            "put a local wheel's path on its own line",
        )
    if text.endswith(".whl") and "@" not in text and "://" not in text:  # a local wheel file
        wheel = (base / Path(text).expanduser()).resolve()
        try:
            name, version, _, _ = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename as exc:
            raise UsageError(
                f"{where}:{shown} {exc if quote else 'not a wheel file name'}",
                fix="give a wheel file named as pip names them",
            ) from None
        if not wheel.is_file():
            raise UsageError(
                f"{where}: the wheel{f' {wheel}' if quote else ''} does not exist",
                fix="build it first, or fix the path",
            )
        return Requested(str(wheel), str(name), f"=={version}", wheel=str(wheel))
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise UsageError(
            f"{where}:{shown} is not a requirement" + (f": {exc}" if quote else ""),
            fix="e.g. transformers==4.36.2" + ("" if quote else " (open the file at that line)"),
        ) from None
    return Requested(text, canonicalize_name(req.name), str(req.specifier), url=bool(req.url))


def pins_from_freeze(text: str) -> dict[str, str]:
    """`pip freeze --all` -> {canonical name: version} for its `name==version` lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = CONSTRAINT_LINE.match(line.strip())
        if m:
            out[str(canonicalize_name(m["name"]))] = m["version"]
    return out


def constraints(pins: Mapping[str, str]) -> str:
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def check_pins(deps: JobDeps, pins: Mapping[str, str], *, env_id: str) -> None:
    """Refuse (exit 2) a requirement that names a package the env holds at a version it excludes."""
    have = {str(canonicalize_name(k)): v for k, v in pins.items()}
    for req in deps.requested:
        pin = have.get(req.name)
        if pin is None:
            continue
        moves = req.url or not SpecifierSet(req.specifier).contains(pin, prereleases=True)
        if moves:
            raise UsageError(
                f"the job's requirement {req.line!r} would move {env_id}'s pin {req.name}=={pin}",
                why="the env's packages (torch, DeepSpeed, numpy and everything they need) stay exactly "
                "as they are: the job's packages are installed over them with them as constraints; "
                "nothing was installed",
                fix=f"drop {req.name} from the job's requirements (the env has {req.name}=={pin}), "
                "or pick an env that pins a version the job accepts (`make list`)",
            )


def new_packages(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, str]:
    """Packages the layer added; raises nothing: `moved` says what changed."""
    return {name: version for name, version in sorted(after.items()) if name not in before}


def moved(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """`name before -> after` for every package of `before` the layer shows at another version."""
    return [
        f"{name} {version} -> {after.get(name)}"
        for name, version in sorted(before.items())
        if after.get(name) != version
    ]


def line_pairs(deps: JobDeps | None) -> Iterable[tuple[str, object]]:
    """REQUIREMENTS/PACKAGES for a reproduce line (repro/core/makeline.py)."""
    if deps is None:
        return []
    return [("REQUIREMENTS", deps.requirements_file), ("PACKAGES", deps.packages)]
