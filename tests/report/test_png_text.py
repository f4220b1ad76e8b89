"""A bundle's PNGs: the leak check reads their metadata, never their compressed pixels (which
spell `key=...` by chance: the CI failure of stop 50), and a copy keeps every pixel."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from repro.core import png_text
from repro.core.errors import BundleError
from repro.core.scrub import Scrubber
from repro.upstream.bundle import files as bundle_files

# Bytes that read as a secret's shape (`password=...`) when a file is read as text.
CHANCE = b"\x13\x9apassword=q7\x00\xff"
HOST_SECRET = "tok-5d1e0b9c7a2f"


def chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png(*extra: bytes, pixels: bytes = CHANCE) -> bytes:
    header = chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    return png_text.SIGNATURE + header + b"".join(extra) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def scrubber() -> Scrubber:
    return Scrubber.from_host({"API_TOKEN": HOST_SECRET}, home="/nonexistent", hostnames=[], user="")


def test_chance_bytes_in_the_pixels_are_no_leak(tmp_path: Path) -> None:
    (tmp_path / "plot.png").write_bytes(png())
    bundle_files.scan(tmp_path, scrubber())  # accepted
    (tmp_path / "pixels.bin").write_bytes(CHANCE)  # the same bytes outside a PNG: read whole
    with pytest.raises(BundleError, match=r"pixels\.bin: <secret>"):
        bundle_files.scan(tmp_path, scrubber())


@pytest.mark.parametrize(
    "meta",
    [
        chunk(b"tEXt", b"Comment\0" + HOST_SECRET.encode()),
        chunk(b"zTXt", b"Comment\0\0" + zlib.compress(HOST_SECRET.encode())),
        chunk(b"iTXt", b"Comment\0\1\0en\0\0" + zlib.compress(HOST_SECRET.encode())),
        chunk(b"tIME", b"x" + HOST_SECRET.encode()),
    ],
    ids=["tEXt", "zTXt", "iTXt-compressed", "other-chunk"],
)
def test_a_secret_in_a_pngs_metadata_is_refused(tmp_path: Path, meta: bytes) -> None:
    (tmp_path / "plot.png").write_bytes(png(meta))
    with pytest.raises(BundleError) as err:
        bundle_files.scan(tmp_path, scrubber())
    assert "plot.png: <API_TOKEN>" in err.value.render()


def test_a_file_that_only_starts_like_a_png_is_read_whole(tmp_path: Path) -> None:
    broken = bytearray(png())
    broken[-5] ^= 0xFF  # IEND's CRC
    (tmp_path / "plot.png").write_bytes(bytes(broken))
    with pytest.raises(BundleError, match=r"plot\.png: <secret>"):
        bundle_files.scan(tmp_path, scrubber())


def test_a_copied_png_keeps_its_pixels_and_loses_its_text(tmp_path: Path) -> None:
    source = png(chunk(b"tEXt", b"Comment\0" + HOST_SECRET.encode()))
    (tmp_path / "in.png").write_bytes(source)
    bundle_files.copy_scrubbed(tmp_path / "in.png", tmp_path / "out" / "in.png", scrubber())
    copied = (tmp_path / "out" / "in.png").read_bytes()
    assert copied == png()  # the text chunk gone, the pixels untouched (the chance bytes too)
    kinds = [kind for kind, _payload, _raw in png_text.chunks(copied)]
    assert kinds == [b"IHDR", b"IDAT", b"IEND"]


def test_a_real_plot_survives_the_copy_and_the_scan(tmp_path: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [3, 1, 2])
    fig.savefig(tmp_path / "made.png")
    plt.close(fig)
    made = (tmp_path / "made.png").read_bytes()
    assert "Software" in png_text.readable_text(made)  # matplotlib's own metadata is read
    bundle_files.copy_scrubbed(tmp_path / "made.png", tmp_path / "out" / "made.png", scrubber())
    copied = (tmp_path / "out" / "made.png").read_bytes()
    pixels = [payload for kind, payload, _raw in png_text.chunks(made) if kind == b"IDAT"]
    assert [payload for kind, payload, _raw in png_text.chunks(copied) if kind == b"IDAT"] == pixels
    bundle_files.scan(tmp_path / "out", scrubber())
