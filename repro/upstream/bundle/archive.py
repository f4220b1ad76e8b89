"""Open a bundle archive from someone else without letting it exhaust the host.

Order: read every member's header (no data written; names, types, counts and declared sizes
checked against hard limits, sparse members refused), read and check manifest.json first, check
the member list against the manifest (every file listed, nothing else, the image exactly the
size the manifest states, every other file and their total within limits, the whole within the
free disk space), and only then extract, hashing each file while it is written: each byte is read
once, and check_files compares those hashes instead of reading the files again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from repro.core.errors import BundleError
from repro.core.printable import printable
from repro.upstream.bundle.manifest import MANIFEST, MAX_FILE_BYTES, MAX_MANIFEST_BYTES, Manifest

MAX_MEMBERS = 20_000  # a bundle: a few dozen files, plus a workdir of at most 5000
MAX_OTHER_TOTAL = 2 << 30  # all files but the image together
MAX_IMAGE_BYTES = 256 << 30  # the gzipped image, whatever its manifest says
FREE_MARGIN = 1 << 30  # disk space left free after extraction
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Loaded:
    folder: Path
    manifest: Manifest
    hashes: dict[str, str]  # sha256 of each extracted file (empty for a folder bundle: hashed later)


def _refuse(what: str, why: str = "") -> BundleError:
    return BundleError(what, why=why, fix="only verify bundles made by `make bundle`")


def _headers(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Every member's header, checked; nothing is extracted here."""
    members: list[tarfile.TarInfo] = []
    total = 0
    for member in tar:
        name = PurePosixPath(member.name)
        shown = printable(member.name)
        if (
            name.is_absolute()
            or not name.parts
            or ".." in name.parts
            or not (member.isfile() or member.isdir())
        ):
            raise _refuse(f"the archive holds an unsafe entry: {shown}")
        member.name = "/".join(name.parts)  # one spelling ("./b/x" is "b/x") for every check below
        if member.issparse():
            raise _refuse(
                f"the archive holds a sparse entry: {shown}",
                why="a sparse member declares gigabytes that the archive does not hold",
            )
        limit = MAX_IMAGE_BYTES if len(name.parts) <= 2 else MAX_FILE_BYTES  # the image is top-level
        total += member.size
        if member.size > limit or total > MAX_IMAGE_BYTES + MAX_OTHER_TOTAL:
            raise _refuse(
                f"the archive entry {shown} is larger than a bundle holds",
                why=f"{member.size} bytes declared, {total} bytes so far; at most {limit} per file",
            )
        members.append(member)
        if len(members) > MAX_MEMBERS:
            raise _refuse(f"the archive holds more than {MAX_MEMBERS} entries")
    return members


def _manifest(tar: tarfile.TarFile, members: list[tarfile.TarInfo], top: str, where: Path) -> Manifest:
    entry = next((m for m in members if m.name.rstrip("/") == f"{top}/{MANIFEST}" and m.isfile()), None)
    if entry is None:
        raise BundleError(
            f"{where.name} has no {top}/{MANIFEST}",
            why="it is not a bundle made by `make bundle`",
            fix="pass BUNDLE=<the bundle folder or its .tar archive>",
        )
    if entry.size > MAX_MANIFEST_BYTES:
        raise _refuse(f"{MANIFEST} in {where.name} is {entry.size} bytes (at most {MAX_MANIFEST_BYTES})")
    handle = tar.extractfile(entry)
    data = handle.read(MAX_MANIFEST_BYTES + 1) if handle is not None else b""
    return Manifest.parse(data, where / top / MANIFEST)


def _check_against(members: Iterable[tarfile.TarInfo], top: str, manifest: Manifest, dest: Path) -> None:
    files = {m.name[len(top) + 1 :]: m for m in members if m.isfile() and m.name.startswith(top + "/")}
    files.pop(MANIFEST, None)
    problems = [
        f"{printable(rel)} is not in the manifest" for rel in sorted(set(files) - set(manifest.files))
    ]
    problems += [f"{rel} is missing" for rel in sorted(set(manifest.files) - set(files))]
    image = str(manifest.image.get("file"))
    declared = manifest.image.get("bytes")
    others = 0
    for rel, member in sorted(files.items()):
        if rel == image:
            if isinstance(declared, int) and member.size != declared:
                problems.append(f"{rel} is {member.size} bytes, the manifest says {declared}")
        elif member.size > MAX_FILE_BYTES:
            problems.append(f"{printable(rel)} is {member.size} bytes (at most {MAX_FILE_BYTES})")
        else:
            others += member.size
    if others > MAX_OTHER_TOTAL:
        problems.append(f"the files besides the image hold {others} bytes (at most {MAX_OTHER_TOTAL})")
    if problems:
        raise BundleError(
            "the archive does not match its manifest; nothing was extracted",
            why="; ".join(problems[:12]) + (f"; {len(problems) - 12} more" if len(problems) > 12 else ""),
            fix="copy the bundle again, or make a new one with `make bundle`",
        )
    need = sum(m.size for m in files.values())
    free = shutil.disk_usage(dest).free
    if need + FREE_MARGIN > free:
        raise BundleError(
            f"extracting the bundle needs {need / 1e9:.1f} GB; {dest} has {free / 1e9:.1f} GB free",
            fix="free some disk space (or set TMPDIR to a larger disk) and try again",
        )


def _extract(
    tar: tarfile.TarFile, members: Iterable[tarfile.TarInfo], dest: Path, top: str
) -> dict[str, str]:
    hashes: dict[str, str] = {}
    for member in members:
        target = dest.joinpath(*PurePosixPath(member.name).parts)
        if member.isdir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        source = tar.extractfile(member)
        digest = hashlib.sha256()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as sink:
            left = member.size
            while source is not None and left > 0:
                block = source.read(min(_CHUNK, left))
                if not block:
                    break
                digest.update(block)
                sink.write(block)
                left -= len(block)
        hashes[member.name[len(top) + 1 :]] = digest.hexdigest()
    return hashes


def load_archive(path: Path, dest: Path) -> Loaded:
    """The bundle inside a .tar (optionally compressed) archive, checked, then extracted under `dest`."""
    try:
        with tarfile.open(path, "r:*") as tar:
            members = _headers(tar)
            tops = sorted({PurePosixPath(m.name).parts[0] for m in members if PurePosixPath(m.name).parts})
            if len(tops) != 1 or tops[0] in (".", ""):
                found = ", ".join(printable(t) for t in tops) or "nothing"
                if {"manifest.json", "repositories"} <= set(tops):  # what `docker save` writes
                    raise BundleError(
                        f"{path.name} is a Docker image archive (the bundle's image.tar.gz?), not a bundle",
                        fix="pass the bundle: its folder, or the .tar `make bundle` wrote beside it "
                        "(it prints `verify: make verify-bundle BUNDLE=...`)",
                    )
                raise BundleError(f"{path.name} should hold one bundle folder, found {found}")
            top = tops[0]
            manifest = _manifest(tar, members, top, path)
            _check_against(members, top, manifest, dest)
            wanted = [m for m in members if m.name.rstrip("/") != f"{top}/{MANIFEST}"]
            hashes = _extract(tar, wanted, dest, top)
            manifest_entry = next(m for m in members if m.name.rstrip("/") == f"{top}/{MANIFEST}")
            _extract(tar, [manifest_entry], dest, top)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleError(
            f"{path.name} is not a readable bundle archive",
            why=printable(f"{type(exc).__name__}: {exc}"),
            fix="copy it again (the archive is truncated or corrupt) or use the bundle folder",
        ) from None
    return Loaded(dest / top, manifest, hashes)
