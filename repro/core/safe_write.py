"""The one door for writing into a folder the user chose (OUT=, a results folder, results/).

The rule every writer follows: it writes only inside a folder it made, was given empty, or wrote
before (a marker file of its own is there), never through a symbolic link below that folder, and it
replaces or removes only files it wrote itself (the caller says which: a manifest of what it wrote,
or a name that is its own in its own folder). Anything else is a UsageError (exit 2) naming the
path, so `OUT=~` or a linked `plots/` costs the user nothing.

Paths are walked one component at a time from the folder's descriptor with O_NOFOLLOW, so what is
checked is what is written: a link swapped in after a check is still not followed. The folder
itself is taken as the user named it (their own link to it is their choice).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import stat
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import ParamSpec, TypeVar

from repro.core.diskfull import disk_full_error, is_disk_full
from repro.core.errors import UsageError
from repro.core.smallfile import read_regular

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
MAX_MANIFEST_BYTES = 1 << 20
_NO_LINKS = (
    "this tool writes only inside its output folder, never through a symbolic link (it may lead to "
    "files of yours)"
)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _usage_on_oserror(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """A folder that cannot be written (read-only, full, no such parent) is bad input naming the
    place, not a traceback."""

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        except OSError as exc:
            where = Path(str(args[0])) / str(args[1]) if len(args) > 1 else Path(str(args[0]))
            if is_disk_full(exc):
                raise disk_full_error(exc, str(where.name), where) from None
            raise UsageError(
                f"cannot write {where}",
                why=f"{exc.strerror or exc}",
                fix="choose a folder you can write (OUT=...)",
            ) from None

    return wrapper


def _parts(rel: str | PurePosixPath) -> tuple[str, ...]:
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"not a plain relative path: {rel!r}")  # a bug in the caller, not user input
    return parts


def link_error(path: Path, fix: str = "remove the link, or choose another output folder") -> UsageError:
    return UsageError(f"{path} is a symbolic link", why=_NO_LINKS, fix=fix)


def _not_folder(path: Path) -> UsageError:
    return UsageError(
        f"{path} is in the way: it is not a folder",
        why="this tool writes only into folders it made or was given",
        fix="move it away, or choose another output folder",
    )


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


@contextmanager
def _folder_fd(root: Path, parts: Iterable[str], create: bool) -> Iterator[int]:
    """A descriptor of root/parts..., each component opened without following a link (and made
    when `create`). A link or a non-folder on the way is a UsageError naming it."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError(
            f"cannot write into {root}",
            why=f"{exc.strerror or exc}",
            fix="choose a folder you can write",
        ) from None
    here = root
    try:
        for name in parts:
            here = here / name
            if create:
                try:
                    os.mkdir(name, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                found = _lstat(name, fd)
                if found is not None and stat.S_ISLNK(found.st_mode):
                    raise link_error(here) from None
                if exc.errno == errno.ENOTDIR:
                    raise _not_folder(here) from None
                raise
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def check_inside(root: Path, rel: str | PurePosixPath) -> Path:
    """root/rel, after proving that nothing from root down to it (itself included) is a link; for
    paths that other code (an engine, a subprocess) writes into. Missing components are fine."""
    parts = _parts(rel)
    here = Path(root)
    for name in parts:
        here = here / name
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            break
        if stat.S_ISLNK(mode):
            raise link_error(here)
    return Path(root).joinpath(*parts)


def check_writable(root: Path, rels: Iterable[str], ours: Collection[str]) -> None:
    """Before a writer records (in its manifest) what it is about to write: each of `rels` can be
    written by `write_file` (no link on the way, no folder or foreign file in its place; an
    existing file only when it is among `ours`). The same refusals, none of the side effects."""
    for rel in rels:
        path = check_inside(root, rel)
        parents = Path(root).joinpath(*_parts(rel)[:-1])
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            mode = None
        except NotADirectoryError:
            raise _not_folder(parents) from None
        if mode is None:
            continue
        if not stat.S_ISREG(mode):
            raise UsageError(
                f"{path} is in the way: it is not a file", fix="move it away, or choose another output folder"
            )
        if rel not in ours:
            raise _foreign(path)


def _foreign(path: Path) -> UsageError:
    return UsageError(
        f"{path} already exists and was not written by this tool",
        why="this tool never overwrites a file it did not write",
        fix="move that file away, or choose another output folder",
    )


@_usage_on_oserror
def make_folders(root: Path, rel: str | PurePosixPath) -> Path:
    """root/rel made (as `mkdir -p`) without following a link on the way."""
    parts = _parts(rel)
    with _folder_fd(Path(root), parts, create=True):
        pass
    return Path(root).joinpath(*parts)


@_usage_on_oserror
def write_file(
    root: Path, rel: str | PurePosixPath, data: bytes, *, replace: bool = False, executable: bool = False
) -> Path:
    """root/rel holds `data`, written atomically (a temp file renamed over it) when it may be
    `replace`d (the caller wrote it before), else created new (O_EXCL). Nothing through a link; an
    existing file that may not be replaced is a UsageError naming it."""
    parts = _parts(rel)
    path = Path(root).joinpath(*parts)
    # Not mkstemp (0600): results and reports are for sharing; the umask decides, as for any file.
    mode = 0o777 if executable else 0o666
    with _folder_fd(Path(root), parts[:-1], create=True) as dir_fd:
        name = parts[-1]
        found = _lstat(name, dir_fd)
        if found is not None:
            if stat.S_ISLNK(found.st_mode):
                raise link_error(path)
            if not stat.S_ISREG(found.st_mode):
                raise UsageError(
                    f"{path} is in the way: it is not a file",
                    fix="move it away, or choose another output folder",
                )
            if not replace:
                raise _foreign(path)
        tmp = f".tmp-{os.getpid()}-{os.urandom(6).hex()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            if found is None:
                # No-clobber: a file that appeared meanwhile is not ours to replace.
                link_new(tmp, name, dir_fd=dir_fd)
                if _lstat(tmp, dir_fd) is not None:
                    os.unlink(tmp, dir_fd=dir_fd)
            else:
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except FileExistsError:
            if _lstat(tmp, dir_fd) is not None:
                os.unlink(tmp, dir_fd=dir_fd)
            raise UsageError(
                f"{path} appeared while it was being written", fix="run the command again"
            ) from None
        except BaseException:
            if _lstat(tmp, dir_fd) is not None:
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    return path


@_usage_on_oserror
def append_file(root: Path, rel: str | PurePosixPath, data: bytes) -> Path:
    """Add `data` to the end of root/rel (made when missing), a log this tool keeps; never through
    a link, never to something that is not a regular file."""
    parts = _parts(rel)
    path = Path(root).joinpath(*parts)
    with _folder_fd(Path(root), parts[:-1], create=True) as dir_fd:
        try:
            fd = os.open(
                parts[-1], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666, dir_fd=dir_fd
            )
        except OSError as exc:
            found = _lstat(parts[-1], dir_fd)
            if found is not None and stat.S_ISLNK(found.st_mode):
                raise link_error(path) from None
            raise UsageError(f"cannot write {path}", why=f"{exc.strerror or exc}") from None
        with os.fdopen(fd, "ab") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise UsageError(f"{path} is in the way: it is not a file", fix="move it away")
            fh.write(data)
    return path


def link_new(tmp: str | Path, name: str | Path, *, dir_fd: int | None = None) -> None:
    """Give the finished temp file `tmp` its final `name` only when nothing has that name yet
    (FileExistsError else): a hard link, which never replaces; the caller removes `tmp` if it is
    still there. Where the file system has no hard links, a rename after a last look."""
    try:
        os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return
        raise FileExistsError(errno.EEXIST, "File exists", str(name)) from None


@_usage_on_oserror
def remove_file(root: Path, rel: str | PurePosixPath) -> bool:
    """Remove root/rel when it is a regular file reached without a link (the caller wrote it);
    anything else there (a link, a folder) is left alone. Returns whether it removed it."""
    parts = _parts(rel)
    try:
        with _folder_fd(Path(root), parts[:-1], create=False) as dir_fd:
            found = _lstat(parts[-1], dir_fd)
            if found is None or not stat.S_ISREG(found.st_mode):
                return False
            os.unlink(parts[-1], dir_fd=dir_fd)
            return True
    except FileNotFoundError:
        return False


def claim_folder(path: Path, *, option: str, owned_by: Collection[str]) -> Path:
    """The output folder `path`, made when missing. An existing one must be empty or hold one of
    `owned_by` (a file only this tool writes there: results.json, a manifest), else UsageError:
    the command would mix its files with, overwrite or remove files it does not own."""
    path = Path(path)
    try:
        if not path.exists():
            path.mkdir(parents=True)
            return path
        if not path.is_dir():
            raise UsageError(
                f"{option}={path} is a file, not a folder",
                why="this command writes a folder of files",
                fix=f"choose a new or empty {option}= folder",
            )
        entries = os.listdir(path)
    except OSError as exc:
        raise UsageError(
            f"cannot write into {option}={path}",
            why=f"{exc.strerror or exc}",
            fix="choose a folder you can write",
        ) from None
    mine = [
        name
        for name in owned_by
        if name in entries and os.path.isfile(path / name) and not os.path.islink(path / name)
    ]
    if entries and not mine:
        raise UsageError(
            f"{option}={path} is a folder that already holds other files",
            why="this command writes only into a new or empty folder, or one it wrote before, so it never "
            "overwrites or removes a file of yours",
            fix=f"choose a new or empty {option}= folder",
        )
    return path


def read_manifest(root: Path, name: str) -> frozenset[str]:
    """The relative paths an earlier run listed in root/name as written by it (empty when there
    is no such file, or it is not one this tool wrote: a link, not a list of plain paths)."""
    path = Path(root) / name
    if path.is_symlink():
        return frozenset()
    try:
        data = json.loads(read_regular(path, MAX_MANIFEST_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return frozenset()
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        return frozenset()
    found = set()
    for rel in files:
        try:
            if isinstance(rel, str):
                _parts(rel)
                found.add(rel)
        except ValueError:
            continue  # a path that climbs out is not one this tool wrote
    return frozenset(found)


def write_manifest(root: Path, name: str, files: Iterable[str]) -> Path:
    """root/name lists `files` (relative paths) as written by this tool, for the next run."""
    text = json.dumps({"written_by": "mics-repro", "files": sorted(set(files))}, indent=2) + "\n"
    return write_file(root, name, text.encode(), replace=True)
