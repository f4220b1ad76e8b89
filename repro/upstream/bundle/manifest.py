"""manifest.json of a bundle: what is in it (sha256 of every file), how to run it, what to expect.

Written last by `repro.upstream.bundle.make`, read first by `repro.upstream.bundle.verify`. The expected
outcomes are copied from the records of the env's runs, keyed by run name, so a verification
compares like with like. Read back, a manifest is untrusted input: `manifest_problems` checks every
field against the grammar the matrix and the records use before any of it is used.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypedDict

from repro.core.errors import BundleError
from repro.matrix.compat import Platform
from repro.matrix.schema import env_id_problem
from repro.workload.record import (
    CPU_TRANSPORTS,
    CUSTOM_SCENARIO,
    DTYPES,
    OUTCOMES,
    PATCHES,
    SCENARIOS,
    SIGNATURES,
)

MANIFEST = "manifest.json"
KIND = "mics-repro-bundle"
SCHEMA = 1
# A manifest is untrusted input (a bundle comes from someone else): every field is checked before
# any of it names a file, a folder, an image or a container option.
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
_IMAGE_REF = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,127}:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_PIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # no newlines or terminal escapes in anything we print
_TIME_LIMIT = re.compile(r"^suite time limit (\S+) s$")
MAX_TEXT = 20_000
MAX_MANIFEST_BYTES = 4 << 20
MAX_FILE_BYTES = 512 << 20  # any file of a bundle but its image


@dataclass(frozen=True)
class Expected:
    run_name: str
    scenario: str
    patch: str
    dtype: str
    transport: str
    world_size: int
    outcome: str
    signature: str

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Expected:
        return cls(
            str(rec["run_name"]),
            str(rec["scenario"]),
            str(rec["patch"]),
            str(rec["dtype"]),
            str(rec["transport"]),
            # A custom command that never started a DeepSpeed engine has no world size on record.
            int(rec["world_size"]) if rec.get("world_size") is not None else 1,
            str(rec["outcome"]),
            str(rec["signature"]),
        )


# The manifest's "env": the env the runs and the image are of.
class BundleEnv(TypedDict):
    id: str
    platform: str
    pins: dict[str, str]
    derived_from: str | None


# The manifest's "image": the flattened image, saved and gzipped into the bundle (make.py).
class BundleImage(TypedDict):
    file: str
    ref: str
    id: str  # sha256:<64 hex>
    source_id: str  # the image the runs used
    flattened: bool
    removed: list[str]
    bytes: int
    uncompressed_bytes: int
    gzip_level: int
    sha256: str
    seconds: dict[str, float]  # {"flatten", "save_gzip"}
    base: str | None


# The manifest's "job": a user's own command, and how verify-bundle runs it again.
class JobBlock(TypedDict):
    command: str
    workdir: str | None  # a folder inside the bundle; null: left out, the verifier supplies one
    patches: list[str]
    transport: str
    loss_regex: str | None
    timeout_s: float
    stall_s: float


@dataclass(frozen=True)
class Manifest:
    tool_version: str
    created_at: str
    env: BundleEnv
    image: BundleImage
    suite_args: tuple[str, ...]
    commands: dict[str, str]
    expected: tuple[Expected, ...]
    files: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # A user's own command (scenario "custom" records); None for suite-only bundles.
    job: JobBlock | None = None

    def to_json(self) -> str:
        # asdict keeps tuples (of dicts, for `expected`): JSON writes them as lists
        return json.dumps({"kind": KIND, "schema": SCHEMA, **asdict(self)}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        try:
            # Only a regular file, and only so much of it: a FIFO or /dev/zero named manifest.json
            # must not block or fill the memory.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    raise BundleError(f"{path} is not a regular file", fix="copy the bundle again")
                raw = fh.read(MAX_MANIFEST_BYTES + 1)
        except FileNotFoundError:
            raise BundleError(
                f"{folder} has no {MANIFEST}",
                why="it is not a bundle made by `make bundle`",
                fix="pass BUNDLE=<the bundle folder or its .tar archive>",
            ) from None
        except OSError as exc:
            raise BundleError(f"{path} cannot be read", why=str(exc), fix="copy the bundle again") from None
        return cls.parse(raw, path)

    @classmethod
    def parse(cls, raw: bytes, path: Path) -> Manifest:
        """A manifest from its bytes (`path` only names it in messages); every field checked."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise BundleError(
                f"{path} is larger than {MAX_MANIFEST_BYTES} bytes", fix="copy the bundle again"
            )
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested past the parser
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise BundleError(f"{path} cannot be read", why=why, fix="copy the bundle again") from None
        if not isinstance(data, dict) or data.get("kind") != KIND or data.get("schema") != SCHEMA:
            raise BundleError(
                f"{path} is not a schema-{SCHEMA} bundle manifest",
                fix="make the bundle again with this version of the tool",
            )
        try:
            problems = manifest_problems(data)
        except RecursionError:
            problems = ["a field is nested too deeply"]
        if problems:
            raise BundleError(
                f"{path} is not a manifest this tool writes; nothing of it was used",
                why="; ".join(problems[:12]) + (f"; {len(problems) - 12} more" if len(problems) > 12 else ""),
                fix="only verify bundles made by `make bundle`; if this one was, make it again",
            )
        try:
            return cls(
                str(data["tool_version"]),
                str(data["created_at"]),
                data["env"],  # objects: manifest_problems checked each
                data["image"],
                tuple(data["suite_args"]),
                dict(data["commands"]),
                tuple(Expected(**e) for e in data["expected"]),
                dict(data["files"]),
                tuple(data.get("notes") or ()),
                data.get("job"),
            )
        except (KeyError, TypeError) as exc:
            raise BundleError(f"{path} lacks a field ({exc})", fix="make the bundle again") from None


def suite_time_limit(notes: Sequence[str]) -> float | None:
    """The suite's time limit in seconds, from the note `make bundle` writes (None: no note)."""
    return next((float(match[1]) for note in notes if (match := _TIME_LIMIT.match(note))), None)


def _text(value: Any, what: str, problems: list[str], limit: int = 500) -> bool:
    if not isinstance(value, str):
        problems.append(f"{what} is {type(value).__name__}, not a string")
    elif _CONTROL.search(value) or len(value) > limit:
        problems.append(f"{what} holds control characters or is longer than {limit} characters")
    else:
        return True
    return False


def safe_relpath(rel: str) -> bool:
    """A bundle file name: relative, forward slashes, no `..`, nothing hidden in it."""
    parts = PurePosixPath(rel).parts
    plain = not rel.startswith("/") and "\\" not in rel and not _CONTROL.search(rel)
    return bool(parts) and plain and all(p not in ("..", ".") for p in parts)


def _check_env(env: Any, problems: list[str]) -> None:
    if not isinstance(env, dict):
        problems.append("env is not an object")
        return
    if _text(env.get("id"), "env.id", problems, 200):
        problem = env_id_problem(env["id"])
        if problem:
            problems.append(f"env.id: {problem}")
    platforms = [p.value for p in Platform]
    if env.get("platform") not in platforms:
        got = str(env.get("platform"))[:40]
        problems.append(f"env.platform {got!r} is not one of {', '.join(platforms)}")
    derived = env.get("derived_from")
    if derived is not None and (
        not _text(derived, "env.derived_from", problems, 200) or env_id_problem(derived) or "+" in derived
    ):
        problems.append("env.derived_from is not the id of a named env")
    pins = env.get("pins")
    if not isinstance(pins, dict):
        problems.append("env.pins is not an object")
        return
    for name, value in pins.items():
        if not _PIN_NAME.match(str(name)):
            problems.append(f"env.pins has a key that is not a package or pin name: {str(name)[:40]!r}")
        else:
            _text(value, f"env.pins.{name}", problems)


def _check_image(image: Any, files: Any, problems: list[str]) -> None:
    if not isinstance(image, dict):
        problems.append("image is not an object")
        return
    name = image.get("file")
    if not (isinstance(name, str) and safe_relpath(name) and "/" not in name):
        problems.append("image.file is not a file name inside the bundle")
    elif isinstance(files, dict) and name not in files:
        problems.append(f"image.file {name} is not among the files the manifest lists")
    for key, grammar in (("id", _IMAGE_ID), ("ref", _IMAGE_REF)):
        if not (isinstance(image.get(key), str) and grammar.match(image[key])):
            what = "id (sha256:<64 hex>)" if key == "id" else "reference (name:tag)"
            problems.append(f"image.{key} is not a Docker image {what}")
    size = image.get("bytes")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        problems.append("image.bytes is not a size in bytes")


# The custom command's block: what `verify-bundle` hands the in-env job runner (repro.run.job).
JOB_FIELDS = frozenset(JobBlock.__annotations__)


def _seconds(value: Any) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and 0 < value <= 7 * 86400
    )


def _check_job(job: Any, files: Any, problems: list[str]) -> None:
    """The command is run by a shell in the container: one line, no control characters; the
    working directory is a folder inside the bundle (or null: left out, the verifier supplies it)."""
    if job is None:
        return
    if not isinstance(job, dict) or set(job) != JOB_FIELDS:
        problems.append(f"job does not have exactly the fields {', '.join(sorted(JOB_FIELDS))}")
        return
    if _text(job["command"], "job.command", problems, MAX_TEXT) and not job["command"].strip():
        problems.append("job.command is empty")
    workdir = job["workdir"]
    if workdir is not None:
        if not (isinstance(workdir, str) and safe_relpath(workdir)) or workdir == MANIFEST:
            problems.append("job.workdir is not a relative folder inside the bundle")
        elif isinstance(files, dict) and any(str(rel) == workdir for rel in files):
            problems.append("job.workdir names a file, not a folder")
    patches = job["patches"]
    if not (isinstance(patches, list) and patches and all(p in PATCHES for p in patches)):
        problems.append(f"job.patches is not a non-empty list of {', '.join(PATCHES)}")
    elif len(set(patches)) != len(patches):
        problems.append("job.patches repeats a patch")
    if job["transport"] not in CPU_TRANSPORTS:
        problems.append(f"job.transport is not one of {', '.join(CPU_TRANSPORTS)}")
    regex = job["loss_regex"]
    if regex is not None and _text(regex, "job.loss_regex", problems):
        try:
            re.compile(regex)
        except re.error:
            problems.append("job.loss_regex is not a regular expression")
    for key in ("timeout_s", "stall_s"):
        if not _seconds(job[key]):
            problems.append(f"job.{key} is not a positive number of seconds (at most a week)")


def _check_expected(expected: Any, problems: list[str], custom: bool = False) -> None:
    if not isinstance(expected, list) or not expected:
        problems.append("expected is not a non-empty list of runs")
        return
    closed = {
        # "custom" runs only come with the job block that says how to rerun them.
        "scenario": (*SCENARIOS, CUSTOM_SCENARIO) if custom else SCENARIOS,
        "patch": PATCHES,
        "dtype": DTYPES,
        "outcome": OUTCOMES,
        "signature": SIGNATURES,
        "transport": (*CPU_TRANSPORTS, "native"),
    }
    fields = {f for f in Expected.__dataclass_fields__}
    for index, run in enumerate(expected):
        where = f"expected[{index}]"
        if not isinstance(run, dict) or set(run) != fields:
            problems.append(f"{where} does not have exactly the fields {', '.join(sorted(fields))}")
            continue
        if not (isinstance(run["run_name"], str) and _RUN_NAME.match(run["run_name"])):
            problems.append(f"{where}.run_name is not a run name")
        for key, allowed in closed.items():
            if run[key] not in allowed:
                problems.append(f"{where}.{key} {str(run[key])[:40]!r} is not one of {', '.join(allowed)}")
        size = run["world_size"]
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 4096:
            problems.append(f"{where}.world_size is not a whole number of ranks")


def _check_suite_args(args: Any, env_id: Any, problems: list[str], custom: bool = False) -> None:
    if not isinstance(args, list) or not all(_text(a, "a suite argument", problems, MAX_TEXT) for a in args):
        problems.append("suite_args is not a list of single-line strings")
        return
    if custom and not args:
        return  # only the custom command's runs: no suite to run
    if any(a == "--out" or a.startswith("--out=") for a in args):
        problems.append("suite_args chooses the output folder (--out), which only the verifier decides")
    if "--env" not in args[:-1] or args[args.index("--env") + 1] != env_id:
        problems.append("suite_args does not run the env the manifest names (--env)")


def manifest_problems(data: Mapping[str, Any]) -> list[str]:
    """Everything wrong with a parsed manifest.json, checked against the grammar the matrix and
    the records use; empty when every field is one `make bundle` could have written."""
    problems: list[str] = []
    for key in ("tool_version", "created_at"):
        _text(data.get(key), key, problems, 100)
    _check_env(data.get("env"), problems)
    files = data.get("files")
    if not isinstance(files, dict) or not files:
        problems.append("files is not an object of file -> sha256")
    else:
        for rel, digest in files.items():
            if not safe_relpath(str(rel)) or rel == MANIFEST:
                problems.append(f"files names a path outside the bundle, or the manifest: {str(rel)[:80]!r}")
            elif not (isinstance(digest, str) and _SHA256.match(digest)):
                problems.append(f"files[{rel}] is not a sha256")
    _check_image(data.get("image"), files, problems)
    env_id = data["env"].get("id") if isinstance(data.get("env"), dict) else None
    custom = data.get("job") is not None
    _check_job(data.get("job"), files, problems)
    _check_suite_args(data.get("suite_args"), env_id, problems, custom)
    commands = data.get("commands")
    if not isinstance(commands, dict) or not all(
        _text(v, f"commands.{str(k)[:20]}", problems, MAX_TEXT) for k, v in commands.items()
    ):
        problems.append("commands is not an object of single-line strings")
    _check_expected(data.get("expected"), problems, custom)
    notes = data.get("notes") or []
    if not isinstance(notes, list) or not all(_text(n, "a note", problems) for n in notes):
        problems.append("notes is not a list of single-line strings")
    else:
        try:
            limit = suite_time_limit(notes)
        except ValueError:
            limit = math.nan
        if limit is not None and not (math.isfinite(limit) and limit > 0):
            problems.append("the suite time limit in notes is not a positive number of seconds")
    return problems


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_hashes(folder: Path, known: Mapping[str, str] | None = None) -> dict[str, str]:
    """sha256 of every regular file under `folder` by relative path; `known` avoids re-reading big ones."""
    return {rel: (known or {}).get(rel) or sha256_file(folder / rel) for rel in _listed(folder)}


def refuse_links(folder: Path) -> None:
    """A bundle holds plain files: a link would make us read (hash, load) a file outside it, and a
    FIFO or device would block (or never end) the read of whoever copies it (its workdir/)."""
    links = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*")) if p.is_symlink()]
    if links:
        raise BundleError(
            f"the bundle in {folder} holds symbolic links",
            why="; ".join(links[:12]),
            fix="only verify bundles made by `make bundle` (copy the folder without links)",
        )
    special = [
        p.relative_to(folder).as_posix()
        for p in sorted(folder.rglob("*"))
        if not (stat.S_ISREG(p.lstat().st_mode) or stat.S_ISDIR(p.lstat().st_mode))
    ]
    if special:
        raise BundleError(
            f"the bundle in {folder} holds special files (FIFOs, devices or sockets)",
            why="; ".join(special[:12]),
            fix="only verify bundles made by `make bundle`",
        )


def _listed(folder: Path) -> list[str]:
    """The regular files under `folder` but the manifest, by relative path, without reading them."""
    files = (p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*")) if p.is_file())
    return [rel for rel in files if rel != MANIFEST]


def check_files(folder: Path, manifest: Manifest, hashes: Mapping[str, str] | None = None) -> None:
    """Every listed file is present with its hash, and nothing unlisted was added; no links.

    `hashes`: the sha256 of files already computed while they were extracted (each file is read
    once). Sizes are checked before anything is hashed: the image exactly as the manifest states,
    every other file at most MAX_FILE_BYTES, so a huge (or sparse) file costs no hashing time."""
    refuse_links(folder)
    problems = []
    declared = manifest.image.get("bytes")
    for rel, want in sorted(manifest.files.items()):
        path = folder / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
            continue
        size = path.stat().st_size
        if rel == manifest.image.get("file"):
            if isinstance(declared, int) and size != declared:
                problems.append(f"{rel} differs from the manifest ({size} bytes, manifest says {declared})")
                continue
        elif size > MAX_FILE_BYTES:
            problems.append(f"{rel} is {size} bytes (at most {MAX_FILE_BYTES})")
            continue
        got = (hashes or {}).get(rel) or sha256_file(path)
        if got != want:
            problems.append(f"{rel} differs from the manifest")
    extra = sorted(set(_listed(folder)) - set(manifest.files))
    problems += [f"{rel} is not in the manifest" for rel in extra]
    if problems:
        raise BundleError(
            f"the bundle in {folder} does not match its manifest",
            why="; ".join(problems),
            fix="copy the bundle again, or make a new one with `make bundle`",
        )
