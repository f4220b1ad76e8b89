"""The files of a bundle besides the image: scrubbed copies, the final leak scan, sums, the archive."""

from __future__ import annotations

import contextlib
import json
import os
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from repro.core import png_text, safe_write
from repro.core.errors import LeakError, UsageError
from repro.core.paths import confined
from repro.core.scrub import Form, Scrubber, command_secret_error
from repro.upstream.bundle.manifest import MANIFEST

IMAGE_FILE = "image.tar.gz"
SUMS_FILE = "SHA256SUMS"


def copy_scrubbed(src: Path, dst: Path, scrubber: Scrubber) -> None:
    """`src` scrubbed as text into `dst`; a PNG loses its text chunks and keeps its pixels byte
    for byte (scrubbing compressed pixels as text would only break the image)."""
    data = src.read_bytes()
    dst.parent.mkdir(parents=True, exist_ok=True)
    if png_text.is_png(data):
        with contextlib.suppress(png_text.NotPNG):  # not a PNG after all: scrubbed as any other file
            dst.write_bytes(png_text.without_text(data))
            return
    try:
        text, codec = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, codec = data.decode("latin-1"), "latin-1"
    dst.write_bytes(scrubber.text(text, Form.for_path(src)).encode(codec))


def copy_results(
    results: Path, env_id: str, dest: Path, scrubber: Scrubber, data: Mapping[str, Any]
) -> list[str]:
    """results.json with only this env, and the env's folder (logs, artifacts), scrubbed.

    Returns what was not copied because it leads outside the results folder (a symlink, or an env
    id that climbs out): a bundle carries the run's files, never a file the results merely point at.
    """
    own = dict(data)
    own["envs"] = {env_id: data["envs"][env_id]}
    own["runs"] = [r for r in data["runs"] if r.get("env") == env_id]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "results.json").write_text(
        json.dumps(scrubber.data(own), indent=1, sort_keys=True, allow_nan=False) + "\n"
    )
    source = confined(results, env_id)
    if source is None:
        return [f"{env_id}/"]
    root = Path(results).resolve()
    skipped: list[str] = []
    for path in sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else []:
        if path.suffix == ".pid":
            continue  # process ids of a finished run: nothing for a reader, something about the host
        rel = path.relative_to(root)
        if confined(root, rel) is None:  # a symlink (or a linked folder) that leads out
            skipped.append(rel.as_posix())
            continue
        copy_scrubbed(path, dest / env_id / path.relative_to(source), scrubber)
    return skipped


WORKDIR_DIR = "workdir"
WORKDIR_MAX_BYTES = 50 << 20
WORKDIR_MAX_FILES = 5000
# The same folders the records' workdir digest leaves out (repro.run.job.workdir_digest).
_WORKDIR_SKIP = frozenset({".git", "__pycache__", ".venv", "results", ".mypy_cache"})


def workdir_files(src: Path) -> tuple[list[Path], str | None]:
    """The plain files of a custom command's working directory, or why it cannot travel."""
    if not src.is_dir():
        return [], f"{WORKDIR_DIR} left out: the folder the command ran in is not on this host"
    found: list[Path] = []
    total = 0
    for root, dirs, names in os.walk(src):  # never follows links: a link would pull in other files
        dirs[:] = sorted(d for d in dirs if d not in _WORKDIR_SKIP)
        for name in sorted(names):
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                continue
            found.append(path)
            total += path.stat().st_size
            if total > WORKDIR_MAX_BYTES or len(found) > WORKDIR_MAX_FILES:
                return [], (
                    f"{WORKDIR_DIR} left out: the folder the command ran in holds more than "
                    f"{WORKDIR_MAX_BYTES >> 20} MiB or {WORKDIR_MAX_FILES} files"
                )
    return found, None


def copy_workdir(src: Path, dest: Path, scrubber: Scrubber) -> str | None:
    """Scrubbed copies of the working directory's files under `dest`; None, or why it was left out
    (then the maintainer must supply the folder: verify-bundle's --workdir)."""
    files, why = workdir_files(src)
    if why is not None:
        return why
    dest.mkdir(parents=True, exist_ok=True)
    for path in files:
        copy_scrubbed(path, dest / path.relative_to(src), scrubber)
    return None


def artifact(folder: Path, env: Mapping[str, Any], name: str) -> str:
    """The text of one of the env's artifacts, read only from inside the results folder."""
    rel = (env.get("artifacts") or {}).get(name)
    path = confined(folder, str(rel)) if rel else None
    if rel and path is None:
        return f"({name} not read: its path leads outside the results folder)"
    return (
        path.read_text(errors="replace") if path is not None and path.is_file() else f"({name} not captured)"
    )


def scan(folder: Path, scrubber: Scrubber, skip: Sequence[str] = (IMAGE_FILE,)) -> None:
    """Refuse the bundle (LeakError) if any file still holds a value the scrubber knows, or a
    secret's shape (secret_shapes.VALUE_PATTERNS, whatever this host's environment holds); HTML
    also as a reader sees it. The image is skipped: it is gzip (no text to match) and holds only
    what the build put there (build-only files flattened out)."""
    found, commands = [], []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel in skip:
            continue
        # A file's name travels too (a log named after a token): checked like its content.
        text, form = readable_text(path), Form.for_path(path)
        shown = scrubber.text(rel)  # the message is shown, maybe in CI: never the value itself
        if scrubber.command_leaks(text, form) or scrubber.command_leaks(rel):
            commands.append(shown)
            continue
        hits = sorted(set(scrubber.leaks(text, form)) | set(scrubber.leaks(rel)))
        if hits:
            found.append(f"{shown}: {', '.join(hits)}")
    if commands:
        raise command_secret_error(commands)
    if found:
        raise LeakError(
            "the bundle would contain secrets or values from this host",
            why="; ".join(found),
            fix="report this as a bug of mics-repro with the kinds above (placeholders, not the values); "
            "nothing was handed out: the bundle folder was removed",
        )


def readable_text(path: Path) -> str:
    """What the leak check reads of a file: all of it as text; of a PNG, all but its pixel data
    (compressed pixels spell `key=...` now and then by chance, never a secret: png_text)."""
    data = path.read_bytes()
    if png_text.is_png(data):
        with contextlib.suppress(png_text.NotPNG):  # read whole, as any other file
            return png_text.readable_text(data)
    return data.decode("latin-1")


def write_sums(folder: Path, hashes: Mapping[str, str]) -> None:
    lines = [f"{digest}  {rel}" for rel, digest in sorted(hashes.items()) if rel not in (MANIFEST, SUMS_FILE)]
    (folder / SUMS_FILE).write_text("\n".join(lines) + "\n")


def archive_path(folder: Path) -> Path:
    return folder.with_name(folder.name + ".tar")


def check_archive_free(folder: Path) -> None:
    """The archive goes next to the bundle folder, as a new file: one already there (a link, or a
    file of the user's that happens to have that name) is refused before any work is done."""
    target = archive_path(folder)
    if os.path.lexists(target):
        raise UsageError(
            f"{target} already exists",
            why="the bundle's archive is written next to its folder and never replaces a file",
            fix="move it away, pass another OUT=, or --no-archive",
        )


def archive(folder: Path) -> Path:
    """<folder>.tar next to the folder: uncompressed (the image inside is already gzipped).
    Written to a new temp file and linked in place without replacing anything (never through a
    link at either name)."""
    check_archive_free(folder)
    target = archive_path(folder)
    tmp = target.with_name(f".{target.name}.{os.getpid()}-{os.urandom(4).hex()}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        with (
            os.fdopen(fd, "wb") as sink,
            tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            tar.add(folder, arcname=folder.name, filter=_normalise)
        safe_write.link_new(tmp, target)
    except FileExistsError:
        raise UsageError(
            f"{target} appeared while the archive was written", fix="move it away and run again"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # The archive must not carry the bundler's user and group names.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
