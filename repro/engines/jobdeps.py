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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.markers import Marker, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from repro.core.errors import UsageError
from repro.core.make_options import reproduce_pairs
from repro.core.smallfile import FileTooLarge, NotRegularFile, read_regular
from repro.workload.record import DepsRecord

CONSTRAINT_LINE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)$")


@dataclass(frozen=True)
class Requested:
    """One requirement: its line as pip reads it, and the name/specifier it asks for."""

    line: str  # local wheels: the absolute path of the file
    name: str  # canonical (PEP 503)
    specifier: str  # "" = any version; a local wheel: "==<its version>"
    url: bool = False  # `name @ url`: a version the index does not decide
    wheel: str | None = None  # a local wheel file
    marker: str | None = None  # `; python_version < "3.8"`: pip installs it only where this holds
    hashes: tuple[str, ...] = ()  # `--hash=sha256:...` options of a hashed requirements file

    def applies(self, python: str | None) -> bool:
        """Whether pip installs it under CPython `python` ("3.10"; None: this tool's own Python):
        a requirement whose environment marker is false there is skipped by pip, so it cannot
        move a pin there either."""
        if self.marker is None:
            return True
        where: dict[str, str] = {}
        if python is not None:
            parts = python.split(".")
            where = {
                "python_version": ".".join(parts[:2]),
                "python_full_version": ".".join((parts + ["0"])[:3]),
            }
        try:
            return Marker(self.marker).evaluate(where)
        except UndefinedEnvironmentName:  # a name pip sets itself (`extra`): checked as if it held
            return True

    def pip_line(self, path: str | None = None) -> str:
        """The line pip reads: `path` in place of a local wheel's own (relocated into an image),
        with its hashes, so pip checks every file it installs against them."""
        return " ".join([path or self.line, *(f"--hash={h}" for h in self.hashes)])


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
        for line in sorted(r.pip_line(Path(r.wheel).name if r.wheel else None) for r in self.requested):
            h.update(line.encode() + b"\0")
        for wheel in sorted(self.wheels):
            h.update(hashlib.sha256(Path(wheel).read_bytes()).digest())
        return h.hexdigest()[:12]

    def requirements_text(self, wheel_dir: str | None = None) -> str:
        """The requirements file pip gets; `wheel_dir` relocates local wheels (inside an image)."""
        lines = [
            r.pip_line(f"{wheel_dir.rstrip('/')}/{Path(r.wheel).name}" if (r.wheel and wheel_dir) else None)
            for r in self.requested
        ]
        return "".join(f"{line}\n" for line in lines)

    def describe(self) -> str:
        return " ".join(self.lines)

    def record(self) -> DepsRecord:
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
        for number, line in logical_lines(read_requirements(requirements)):
            where = f"REQUIREMENTS={requirements}, line {number}"
            text, hashes = _split_hashes(line, where)
            found.append(replace(_requested(text, path.resolve().parent, where, quote=False), hashes=hashes))
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
    _check_all_hashed(found)
    # PACKAGES as pip reads them (a local wheel by its absolute path), for the reproduce line.
    return JobDeps(
        tuple(found), requirements_file=given_file, packages=shlex.join(r.line for r in listed) or None
    )


# pip's comment: `#` at the start of a line or after whitespace, to the end of the line.
_COMMENT = re.compile(r"(^|\s+)#.*$")
# A per-requirement hash option, as pip takes it: `--hash=sha256:<hex>` or `--hash sha256:<hex>`.
_HASH = re.compile(r"--hash(?:=|\s+)((?:sha256|sha384|sha512):[0-9a-fA-F]+)")


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(number of its first line, text) for each requirement of a requirements file as pip reads
    it: a line ending in a backslash goes on in the next (hashed requirements put each `--hash` on
    a line of its own), a comment line ends the continuation, comments and blank lines are dropped."""
    held: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not held:
            start = number
        if raw.endswith("\\") and not _COMMENT.match(raw):
            held.append(raw[:-1])
            continue
        line = _COMMENT.sub("", "".join(held) + (" " + raw if held and _COMMENT.match(raw) else raw)).strip()
        held = []
        if line:
            yield start, line
    last = _COMMENT.sub("", "".join(held)).strip()  # the file ended on a backslash
    if last:
        yield start, last


def _split_hashes(line: str, where: str) -> tuple[str, tuple[str, ...]]:
    """A requirement line's text before its options, and its `--hash` values. pip reads options
    from the first word that starts with `-`; any option but --hash is refused by _requested."""
    words = line.split()
    first = next((i for i, word in enumerate(words) if word.startswith("-")), len(words))
    text, options = " ".join(words[:first]), " ".join(words[first:])
    if not text or not options:
        return line, ()
    hashes = tuple(m[1] for m in _HASH.finditer(options))
    if _HASH.sub("", options).strip():
        raise UsageError(
            f"{where}: pip options other than --hash are not taken here",
            why="packages come from PyPI and the lab's wheelhouse, with the env's packages as constraints",
            fix="keep the requirement and its --hash=sha256:... options only",
        )
    return text, hashes


def _check_all_hashed(found: Sequence[Requested]) -> None:
    """pip checks hashes for all requirements or none: once one has `--hash`, every requirement must
    be pinned with `==` and hashed (pip's hash-checking mode). Said here, before anything is built."""
    if not any(r.hashes for r in found):
        return
    bare = [r.name for r in found if not r.hashes or r.url or not r.specifier.startswith("==")]
    if bare:
        raise UsageError(
            f"REQUIREMENTS= has hashed requirements, but not {', '.join(bare)}",
            why="pip checks hashes for every requirement or none: with one --hash, each requirement "
            "(PACKAGES= too) must be pinned with == and carry its --hash",
            fix="add name==version --hash=sha256:... for each (pip-compile --generate-hashes writes "
            "them), or drop the hashes",
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
        return data.decode("utf-8-sig")  # a BOM (Windows editors write one) is not text
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
    marker = str(req.marker) if req.marker else None
    return Requested(text, canonicalize_name(req.name), str(req.specifier), url=bool(req.url), marker=marker)


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


def check_pins(deps: JobDeps, pins: Mapping[str, str], *, env_id: str, python: str | None = None) -> None:
    """Refuse (exit 2) a requirement that names a package the env holds at a version it excludes.
    `python`: the env's CPython ("3.10"), for environment markers; a requirement pip skips there
    (`torch==2.3.0; python_version < "3.8"`) moves nothing."""
    have = {str(canonicalize_name(k)): v for k, v in pins.items()}
    for req in deps.requested:
        pin = have.get(req.name)
        if pin is None or not req.applies(python):
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
    return reproduce_pairs({"REQUIREMENTS": deps.requirements_file, "PACKAGES": deps.packages})
