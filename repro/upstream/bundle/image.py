"""The image part of a bundle: flatten it without build-only files, save it gzipped, load it back.

Everything here takes a docker-py client (the tests pass a fake one). Why flatten: an image keeps
every layer, so a file deleted in a later layer still ships. The build puts the host's CA bundle
(for a TLS-intercepting proxy) and pip/apt settings that point at it into the image, and the base
image may carry the build host's /etc/resolv.conf. Exporting a container's filesystem gives one
layer in which Docker's own empty /etc/hosts, /etc/hostname and /etc/resolv.conf replace the
host's, and from which BUILD_ONLY_PATHS are dropped; `docker import` with the original config
(ENV, WORKDIR, CMD, labels) turns it back into a runnable image.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from repro.core import console
from repro.core.errors import BundleError
from repro.engines.docker.engine import ChunkStream

# Paths (relative to the image root) that exist only to let the build reach PyPI through the host.
BUILD_ONLY_PATHS = (
    "opt/mics-repro/certs",
    "opt/mics-repro/ca-bundle.pem",
    "opt/venv/pip.conf",
    "etc/apt/apt.conf.d/99mics-repro-ca",
    ".dockerenv",
)
CHUNK = 1 << 20
LABEL_BUNDLE_OF = "mics-repro.upstream.bundle-of"
_NEEDS_QUOTES = (" ", "\t", '"')


@dataclass(frozen=True)
class Flattened:
    image_id: str
    ref: str
    source_id: str
    removed: tuple[str, ...]
    rootfs_bytes: int
    seconds: float
    base: str | None = None  # the base the image was really built on (a stand-in base may replace the pin)


@dataclass(frozen=True)
class Saved:
    path: Path
    sha256: str
    bytes: int
    uncompressed_bytes: int
    gzip_level: int
    seconds: float


def _dropped(name: str) -> bool:
    path = name[2:] if name.startswith("./") else name
    path = path.lstrip("/").rstrip("/")
    return any(path == d or path.startswith(d + "/") for d in BUILD_ONLY_PATHS)


def filter_tar(chunks: Iterable[bytes], out: BinaryIO | io.RawIOBase) -> list[str]:
    """Copy a tar stream to `out` without the members under BUILD_ONLY_PATHS; returns what was dropped."""
    removed: list[str] = []
    source = io.BufferedReader(ChunkStream(chunks), CHUNK)
    with tarfile.open(fileobj=source, mode="r|") as tar_in:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar_out:
            for member in tar_in:
                if _dropped(member.name):
                    removed.append(member.name.rstrip("/"))
                    continue
                data = tar_in.extractfile(member) if member.isreg() else None
                tar_out.addfile(member, data)
    return removed


def import_changes(config: Mapping[str, Any], extra_labels: Mapping[str, str]) -> list[str]:
    """Dockerfile instructions that give an imported root filesystem the original image's config."""
    changes = []
    for item in config.get("Env") or []:
        key, _, value = str(item).partition("=")
        # Quoted only when needed: the Dockerfile parser reads a bare value up to the first space.
        quoted = json.dumps(value) if any(c in value for c in _NEEDS_QUOTES) else value
        changes.append(f"ENV {key}={quoted}")
    if config.get("WorkingDir"):
        changes.append(f"WORKDIR {config['WorkingDir']}")
    if config.get("User"):
        changes.append(f"USER {config['User']}")
    if config.get("Entrypoint"):
        changes.append(f"ENTRYPOINT {json.dumps(list(config['Entrypoint']))}")
    if config.get("Cmd"):
        changes.append(f"CMD {json.dumps(list(config['Cmd']))}")
    labels = {**(config.get("Labels") or {}), **extra_labels}
    changes += [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items())]
    return changes


class _Counting(io.RawIOBase):
    """The write end of the pipe into `docker import`, counting what goes through."""

    def __init__(self, sink: BinaryIO) -> None:
        self.sink, self.bytes = sink, 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.sink.write(data)
        self.bytes += len(data)
        return len(data)


def _read_chunks(read_end: io.BufferedIOBase) -> Iterator[bytes]:
    while data := read_end.read(CHUNK):
        yield data


def flatten(client: Any, source: str, ref: str, say: Callable[[str], None] = console.result) -> Flattened:
    """One-layer copy of `source` without BUILD_ONLY_PATHS, tagged `ref`.

    The filtered filesystem streams from `docker export` into `docker import` through a pipe (a
    thread writes it), never through a file: for a GPU image that is tens of GB not written and
    read back, and no scratch space needed for them."""
    started = time.monotonic()
    image = client.images.get(source)
    config = dict(image.attrs.get("Config") or {})
    say(
        f"bundle: streaming the filesystem of {source} ({image.id[:19]}) into {ref}, without build-only files"
    )
    repository, _, tag = ref.rpartition(":")
    container = client.containers.create(image.id, command=["true"], network_disabled=True)
    read_fd, write_fd = os.pipe()
    reader, writer = os.fdopen(read_fd, "rb"), os.fdopen(write_fd, "wb")
    counting = _Counting(writer)
    removed: list[str] = []
    failed: list[BaseException] = []

    def export() -> None:
        try:
            removed.extend(filter_tar(container.export(chunk_size=CHUNK), counting))
        except BaseException as exc:  # handed to the caller; a closed reader (import failed) too
            failed.append(exc)
        finally:
            try:
                writer.close()
            except OSError:
                pass

    thread = threading.Thread(target=export, name="bundle-export", daemon=True)
    thread.start()
    try:
        import_error: Exception | None = None
        try:
            client.api.import_image_from_stream(
                _read_chunks(reader),
                repository=repository,
                tag=tag,
                changes=import_changes(config, {LABEL_BUNDLE_OF: image.id}),
            )
        except Exception as exc:
            import_error = exc
        finally:
            reader.close()  # an import that stopped early must not leave the export blocked on the pipe
            thread.join()
        # The export's own error says more than Docker's view of a cut-off tar; a broken pipe only
        # says that the import stopped reading.
        if failed and not isinstance(failed[0], BrokenPipeError):
            raise failed[0]
        if import_error is not None:
            raise import_error
    finally:
        container.remove(force=True)
    size = counting.bytes
    say(f"bundle: imported the flattened filesystem ({size / 1e9:.2f} GB) as {ref}")
    new_id = str(client.images.get(ref).id)
    base = (config.get("Labels") or {}).get("org.opencontainers.image.base.name")
    return Flattened(
        new_id,
        ref,
        str(image.id),
        tuple(sorted(set(removed))),
        size,
        time.monotonic() - started,
        str(base) if base else None,
    )


# gzip members of this many uncompressed bytes are compressed side by side (see save_gzip).
MEMBER = 16 << 20


def _blocks(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    """The stream cut into blocks of exactly `size` bytes (the last one shorter): fixed cuts make
    the same image give the same file, whatever chunk sizes Docker sends."""
    pending = bytearray()
    for chunk in chunks:
        pending += chunk
        while len(pending) >= size:
            yield bytes(pending[:size])
            del pending[:size]
    if pending:
        yield bytes(pending)


def compress_members(
    chunks: Iterable[bytes], level: int, workers: int, size: int = MEMBER
) -> Iterator[bytes]:
    """The stream as consecutive gzip members, in order, `workers` of them compressed at once.

    One gzip stream is one core's work (about 65 MB/s at level 1 here, so minutes for a GPU
    image); zlib lets go of the GIL while it compresses, so threads use every core. A file of
    several members is still one valid gzip file: gzip, Python's gzip module and `docker load`
    read them as one stream. No name and mtime 0 in each header, so the bytes are reproducible."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gzip") as pool:
        pending: deque[Future[bytes]] = deque()
        for block in _blocks(chunks, size):
            pending.append(pool.submit(gzip.compress, block, level, mtime=0))
            while len(pending) > 2 * workers:  # bounded memory: at most ~2 x workers blocks in flight
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def gzip_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def save_gzip(client: Any, ref: str, path: Path, level: int = 1, workers: int | None = None) -> Saved:
    """`docker save` streamed through gzip (every core, see compress_members) into `path`; hashes
    the file as it is written."""
    started = time.monotonic()
    image = client.images.get(ref)
    digest = hashlib.sha256()
    raw = 0

    def counted() -> Iterator[bytes]:
        nonlocal raw
        for chunk in image.save(chunk_size=CHUNK, named=True):
            raw += len(chunk)
            yield chunk

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as sink:
        for member in compress_members(counted(), level, workers or gzip_workers()):
            digest.update(member)
            sink.write(member)
    tmp.replace(path)
    return Saved(path, digest.hexdigest(), path.stat().st_size, raw, level, time.monotonic() - started)


def gzip_chunks(path: Path) -> Iterator[bytes]:
    """The decompressed bytes of a .tar.gz; a truncated or corrupt file raises BundleError."""
    try:
        with gzip.open(path, "rb") as gz:
            yield from _read_chunks(gz)
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise BundleError(
            f"{path.name} is truncated or corrupt",
            why=f"{type(exc).__name__}: {exc}",
            fix="copy the bundle again (check its size against manifest.json) or rebuild it "
            "with `make bundle`",
        ) from None


def load(client: Any, path: Path) -> list[str]:
    """`docker load` of the gzipped tarball; returns the ids of the loaded images."""
    try:
        images = client.images.load(gzip_chunks(path))
    except BundleError:
        raise
    except Exception as exc:  # the daemon's answer to a tar it cannot read
        raise BundleError(
            f"Docker could not load {path.name}",
            why=f"{type(exc).__name__}: {exc}",
            fix="check the file against manifest.json (sha256) or rebuild the bundle",
        ) from None
    return [str(i.id) for i in images]


def read_files(
    client: Any, image: str, container_paths: Sequence[str], names: Sequence[str]
) -> dict[str, str]:
    """Text of files inside an image (a created, never started container), keyed by `names`."""
    out: dict[str, str] = {}
    container = client.containers.create(image, command=["true"], network_disabled=True)
    try:
        for path, name in zip(container_paths, names):
            try:
                stream, _ = container.get_archive(path)
            except Exception:  # docker.errors.NotFound: the release has no such file
                continue
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                member = next((m for m in tar.getmembers() if m.isreg()), None)
                handle = tar.extractfile(member) if member is not None else None
                if handle is not None:
                    out[name] = handle.read().decode("utf-8")
    finally:
        container.remove(force=True)
    return out
