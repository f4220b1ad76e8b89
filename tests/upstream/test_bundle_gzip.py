"""The bundle's image is compressed on every core as consecutive gzip members
(repro.upstream.bundle.image.compress_members): one valid gzip file, the same bytes for the same
image whatever chunks Docker sends, in order, with bounded memory."""

from __future__ import annotations

import gzip
import hashlib
import os
import random
import subprocess
from pathlib import Path

import pytest

from repro.upstream.bundle import image as bundle_image


def _stream(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:])]


def _data(n: int) -> bytes:
    rng = random.Random(5)
    # half compressible, half not, like a filesystem of text and shared libraries
    return bytes(rng.getrandbits(8) for _ in range(n // 2)) + b"torch " * (n // 12)


@pytest.mark.parametrize("workers", [1, 3])
def test_members_decompress_to_the_stream_in_order(workers: int) -> None:
    data = _data(300_000)
    out = b"".join(bundle_image.compress_members(_stream(data, [7, 70_001, 150_000]), 1, workers, size=4096))
    assert gzip.decompress(out) == data
    assert out.count(b"\x1f\x8b\x08") >= len(data) // 4096  # many members, one file


def test_the_same_stream_gives_the_same_bytes_whatever_its_chunks() -> None:
    data = _data(100_000)
    one = b"".join(bundle_image.compress_members([data], 1, 2, size=8192))
    other = b"".join(bundle_image.compress_members(_stream(data, [1, 2, 3, 9000, 50_000]), 1, 4, size=8192))
    assert one == other


def test_the_system_gzip_reads_the_file_as_one_stream(tmp_path: Path, real_subprocess: None) -> None:
    data = _data(200_000)
    path = tmp_path / "image.tar.gz"
    path.write_bytes(b"".join(bundle_image.compress_members([data], 1, 2, size=10_000)))
    done = subprocess.run(["gzip", "-dc", str(path)], capture_output=True, check=True)
    assert hashlib.sha256(done.stdout).digest() == hashlib.sha256(data).digest()


def test_members_in_flight_are_bounded() -> None:
    handed: list[int] = []

    def chunks() -> object:
        for i in range(200):
            handed.append(i)
            yield os.urandom(1024)

    members = bundle_image.compress_members(chunks(), 1, 2, size=1024)  # type: ignore[arg-type]
    next(members)
    # the first member is handed out before the source is read to its end
    assert len(handed) <= 2 * 2 + 2, len(handed)
    rest = list(members)
    assert len(rest) == 199 and len(handed) == 200


def test_save_gzip_hashes_the_file_it_writes(tmp_path: Path) -> None:
    data = _data(150_000)

    class Image:
        def save(self, chunk_size: int, named: bool) -> list[bytes]:
            return _stream(data, [10, 20_000])

    class Images:
        def get(self, ref: str) -> Image:
            return Image()

    class Client:
        images = Images()

    saved = bundle_image.save_gzip(Client(), "x:y", tmp_path / "image.tar.gz", level=1, workers=3)
    assert saved.uncompressed_bytes == len(data)
    assert saved.sha256 == hashlib.sha256(saved.path.read_bytes()).hexdigest()
    assert gzip.decompress(saved.path.read_bytes()) == data


# ---- flatten: export -> filter -> import through a pipe, never a file --------------------------


def _tar(files: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class _FlattenClient:
    """Just what flatten touches: an image, a container whose export streams a tar, an import."""

    def __init__(self, export: object, import_fails: bool = False) -> None:
        client = self
        self.removed = False
        self.imported = b""

        class Image:
            id = "sha256:" + "a" * 64
            attrs = {"Config": {"Env": ["A=1"]}}

        class Container:
            def export(self, chunk_size: int) -> object:
                return export

            def remove(self, force: bool) -> None:
                client.removed = True

        class Containers:
            def create(self, image: str, **kwargs: object) -> Container:
                return Container()

        class Images:
            def get(self, ref: str) -> Image:
                return Image()

        class Api:
            def import_image_from_stream(self, stream: object, **kwargs: object) -> None:
                if import_fails:
                    next(iter(stream))  # type: ignore[call-overload]
                    raise RuntimeError("daemon: no space left on device")
                client.imported = b"".join(stream)  # type: ignore[arg-type]

        self.containers, self.images, self.api = Containers(), Images(), Api()


def test_flatten_streams_the_filtered_filesystem_into_the_import() -> None:
    big = os.urandom(3 << 20)  # bigger than a pipe's buffer and a chunk
    source = _tar({"opt/venv/lib/x.so": big, "opt/mics-repro/certs/ca.pem": b"secret", "etc/hosts": b"h"})
    client = _FlattenClient(_stream(source, [100, 70_000]))
    flat = bundle_image.flatten(client, "src", "mics-repro-bundle:cpu-x", say=lambda _l: None)
    assert flat.removed == ("opt/mics-repro/certs/ca.pem",) and client.removed
    assert flat.rootfs_bytes == len(client.imported) > len(big)
    assert big in client.imported and b"secret" not in client.imported


@pytest.mark.parametrize("import_fails", [False, True])
def test_a_failing_export_is_the_error_and_nothing_hangs(import_fails: bool) -> None:
    def broken() -> object:
        yield _tar({"a": b"x" * 4096})[:1024]
        raise ConnectionError("daemon went away during export")

    client = _FlattenClient(broken(), import_fails=import_fails)  # Docker may refuse the cut tar too
    with pytest.raises(ConnectionError, match="went away"):
        bundle_image.flatten(client, "src", "r:t", say=lambda _l: None)
    assert client.removed


def test_a_failing_import_is_the_error_and_the_export_stops() -> None:
    client = _FlattenClient(_stream(_tar({"a": os.urandom(4 << 20)}), [10]), import_fails=True)
    with pytest.raises(RuntimeError, match="no space left"):
        bundle_image.flatten(client, "src", "r:t", say=lambda _l: None)
    assert client.removed
