"""A bundle from a stranger cannot block or exhaust the verifying host (issue 22, items 2-5).

Default tier: bundles are made here by hand (a manifest that passes every field check, a small
stand-in image file); nothing talks to Docker.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repro.core.errors import BundleError
from repro.run.job import workdir_digest
from repro.upstream.bundle import manifest as bundle_manifest
from repro.upstream.bundle import verify as verify_bundle
from repro.upstream.bundle.manifest import Manifest, check_files

IMAGE = b"\x1f\x8b" + b"stand-in image bytes " * 50


def _manifest(files: dict[str, bytes], **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": "mics-repro-bundle",
        "schema": 1,
        "tool_version": "0.1.0",
        "created_at": "2026-01-01T00:00:00+00:00",
        "env": {"id": "cpu", "platform": "cpu", "pins": {"torch": "2.1.0"}, "derived_from": None},
        "image": {
            "file": "image.tar.gz",
            "id": "sha256:" + "1" * 64,
            "ref": "mics-repro-bundle:cpu-111111111111",
            "bytes": len(files["image.tar.gz"]),
        },
        "suite_args": ["--env", "cpu", "--scenarios", "zero3"],
        "commands": {"verify": "make verify-bundle BUNDLE=bundles/cpu.tar"},
        "expected": [
            {
                "run_name": "zero3-stock-fp32-async-w2",
                "scenario": "zero3",
                "patch": "stock",
                "dtype": "fp32",
                "transport": "async",
                "world_size": 2,
                "outcome": "clean",
                "signature": "none",
            }
        ],
        "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()},
        "notes": [],
        "job": None,
    }
    data.update(changes)
    return data


def _bundle_folder(root: Path, extra: dict[str, bytes] | None = None, **changes: Any) -> Path:
    files = {"image.tar.gz": IMAGE, "README.md": b"# bundle\n", "results/results.json": b"{}\n"}
    folder = root / "cpu"
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    (folder / "manifest.json").write_text(json.dumps(_manifest(files, **changes)))
    for rel, data in (extra or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def _archive(
    folder: Path, target: Path, mode: str = "w", extra: tuple[tuple[tarfile.TarInfo, bytes], ...] = ()
) -> Path:
    with tarfile.open(target, mode, format=tarfile.GNU_FORMAT) as tar:  # type: ignore[call-overload]
        tar.add(folder, arcname=folder.name)
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data))
    return target


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


# ---- item 2: a FIFO in the workdir the container wrote ---------------------------------------------

_OPENED: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # stays for the process; it records only while a test sets _OPENED


def test_the_workdir_digest_never_opens_a_fifo_or_device(tmp_path: Path) -> None:
    global _OPENED
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    os.mkfifo(work / "pipe")
    # A device behind a link (here /dev/null: /dev/zero would fill the memory of a digest that
    # reads it, as the old one did, taking the test machine with it).
    os.symlink("/dev/null", work / "zeros")
    _OPENED = []
    try:
        done: list[str] = []
        worker = threading.Thread(target=lambda: done.append(workdir_digest(work)), daemon=True)
        worker.start()
        worker.join(60)  # only bounds a failure of this test: the old digest blocked on the FIFO
        opened = list(_OPENED)
    finally:
        _OPENED = None
        if worker.is_alive():  # release the old code's blocked read (a writer that closes = EOF)
            os.close(os.open(work / "pipe", os.O_WRONLY | os.O_NONBLOCK))
    assert str(work / "pipe") not in opened and str(work / "zeros") not in opened
    assert done and done[0].startswith("sha256:")
    assert str(work / "train.py") in opened  # regular files are still read


def test_the_workdir_digest_has_a_time_limit(tmp_path: Path) -> None:
    for n in range(3):
        (tmp_path / f"f{n}.py").write_text(str(n))
    assert "time limit" in workdir_digest(tmp_path, max_s=0)
    assert "time limit" not in workdir_digest(tmp_path)


# ---- item 3: manifest first, caps, sparse members, each byte hashed once ---------------------------


def test_an_archive_member_the_manifest_does_not_list_is_never_extracted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bundle_manifest, "MAX_FILE_BYTES", 1 << 20, raising=False)
    monkeypatch.setattr("repro.upstream.bundle.archive.MAX_FILE_BYTES", 1 << 20)
    folder = _bundle_folder(tmp_path / "src")
    bomb = tarfile.TarInfo("cpu/results/bomb.bin")
    bomb.size = 4 << 20  # zeros: a few KB gzipped
    archive = _archive(folder, tmp_path / "cpu.tar.gz", "w:gz", ((bomb, bytes(bomb.size)),))
    assert archive.stat().st_size < 100_000
    dest = tmp_path / "extract"
    dest.mkdir()
    with pytest.raises(BundleError) as err:
        verify_bundle.load_bundle(archive, dest)
    assert "bomb.bin" in err.value.render()
    assert _files(dest) == []  # nothing written before the manifest was read and compared


def test_a_sparse_member_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    folder = _bundle_folder(tmp_path / "src")
    # A GNU sparse header with an empty map and a "real size" of 64 MiB: tarfile would write a
    # 64 MiB hole (20 GiB in the case) and the verifier would hash all of it.
    sparse = tarfile.TarInfo("cpu/results/hole.bin")
    sparse.type = tarfile.GNUTYPE_SPARSE
    header = bytearray(sparse.tobuf(tarfile.GNU_FORMAT))
    header[483:495] = b"%011o\0" % (64 << 20)
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header[:512])
    archive = tmp_path / "cpu.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(folder, arcname=folder.name)
        assert tar.fileobj is not None
        tar.fileobj.write(bytes(header))
        tar.offset += len(header)
    with tarfile.open(archive) as tar:
        assert any(m.issparse() for m in tar.getmembers())
    dest = tmp_path / "extract"
    dest.mkdir()
    with pytest.raises(BundleError, match="sparse"):
        verify_bundle.load_bundle(archive, dest)
    assert _files(dest) == []


def test_a_folder_bundle_reads_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _bundle_folder(tmp_path)
    reads: list[str] = []
    real = bundle_manifest.sha256_file
    monkeypatch.setattr(bundle_manifest, "sha256_file", lambda p: reads.append(Path(p).name) or real(p))
    check_files(folder, Manifest.read(folder))
    assert sorted(reads) == ["README.md", "image.tar.gz", "results.json"]


def test_an_archive_bundle_is_hashed_while_extracted_and_never_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = _archive(_bundle_folder(tmp_path / "src"), tmp_path / "cpu.tar")
    calls: list[Path] = []
    monkeypatch.setattr(bundle_manifest, "sha256_file", lambda p: calls.append(p) or "0" * 64)
    loaded = verify_bundle.load_bundle(archive, tmp_path)
    check_files(loaded.folder, loaded.manifest, loaded.hashes)
    assert calls == []


def test_an_image_larger_than_its_manifest_says_is_refused_unhashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _bundle_folder(tmp_path)
    with open(folder / "image.tar.gz", "r+b") as fh:
        fh.truncate(1 << 30)  # a sparse GiB: cheap to make, 2 s to hash
    reads: list[str] = []
    monkeypatch.setattr(bundle_manifest, "sha256_file", lambda p: reads.append(Path(p).name) or "0" * 64)
    with pytest.raises(BundleError, match="image.tar.gz differs"):
        check_files(folder, Manifest.read(folder))
    assert "image.tar.gz" not in reads


@pytest.mark.parametrize("special", ["fifo", "nested"])
def test_a_manifest_that_is_a_fifo_or_nested_deeply_is_a_bundle_error(tmp_path: Path, special: str) -> None:
    folder = _bundle_folder(tmp_path)
    (folder / "manifest.json").unlink()
    if special == "fifo":
        os.mkfifo(folder / "manifest.json")
    else:
        (folder / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    got: list[BaseException | Manifest] = []

    def read() -> None:
        try:
            got.append(Manifest.read(folder))
        except BaseException as exc:
            got.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)  # only bounds a failure of this test: the old read blocked on the FIFO
    if reader.is_alive():  # release the old code's blocked open (a writer that closes = EOF)
        os.close(os.open(folder / "manifest.json", os.O_WRONLY | os.O_NONBLOCK))
        reader.join()
        pytest.fail("reading manifest.json blocked on a FIFO")
    assert len(got) == 1 and isinstance(got[0], BundleError)


# ---- item 4: the container's /results: streamed, capped, never over a host file --------------------


def _results_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"results/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_the_results_archive_is_streamed_not_held_whole(tmp_path: Path) -> None:
    from repro.engines.docker.engine import ChunkStream, extract_tree

    data = _results_tar({"first.json": b"{}" * 1000, "big.log": os.urandom(2 << 20)})
    dest = tmp_path / "out"
    dest.mkdir()
    seen_first: list[bool] = []

    def chunks() -> Iterator[bytes]:
        for at in range(0, len(data), 64 << 10):
            seen_first.append((dest / "first.json").exists())
            yield data[at : at + (64 << 10)]

    assert extract_tree(io.BufferedReader(ChunkStream(chunks())), dest) == 2
    assert any(seen_first), "the first file was written while the archive was still arriving"


def test_the_results_archive_is_capped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from repro.engines.docker.engine import extract_tree

    dest = tmp_path / "out"
    dest.mkdir()
    data = _results_tar({"suite.json": b"{}", "huge.log": bytes(3 << 20)})
    assert extract_tree(io.BytesIO(data), dest, max_bytes=1 << 20) == 1
    assert _files(dest) == ["suite.json"]
    assert "stopped copying" in capsys.readouterr().err


def test_a_containers_file_never_replaces_the_hosts(tmp_path: Path) -> None:
    from repro.engines.docker.engine import extract_tree

    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "engine.log").write_text("what the host saw\n")
    data = _results_tar({"engine.log": b"forged by the container\n", "suite.json": b"{}"})
    assert extract_tree(io.BytesIO(data), dest) == 1
    assert (dest / "engine.log").read_text() == "what the host saw\n"
    assert (dest / "suite.json").read_bytes() == b"{}"


# ---- item 5: control and bidi characters from a bundle are shown escaped ---------------------------


def test_printable_escapes_terminal_and_bidi_controls() -> None:
    from repro.core.printable import printable

    assert printable("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert printable("rm -rf ~ \u202e#txt.exe") == "rm -rf ~ \\u202e#txt.exe"
    assert printable("x\u2066y\u200bz\x9b") == "x\\u2066y\\u200bz\\x9b"
    assert printable("one\ntwo\tthree", keep_newlines=True) == "one\ntwo\tthree"
    assert printable("ünïcödé 漢字") == "ünïcödé 漢字"


def test_an_escape_in_a_member_name_reaches_the_terminal_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from repro.cli.main import main

    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("cpu/\x1b[2J\x1b]0;owned\x07/../../../x")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    code = main(["verify-bundle", "--bundle", str(evil), "--results-root", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == BundleError.exit_code
    assert "\x1b" not in err and "\x07" not in err and "\\x1b[2J" in err


def test_a_bidi_override_in_the_job_command_is_shown_escaped(tmp_path: Path) -> None:
    command = "python train.py \u202e# safe.py ; rm -rf ~"
    job = {
        "command": command,
        "workdir": None,
        "patches": ["stock"],
        "transport": "async",
        "loss_regex": None,
        "timeout_s": 60,
        "stall_s": 30,
    }
    folder = _bundle_folder(tmp_path, job=job)
    lines: list[str] = []
    with pytest.raises(BundleError):  # the stand-in client cannot load the image: ends there
        verify_bundle.verify(folder, object(), tmp_path / "r", say=lines.append, workdir=tmp_path)
    said = "\n".join(lines)
    assert "\u202e" not in said and "train.py \\u202e# safe.py" in said


def test_a_crafted_job_json_from_the_container_is_a_crash_not_a_traceback(tmp_path: Path) -> None:
    from repro.engines.base import SuiteRun
    from repro.run.job import read_raw

    out = tmp_path / "cpu" / "custom-stock"
    out.mkdir(parents=True)
    (out / "job.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(out / "job.log")
    raw = read_raw("stock", out, tmp_path, SuiteRun(3, False, 1.0, out, None))
    assert raw.job["exit_code"] == 3 and raw.job["hook_reports"] == [] and raw.log_text == ""


def test_a_crafted_suite_json_from_the_container_gives_no_runs(tmp_path: Path) -> None:
    suite = tmp_path / "suite.json"
    suite.write_text("[" * 100_000 + "]" * 100_000)
    assert verify_bundle._suite_output(suite, "cpu") == ([], {})


def test_a_folder_bundle_with_a_fifo_in_its_workdir_is_refused_before_any_copy(tmp_path: Path) -> None:
    job = {
        "command": "python ok.py",
        "workdir": "workdir",
        "patches": ["stock"],
        "transport": "async",
        "loss_regex": None,
        "timeout_s": 60,
        "stall_s": 30,
    }
    src = tmp_path / "src"
    folder = _bundle_folder(src, extra={"workdir/ok.py": b"print(1)\n"}, job=job)
    data = json.loads((folder / "manifest.json").read_text())
    data["files"]["workdir/ok.py"] = hashlib.sha256(b"print(1)\n").hexdigest()
    (folder / "manifest.json").write_text(json.dumps(data))
    os.mkfifo(folder / "workdir" / "train.py")  # not in the manifest: the old check never saw it
    done: list[BaseException | None] = []

    def load() -> None:
        try:
            verify_bundle.verify(folder, object(), tmp_path / "r", say=lambda _l: None, workdir=tmp_path)
            done.append(None)
        except BaseException as exc:
            done.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(60)  # only bounds a failure of this test
    if worker.is_alive():
        os.close(os.open(folder / "workdir" / "train.py", os.O_WRONLY | os.O_NONBLOCK))
        worker.join()
        pytest.fail("reading the bundle blocked on a FIFO")
    assert isinstance(done[0], BundleError) and "special files" in done[0].what


def test_the_bundles_image_archive_given_as_the_bundle_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from repro.cli.main import main

    image = tmp_path / "image.tar.gz"
    with tarfile.open(image, "w:gz") as tar:  # the top level of a `docker save` archive
        for name in ("manifest.json", "repositories", "5bfdab1d62b7.json"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    code = main(["verify-bundle", "--bundle", str(image), "--results-root", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == BundleError.exit_code
    assert "image.tar.gz is a Docker image archive" in err and "the .tar `make bundle` wrote" in err
