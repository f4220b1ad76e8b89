"""Bundles: what goes in, what must never go in, and how a damaged one is caught.

Default tier: a fake docker-py client (tests/fixtures/fake_bundle_docker.py) that really exports,
imports, saves and loads tar bytes, and results folders made by the report fixtures' builder.
The Docker tier (the real CPU image, bundled, removed, loaded back and rerun offline) is
tests/upstream/test_bundle_docker.py.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

from repro.core.errors import BundleError
from repro.core.scrub import Scrubber
from repro.engines.base import SuiteRun
from repro.upstream import patchgen
from repro.upstream.bundle import comment as issue_comment
from repro.upstream.bundle import files as bundle_files
from repro.upstream.bundle import image as bundle_image
from repro.upstream.bundle import make as bundle
from repro.upstream.bundle import source_refs
from repro.upstream.bundle import verify as verify_bundle
from repro.upstream.bundle.manifest import Manifest, check_files
from repro.workload import suite as workload_suite
from tests.fixtures.fake_bundle_docker import (
    COMM_SOURCE,
    MICS_SOURCE,
    SECRET,
    SOURCE_ID,
    SOURCE_TAG,
    FakeClient,
)
from tests.fixtures.report_records import ResultsBuilder, standard_env
from tests.fixtures.stand_in_engine import StandInEngine


def make_results(root: Path, host: dict[str, str]) -> Path:
    b = ResultsBuilder(root, "20250101T000000Z-cpu")
    b.env("cpu", engine="docker", image_id=SOURCE_ID, venv=None)
    standard_env(b, "cpu")
    b.run("cpu", "mics", "stock", transport="sync", illegal=12)
    folder = b.write()
    planted = f"token {host['secret']} at {host['home']}/.cache on {host['host']} as {host['user']}\n"
    for path in [*folder.glob("cpu/runs/*/*.log"), *folder.glob("cpu/artifacts/*.txt")]:
        path.write_text(path.read_text() + planted)
    (folder / "cpu" / "runs" / "mics-stock-fp32-async-w2" / "rank0.pid").write_text("4242\n")
    data = json.loads((folder / "results.json").read_text())
    data["envs"]["cpu"]["venv"] = f"{host['home']}/.cache/mics-repro/venvs/cpu"
    data["invocation"]["argv"] += ["--results-root", "/srv/lab-7/results"]
    data["runs"][2]["reason"] += f" (seen by {host['user']}@{host['host']})"
    (folder / "results.json").write_text(json.dumps(data))
    return folder


def new_bundle(tmp_path: Path, host: dict[str, str], client: FakeClient | None = None) -> bundle.BundleResult:
    client = client or FakeClient()
    if SOURCE_ID not in client.images_by_id:
        client.add_source_image(SOURCE_ID, SOURCE_TAG)
    # Where people keep them: under their home folder, whose path must not reach the bundle.
    work = Path(host["home"]) / "mics"
    results = make_results(work / "results", host)
    request = bundle.BundleRequest(env_id="cpu", out=work / "bundles" / "cpu", results=results)
    scrubber = Scrubber.from_host(paths={"<repo>": str(bundle.REPO_ROOT)})
    return bundle.make_bundle(request, client, scrubber, say=lambda _line: None)


def all_bytes(folder: Path) -> dict[str, bytes]:
    """Every file of the bundle, the image tarball decompressed and its layers opened too."""
    out: dict[str, bytes] = {}
    for path in folder.rglob("*"):
        if path.is_file():
            rel = path.relative_to(folder).as_posix()
            out[rel] = gzip.decompress(path.read_bytes()) if rel.endswith(".gz") else path.read_bytes()
    saved = tarfile.open(fileobj=io.BytesIO(out[bundle.IMAGE_FILE]))
    layer = saved.extractfile("layer.tar")
    assert layer is not None
    with tarfile.open(fileobj=io.BytesIO(layer.read())) as tar:
        for member in tar.getmembers():
            handle = tar.extractfile(member)
            if handle is not None:
                out[f"image:{member.name}"] = handle.read()
    return out


# ---- what a bundle holds -------------------------------------------------------------------------


def test_bundle_holds_everything_a_maintainer_needs(tmp_path: Path, host: dict[str, str]) -> None:
    result = new_bundle(tmp_path, host)
    folder = result.folder
    for name in (
        "image.tar.gz",
        "manifest.json",
        "SHA256SUMS",
        "README.md",
        "ISSUE_COMMENT.md",
        "report/REPORT.md",
        "report/report.html",
        "results/results.json",
        "deepspeed-0.13.1.patch",
        "cluster/launch-node.sh",
        "cluster/mics-cpu-twin.sbatch",
        "cluster/summarize.py",
    ):
        assert (folder / name).is_file(), name
    assert result.archive is not None and result.archive.name == "cpu.tar"
    with tarfile.open(result.archive) as tar:
        names = set(tar.getnames())
        assert "cpu/manifest.json" in names and "cpu/image.tar.gz" in names
        assert {m.uname for m in tar.getmembers()} == {""}

    manifest = Manifest.read(folder)
    check_files(folder, manifest)  # every hash matches what is on disk
    sums = dict(reversed(line.split("  ", 1)) for line in (folder / "SHA256SUMS").read_text().splitlines())
    assert sums == {k: v for k, v in manifest.files.items() if k != "SHA256SUMS"}

    records = json.loads((folder / "results" / "results.json").read_text())["runs"]
    assert [(e.run_name, e.outcome, e.signature) for e in manifest.expected] == [
        (r["run_name"], r["outcome"], r["signature"]) for r in records
    ]
    assert manifest.image["source_id"] == SOURCE_ID and manifest.image["flattened"] is True
    assert manifest.env["pins"]["deepspeed"] == "0.13.1"
    assert "docker run --rm --network none" in manifest.commands["run"]
    assert (folder / "deepspeed-0.13.1.patch").read_text() == patchgen.patch_file("0.13.1").read_text()
    assert not (folder / "results" / "cpu" / "runs" / "mics-stock-fp32-async-w2" / "rank0.pid").exists()


def test_nothing_from_the_host_leaks_into_any_bundle_file(tmp_path: Path, host: dict[str, str]) -> None:
    result = new_bundle(tmp_path, host)
    planted = {k: v.encode() for k, v in host.items()}
    leaks = [
        f"{name}: {what}"
        for name, data in all_bytes(result.folder).items()
        for what, value in planted.items()
        if value in data
    ]
    assert leaks == []
    assert not any(b"/srv/lab-7" in data for data in all_bytes(result.folder).values())
    with tarfile.open(result.archive) as tar:  # type: ignore[arg-type]
        for member in tar.getmembers():
            handle = tar.extractfile(member)
            data = handle.read() if handle else b""
            data = gzip.decompress(data) if member.name.endswith(".gz") else data
            assert not any(v in data for v in planted.values()), member.name
    # The evidence is still there, with placeholders where the host's values were.
    log = (result.folder / "results" / "cpu" / "artifacts" / "ds_report.txt").read_text()
    assert "<SECRET_TOKEN>" in log and "~/.cache" in log and "<host>" in log and "<user>" in log


def test_build_only_files_are_not_in_the_bundled_image(tmp_path: Path, host: dict[str, str]) -> None:
    client = FakeClient()
    result = new_bundle(tmp_path, host, client)
    files = {k.removeprefix("image:") for k in all_bytes(result.folder) if k.startswith("image:")}
    for gone in bundle_image.BUILD_ONLY_PATHS:
        assert not any(f == gone or f.startswith(gone + "/") for f in files), gone
    assert "opt/venv/bin/python" in files
    assert sorted(Manifest.read(result.folder).image["removed"]) == sorted(
        [
            "opt/mics-repro/certs/host-ca.crt",
            "opt/mics-repro/ca-bundle.pem",
            "opt/venv/pip.conf",
            ".dockerenv",
        ]
    )
    # The flattened image keeps the original's config (env, workdir, command, labels).
    changes = client.import_changes[0]
    assert "ENV PYTHONPATH=/opt/mics-repro/src" in changes and "WORKDIR /results" in changes
    assert 'CMD ["python", "-m", "repro.workload.suite"]' in changes
    assert f'LABEL "mics-repro.upstream.bundle-of"="{SOURCE_ID}"' in changes
    assert all(c.removed for c in client.created), "every helper container is removed"
    assert client.images.get(SOURCE_TAG).id == SOURCE_ID  # the source image is untouched
    with pytest.raises(LookupError):  # the flattened copy is not left behind (the tarball has it)
        client.images.get(Manifest.read(result.folder).image["ref"])


def test_a_bundle_is_never_written_over(tmp_path: Path, host: dict[str, str]) -> None:
    new_bundle(tmp_path, host)
    with pytest.raises(BundleError, match="already exists"):
        new_bundle(tmp_path, host)


def test_results_from_the_venv_engine_cannot_be_bundled(tmp_path: Path, host: dict[str, str]) -> None:
    b = ResultsBuilder(tmp_path, "r")
    b.env("cpu")
    standard_env(b, "cpu")
    request = bundle.BundleRequest("cpu", tmp_path / "out", b.write())
    with pytest.raises(BundleError, match="did not run in a Docker image"):
        bundle.make_bundle(request, FakeClient(), Scrubber(()), say=lambda _l: None)


def test_scan_refuses_a_leak_without_repeating_it(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text(f"oops {SECRET}\n")
    scrubber = Scrubber.from_host({"SECRET_TOKEN": SECRET}, home="/nonexistent", hostnames=[], user="")
    with pytest.raises(BundleError) as err:
        bundle.scan(tmp_path, scrubber)
    assert "notes.txt: <SECRET_TOKEN>" in err.value.render() and SECRET not in err.value.render()


def test_scrubber_replaces_host_values_and_keeps_the_evidence() -> None:
    scrubber = Scrubber.from_host(
        {
            "SECRET_TOKEN": "abcd1234",
            "GH_PAT": "ghp_Abc123def456GHI789jkl",
            "HTTPS_PROXY": "http://u:pw@proxy:3128",
            "DEBIAN_FRONTEND": "noninteractive",
            "SHELL": "/bin/bash",
            "OMP_NUM_THREADS": "1",
        },
        home="/home/alice",
        hostnames=["vm", "build-42"],
        user="alice",
        paths={"<repo>": "/work/main"},
    )
    text = (
        "abcd1234 ghp_Abc123def456GHI789jkl via http://u:pw@proxy:3128 in /home/alice/.cache and "
        "/home/alicebob on build-42 by alice; /work/main/repro; noninteractive /bin/bash 1 vm malice"
    )
    assert scrubber.text(text) == (
        "<SECRET_TOKEN> <$GH_PAT> via <HTTPS_PROXY> in ~/.cache and /home/alicebob on <host> by <user>; "
        "<repo>/repro; noninteractive /bin/bash 1 vm malice"
    )
    assert scrubber.leaks(scrubber.text(text)) == []
    assert scrubber.data({"k abcd1234": ["x abcd1234"]}) == {"k <SECRET_TOKEN>": ["x <SECRET_TOKEN>"]}


def test_suite_args_plan_exactly_the_recorded_runs(tmp_path: Path) -> None:
    """Against this checkout's suite: a bundle's image runs its own copy, from the same commit."""
    b = ResultsBuilder(tmp_path, "r")
    b.env("cpu")
    standard_env(b, "cpu")
    b.run("cpu", "mics", "stock", transport="sync", illegal=3)
    records = b.runs
    ns = workload_suite.parser().parse_args([*bundle.suite_args_from_records("cpu", records), "--out", "x"])
    planned = workload_suite.plan(
        ns.scenarios,
        ns.patches,
        ns.dtype,
        ns.transports,
        ns.world_size,
        sync_proof=not ns.no_sync_proof,
    )
    names = {f"{p.scenario}-{p.patch}-{p.dtype}-{p.transport}-w{p.shape.world_size}" for p in planned}
    recorded = {r["run_name"] for r in records}
    # This suite runs no zero3 with the fix (older ones did; the builder still makes that record).
    assert names == recorded - {"zero3-fixed-fp32-async-w2"}
    # "zero3" is asked for exactly when such a run exists, so older images plan it again.
    for keep_zero3_fixed in (True, False):
        subset = [r for r in records if keep_zero3_fixed or r["run_name"] != "zero3-fixed-fp32-async-w2"]
        scenarios = bundle.suite_args_from_records("cpu", subset)[3].split(",")
        assert ("zero3" in scenarios) is keep_zero3_fixed
        assert scenarios[-2:] == ["mics", "mics-hier"]


# ---- verification -----------------------------------------------------------------------------------


class FakeEngine(StandInEngine):
    """Writes the suite's output as the real suite would, with outcomes the test chooses; it builds
    nothing (a verification runs the bundle's own image)."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        self.calls: list[tuple[Any, list[str]]] = []

    def run_suite(self, prepared: Any, args: list[str], out_dir: Path, timeout_s: float | None) -> SuiteRun:
        self.calls.append((prepared, list(args)))
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "suite.json").write_text(json.dumps({"runs": self.records, "artifacts": {}}))
        return SuiteRun(0, False, 1.0, out_dir, None)

    def prepare(self, env: Any) -> Any:
        raise AssertionError("a verification builds no image")


def _recorded(folder: Path) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = json.loads((folder / "results" / "results.json").read_text())["runs"]
    for run in runs:
        run["logs"] = {}
    return runs


def _bundle_and_records(
    tmp_path: Path, host: dict[str, str]
) -> tuple[FakeClient, bundle.BundleResult, list[dict[str, Any]]]:
    """A bundle made through a fresh fake Docker client: the client, the bundle and its runs."""
    client = FakeClient()
    result = new_bundle(tmp_path, host, client)
    return client, result, _recorded(result.folder)


def test_verify_loads_the_image_and_matches_the_manifest(tmp_path: Path, host: dict[str, str]) -> None:
    client = FakeClient()
    result = new_bundle(tmp_path, host, client)
    manifest = Manifest.read(result.folder)
    engine = FakeEngine(_recorded(result.folder))
    got = verify_bundle.verify(
        result.archive,
        client,
        tmp_path / "verify-results",  # type: ignore[arg-type]
        engine_factory=lambda _c: engine,
        say=lambda _l: None,
    )
    assert client.loaded == [manifest.image["id"]]
    prepared, args = engine.calls[0]
    assert prepared.handle == manifest.image["id"] and args == list(manifest.suite_args)
    assert got.ok and len(got.comparisons) == len(manifest.expected)
    verify_bundle.require_match(got)
    assert (got.folder / "results.json").is_file()


def test_reuse_image_skips_the_load_only_when_docker_has_that_very_image(
    tmp_path: Path, host: dict[str, str]
) -> None:
    client = FakeClient()
    result = new_bundle(tmp_path, host, client)
    manifest = Manifest.read(result.folder)

    def verify(results: str) -> verify_bundle.VerifyResult:
        return verify_bundle.verify(
            result.folder,
            client,
            tmp_path / results,
            engine_factory=lambda _c: FakeEngine(_recorded(result.folder)),
            say=lambda _l: None,
            reuse_image=True,
        )

    # Docker does not have it (bundle removed its flattened image): loaded from the tarball.
    assert verify("first").ok and client.loaded == [manifest.image["id"]]
    # Now it does: the same id is not loaded again, and the runs still compare.
    again = verify("second")
    assert again.ok and client.loaded == [manifest.image["id"]]
    assert again.image_id == manifest.image["id"]


def _verify_returning(
    result: bundle.BundleResult, client: FakeClient, records: list[dict[str, Any]], out: Path
) -> verify_bundle.VerifyResult:
    """verify-bundle of `result` whose image's runs come out as `records`."""
    return verify_bundle.verify(
        result.folder, client, out, engine_factory=lambda _c: FakeEngine(records), say=lambda _l: None
    )


def test_verify_reports_a_different_outcome(tmp_path: Path, host: dict[str, str]) -> None:
    client, result, records = _bundle_and_records(tmp_path, host)
    flipped = next(r for r in records if r["outcome"] == "reproduced")
    flipped.update(outcome="clean", signature="none")
    got = _verify_returning(result, client, records, tmp_path / "v")
    assert not got.ok
    assert [c.run_name for c in got.comparisons if not c.ok] == [flipped["run_name"]]
    with pytest.raises(BundleError, match="did not reproduce the outcomes"):
        verify_bundle.require_match(got)


@pytest.mark.parametrize(
    ("run_name", "got", "accepted"),
    [
        # expected illegal-work-divergence; the losses did not part this time: a race on async
        ("mics-stock-fp32-async-w2", "illegal-work-warnings", True),
        # expected illegal-work-warnings: the sync transport is deterministic, exact match only
        ("mics-stock-fp32-sync-w2", "illegal-work-divergence", False),
        # losses parted without any IllegalWork message: other evidence
        ("mics-stock-fp32-async-w2", "divergence", False),
        # expected illegal-work-crash: a run that did not crash is not the same evidence
        ("mics-hier-stock-fp32-async-w2", "illegal-work-warnings", False),
    ],
)
def test_verify_takes_the_other_illegal_work_signature_only_where_it_is_a_race(
    tmp_path: Path, host: dict[str, str], run_name: str, got: str, accepted: bool
) -> None:
    client, result, records = _bundle_and_records(tmp_path, host)
    run = next(r for r in records if r["run_name"] == run_name)
    assert run["outcome"] == "reproduced" and run["signature"] != got
    run["signature"] = got
    verified = _verify_returning(result, client, records, tmp_path / "v")
    mine = next(c for c in verified.comparisons if c.run_name == run_name)
    assert (mine.ok, mine.timing_only, verified.ok) == (accepted, accepted, accepted), mine.line()
    assert not mine.exact
    assert all(c.exact for c in verified.comparisons if c.run_name != run_name)
    text = verify_bundle.report(verified)
    if accepted:
        assert mine.line().startswith("ok~ ") and "a race on async" in mine.line()
        assert "every outcome matches" in text and "1 with the other IllegalWork signature" in text
        verify_bundle.require_match(verified)
    else:
        assert mine.line().startswith("DIFF") and "outcomes differ" in text
        with pytest.raises(BundleError, match="did not reproduce the outcomes"):
            verify_bundle.require_match(verified)


# Issue #45 item 4: the rerun's own transport was never read; `ok~` was given to a rerun on the
# strict transport, where the two IllegalWork signatures are different results, not a race.
@pytest.mark.parametrize(
    ("ran_on", "got", "tag"),
    [
        # the manifest's run was on async, the rerun on strict with the other signature: no race there
        ("strict", "illegal-work-warnings", "DIFF"),
        # the same outcome and signature, but on another transport: not the manifest's run
        ("strict", "illegal-work-divergence", "DIFF"),
        ("sync", "illegal-work-divergence", "DIFF"),
        # async both times: the race the ok~ is for
        ("async", "illegal-work-warnings", "ok~ "),
        ("async", "illegal-work-divergence", "ok  "),
    ],
)
def test_verify_compares_the_transport_the_rerun_ran_on(
    tmp_path: Path, host: dict[str, str], ran_on: str, got: str, tag: str
) -> None:
    client, result, records = _bundle_and_records(tmp_path, host)
    run_name = "mics-stock-fp32-async-w2"
    run = next(r for r in records if r["run_name"] == run_name)
    assert (run["transport"], run["signature"]) == ("async", "illegal-work-divergence")
    run.update(transport=ran_on, signature=got)
    verified = _verify_returning(result, client, records, tmp_path / "v")
    mine = next(c for c in verified.comparisons if c.run_name == run_name)
    assert mine.line().startswith(tag), mine.line()
    assert verified.ok == (tag != "DIFF")
    if tag == "DIFF":
        assert f"ran on the {ran_on} transport, the manifest's run on async" in mine.line()
        with pytest.raises(BundleError, match="did not reproduce the outcomes"):
            verify_bundle.require_match(verified)


@pytest.mark.parametrize("reuse_image", [False, True])  # REUSE_IMAGE=1 still checks the tarball
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_image_tarball_is_a_clear_error(
    tmp_path: Path, host: dict[str, str], damage: str, reuse_image: bool
) -> None:
    client = FakeClient()
    result = new_bundle(tmp_path, host, client)
    image = result.folder / bundle.IMAGE_FILE
    data = image.read_bytes()
    image.write_bytes(
        data[: len(data) // 2] if damage == "truncate" else data[:100] + bytes([data[100] ^ 1]) + data[101:]
    )
    with pytest.raises(BundleError, match="does not match its manifest") as err:
        verify_bundle.verify(
            result.folder,
            client,
            tmp_path / "v",
            engine_factory=lambda _c: FakeEngine([]),
            say=lambda _l: None,
            reuse_image=reuse_image,
        )
    assert "image.tar.gz differs from the manifest" in err.value.why
    assert client.loaded == [], "nothing is loaded from a damaged tarball"


def test_loading_a_truncated_gzip_stream_is_a_bundle_error(tmp_path: Path) -> None:
    path = tmp_path / "image.tar.gz"
    path.write_bytes(gzip.compress(os.urandom(200_000))[:50_000])
    with pytest.raises(BundleError, match="truncated or corrupt"):
        bundle_image.load(FakeClient(), path)


def test_a_truncated_archive_is_a_clear_error(tmp_path: Path, host: dict[str, str]) -> None:
    result = new_bundle(tmp_path, host)
    assert result.archive is not None
    cut = tmp_path / "cut.tar"
    cut.write_bytes(result.archive.read_bytes()[:20_000])
    with pytest.raises(BundleError):
        verify_bundle.verify(
            cut, FakeClient(), tmp_path / "v", engine_factory=lambda _c: FakeEngine([]), say=lambda _l: None
        )


def test_an_unsafe_archive_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(BundleError, match="unsafe entry"):
        verify_bundle.load_bundle(evil, tmp_path / "x")
    assert not (tmp_path / "outside.txt").exists()


# ---- a bundle is untrusted input (issue 12, item 1) -----------------------------------------------


class _Door:
    """`python -m repro verify-bundle` with a fake Docker: counts connections, never a real daemon."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, client: FakeClient, records: list[dict[str, Any]]
    ) -> None:
        self.client, self.connects, self.engine = client, 0, FakeEngine(records)

        def connect() -> FakeClient:
            self.connects += 1
            return self.client

        monkeypatch.setattr("repro.cli.upstream_commands._docker_client", connect)
        monkeypatch.setattr(verify_bundle, "_docker_engine", lambda _c: self.engine)

    def __call__(self, *argv: str) -> int:
        from repro.cli.main import main

        return main(["verify-bundle", *argv])


def _craft(folder: Path, mutate: Any) -> None:
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")} if root.exists() else set()


@pytest.mark.parametrize(
    ("mutate", "named"),
    [
        (lambda d: d["env"].update(id="../../../../tmp/x"), "env.id"),
        (lambda d: d["env"].update(id="/tmp/x"), "env.id"),
        (lambda d: d["env"].update(platform="rocm --privileged"), "env.platform"),
        (lambda d: d["image"].update(file="../image.tar.gz"), "image.file"),
        (lambda d: d["image"].update(id="sha256:abc; rm -rf /"), "image.id"),
        (lambda d: d["files"].update({"../../outside.txt": "0" * 64}), "outside the bundle"),
        (lambda d: d["suite_args"].extend(["--out", "/host"]), "--out"),
        (lambda d: d.update(notes=["suite time limit nan s"]), "time limit"),
        (lambda d: d["expected"][0].update(outcome="\x1b[2Jclean"), "expected[0].outcome"),
        (lambda d: d["expected"][0].update(world_size="four"), "world_size"),
        (lambda d: d["commands"].update(run="docker run x\nrm -rf ~"), "control characters"),
    ],
)
def test_a_crafted_manifest_is_refused_before_docker_and_writes_nothing(
    tmp_path: Path,
    host: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    mutate: Any,
    named: str,
) -> None:
    client = FakeClient()
    result = new_bundle(tmp_path, host, client)
    _craft(result.folder, mutate)
    door = _Door(monkeypatch, client, _recorded(result.folder))
    results = tmp_path / "verify-results"
    escape = Path("/tmp/x")
    before = _files_under(tmp_path) | _files_under(escape)
    assert door("--bundle", str(result.folder), "--results-root", str(results)) == BundleError.exit_code
    err = capsys.readouterr().err
    assert "not a manifest this tool writes" in err and named in err
    assert door.connects == 0 and client.loaded == [] and door.engine.calls == []
    assert _files_under(tmp_path) | _files_under(escape) == before  # nothing written anywhere


def test_a_bundle_with_a_link_is_refused(
    tmp_path: Path, host: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client = FakeClient()
    result = new_bundle(tmp_path, host, client)
    secret = tmp_path / "host-secret.txt"
    secret.write_text("private\n")
    (result.folder / "README.md").unlink()
    (result.folder / "README.md").symlink_to(secret)
    door = _Door(monkeypatch, client, _recorded(result.folder))
    code = door("--bundle", str(result.folder), "--results-root", str(tmp_path / "v"))
    assert code == BundleError.exit_code
    assert "README.md" in capsys.readouterr().err and door.connects == 0


def test_a_missing_bundle_is_named_before_anything_about_docker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from repro.core.errors import DockerUnavailableError

    def no_daemon() -> Any:
        raise DockerUnavailableError("a bundle needs a Docker daemon")

    monkeypatch.setattr("repro.cli.upstream_commands._docker_client", no_daemon)
    from repro.cli.main import main

    code = main(
        ["verify-bundle", "--bundle", str(tmp_path / "nope.tar"), "--results-root", str(tmp_path / "r")]
    )
    err = capsys.readouterr().err
    assert code == BundleError.exit_code
    assert "nope.tar does not exist" in err and "Docker" not in err


class _DeviceCheck:
    """Stands in for the ROCm device check (repro.engines.preflight): records it ran, or fails."""

    def __init__(self, devices: bool) -> None:
        self.devices, self.calls = devices, 0

    def __call__(self, host: Any) -> None:
        from repro.core.errors import DeviceUnavailableError

        self.calls += 1
        if not self.devices:
            raise DeviceUnavailableError("this ROCm env needs /dev/kfd and /dev/dri; this host has neither")


def _rocm_bundle(tmp_path: Path, host: dict[str, str], client: FakeClient) -> Path:
    """A CPU bundle relabelled rocm: the platform is what decides the container's privileges."""
    folder = new_bundle(tmp_path, host, client).folder
    _craft(folder, lambda d: d["env"].update(platform="rocm"))
    return folder


def _rocm_door(
    tmp_path: Path, host: dict[str, str], monkeypatch: pytest.MonkeyPatch, devices: bool
) -> tuple[FakeClient, Path, _Door, _DeviceCheck]:
    """verify-bundle's front door on a rocm bundle, the host's device check standing in (`devices`:
    whether the host has the devices)."""
    client = FakeClient()
    folder = _rocm_bundle(tmp_path, host, client)
    door = _Door(monkeypatch, client, _recorded(folder))
    check = _DeviceCheck(devices=devices)
    monkeypatch.setattr(verify_bundle, "check_rocm", check)
    return client, folder, door, check


def test_a_gpu_bundle_needs_the_users_consent(
    tmp_path: Path, host: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from repro.core.errors import UsageError

    client, folder, door, devices = _rocm_door(tmp_path, host, monkeypatch, devices=True)
    assert door("--bundle", str(folder), "--results-root", str(tmp_path / "v")) == UsageError.exit_code
    err = capsys.readouterr().err
    assert "ALLOW_PRIVILEGES=1" in err and "--cap-add SYS_PTRACE" in err
    assert door.connects == 0 and client.loaded == [] and not (tmp_path / "v").exists()
    assert devices.calls == 0  # refused on consent alone


def test_a_gpu_bundle_needs_a_host_with_the_devices(
    tmp_path: Path, host: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from repro.core.errors import DeviceUnavailableError

    client, folder, door, _ = _rocm_door(tmp_path, host, monkeypatch, devices=False)
    code = door("--bundle", str(folder), "--results-root", str(tmp_path / "v"), "--allow-gpu-privileges")
    assert code == DeviceUnavailableError.exit_code
    assert client.loaded == [] and door.engine.calls == []


def test_with_consent_a_gpu_bundle_says_what_will_run_then_runs(
    tmp_path: Path, host: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client, folder, door, devices = _rocm_door(tmp_path, host, monkeypatch, devices=True)
    assert door("--bundle", str(folder), "--results-root", str(tmp_path / "v"), "--allow-gpu-privileges") == 0
    assert devices.calls == 1
    out = capsys.readouterr().out
    plan = out.index("will run: docker run --network none --device /dev/kfd")
    assert plan < out.index("loading image.tar.gz") and "--out /results" in out
    prepared, _args = door.engine.calls[0]
    assert prepared.details["platform"] == "rocm"


def test_a_verification_writes_only_under_the_results_root(
    tmp_path: Path, host: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, result, records = _bundle_and_records(tmp_path, host)
    door = _Door(monkeypatch, client, records)

    def run_suite(prepared: Any, args: list[str], out_dir: Path, timeout_s: float | None) -> SuiteRun:
        out_dir.mkdir(parents=True, exist_ok=True)  # what a crafted image's suite could write
        (out_dir / "suite.json").write_text(
            json.dumps(
                {
                    "runs": [*records, "junk"],
                    "artifacts": {"ds_report": "../../../../etc/passwd", "ok": "a/b.txt"},
                }
            )
        )
        return SuiteRun(0, False, 1.0, out_dir, None)

    monkeypatch.setattr(door.engine, "run_suite", run_suite)
    root = tmp_path / "v"
    assert door("--bundle", str(result.archive), "--results-root", str(root)) == 0
    written = [p for p in tmp_path.rglob("*") if p.stat().st_mtime and root not in p.parents and p != root]
    folder = next(root.glob("*-verify-cpu"))
    data = json.loads((folder / "results.json").read_text())
    assert data["envs"]["cpu"]["artifacts"] == {"ok": "cpu/a/b.txt"}
    assert len(data["runs"]) == len(records)
    assert all(tmp_path / "home" in p.parents or p == tmp_path / "home" for p in written)  # only new_bundle's


def test_files_copied_out_of_a_container_stay_in_their_folder(tmp_path: Path) -> None:
    from repro.engines.docker.engine import extract_tree

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (
            ("results/ok.json", b"{}"),
            ("results/../../escaped.txt", b"x"),
            ("/abs.txt", b"x"),
            ("results/sub/../../../up.txt", b"x"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for kind, name, target in (
            (tarfile.SYMTYPE, "results/link", "/etc"),
            (tarfile.LNKTYPE, "results/hard", "/etc/passwd"),
        ):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            tar.addfile(info)
        info = tarfile.TarInfo("results/link/written-through-link")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    dest = tmp_path / "work" / "out"
    assert extract_tree(io.BytesIO(buf.getvalue()), dest) == 2
    inside = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert inside == ["link/written-through-link", "ok.json"]
    assert not (dest / "link").is_symlink() and not (dest / "hard").exists()
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["ok.json", "written-through-link"]


# ---- nothing secret ships, whatever the bundling shell's environment (issue 12, item 8) -------------

PLANTED = {
    "aws": "AKIA" + "Q7RZ2XNB4KFD8W3M",
    "hf": "hf_" + "kTqXbWvNmRzLpYcJdHsGfAeUoIi0123456",
    "github": "ghp_" + "1a2B3c4D5e6F7g8H9i0JkLmNoPqRsTuVwXyZ",
    "github_pat": "github_pat_" + "11ABCDE0123456789_abcdefghijklmnopqrstuv",
    "slack": "xoxb-" + "123456789012-abcdefABCDEF",
    "url_password": "s3cr3t-pw-9",
    "key_body": "MIIEowIBAAKCAQEAplanted0key0body0line",
}


def _plant_secrets(folder: Path) -> None:
    text = (
        f"AWS_ACCESS_KEY_ID={PLANTED['aws']} HF {PLANTED['hf']} gh {PLANTED['github']} "
        f"{PLANTED['github_pat']} slack {PLANTED['slack']}\n"
        f"pip index https://bob:{PLANTED['url_password']}@pypi.corp.example/simple\n"
        f"-----BEGIN RSA PRIVATE KEY-----\n{PLANTED['key_body']}\n-----END RSA PRIVATE KEY-----\n"
    )
    (folder / "cpu" / "artifacts" / "collect_env.txt").write_text("PyTorch version: 2.1.0\n" + text)
    data = json.loads((folder / "results.json").read_text())
    data["runs"][0]["reason"] += " " + text
    data["runs"][1]["exception"] = {"type": "RuntimeError", "message": text, "rank": 0, "traceback": text}
    (folder / "results.json").write_text(json.dumps(data))


def test_planted_secrets_are_scrubbed_with_a_clean_environment(
    tmp_path: Path, host: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Secrets that reached records and collect_env from elsewhere: found by shape, through `make bundle`."""
    from repro.cli.main import main

    for name in list(os.environ):  # the bundling shell holds no secret at all
        if any(w in name.upper() for w in ("TOKEN", "SECRET", "KEY", "PASS", "AUTH", "AWS", "HF_")):
            monkeypatch.delenv(name)
    client = FakeClient()
    client.add_source_image(SOURCE_ID, SOURCE_TAG)
    work = Path(host["home"]) / "mics"
    results = make_results(work / "results", host)
    _plant_secrets(results)
    monkeypatch.setattr("repro.cli.upstream_commands._docker_client", lambda: client)
    out = work / "bundles" / "cpu"
    assert (
        main(
            [
                "bundle",
                "--env",
                "cpu",
                "--results",
                str(results),
                "--out",
                str(out),
                "--results-root",
                str(work / "results"),
            ]
        )
        == 0
    )
    found = [
        f"{name}: {what}"
        for name, data in all_bytes(out).items()
        for what, value in PLANTED.items()
        if value.encode() in data
    ]
    assert found == []
    comment = (out / "ISSUE_COMMENT.md").read_text()  # collect_env is quoted there, scrubbed
    for placeholder in (
        "<aws-access-key-id>",
        "<hf-token>",
        "<github-token>",
        "<slack-token>",
        "https://<credentials>@pypi.corp.example",
        "<private-key>",
    ):
        assert placeholder in comment, placeholder
    assert "PyTorch version: 2.1.0" in comment  # the evidence around them stays


def test_the_leak_scan_finds_secret_shapes_without_any_host_value(tmp_path: Path) -> None:
    (tmp_path / "records.json").write_text(json.dumps({"reason": f"token {PLANTED['hf']}"}))
    with pytest.raises(BundleError) as err:
        bundle.scan(tmp_path, Scrubber(()))
    assert "records.json: <hf-token>" in err.value.render() and PLANTED["hf"] not in err.value.render()


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("DB_PASS", True),
        ("MY_PW", True),
        ("PWD", True),
        ("SSH_KEY", True),
        ("GITHUB_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("SESSION_COOKIE", True),
        ("MY_CREDENTIALS", True),
        ("BASIC_AUTH", True),
        ("PATH", False),
        ("KEYBOARD_LAYOUT", False),
        ("BYPASS_CACHE", False),
        ("COMPASS_DIR", False),
        ("DEBIAN_FRONTEND", False),
    ],
)
def test_secret_names_are_matched_by_their_parts(name: str, secret: bool) -> None:
    scrubber = Scrubber.from_host({name: "v4lue-of-it"}, home="/nonexistent", hostnames=[], user="")
    assert (scrubber.text("x v4lue-of-it y") != "x v4lue-of-it y") is secret


def test_db_pass_and_my_pw_never_reach_a_bundle_file(tmp_path: Path) -> None:
    scrubber = Scrubber.from_host(
        {"DB_PASS": "hunter2!", "MY_PW": "pw-1234", "PWD": "/srv/checkout"},
        home="/nonexistent",
        hostnames=[],
        user="",
        paths={"<repo>": "/work/r"},
    )
    (tmp_path / "log.txt").write_text("login hunter2! pw-1234 in /srv/checkout/results\n")
    with pytest.raises(BundleError):
        bundle.scan(tmp_path, scrubber)
    bundle_files.copy_scrubbed(tmp_path / "log.txt", tmp_path / "log.txt", scrubber)
    assert (tmp_path / "log.txt").read_text() == "login <DB_PASS> <MY_PW> in <PWD>/results\n"
    bundle.scan(tmp_path, scrubber)


def test_a_bundle_copies_no_file_from_outside_the_results(tmp_path: Path, host: dict[str, str]) -> None:
    """Item 7 for bundles: an artifact path or a symlink that leaves the results folder is not followed."""
    canary = "CANARY-2b7e from outside the results"
    outside = tmp_path / "outside.txt"
    outside.write_text(canary + "\n")
    client = FakeClient()
    client.add_source_image(SOURCE_ID, SOURCE_TAG)
    work = Path(host["home"]) / "mics"
    results = make_results(work / "results", host)
    (results / "cpu" / "artifacts" / "linked.txt").symlink_to(outside)
    data = json.loads((results / "results.json").read_text())
    data["envs"]["cpu"]["artifacts"]["collect_env"] = "../" * 12 + str(outside).lstrip("/")
    data["envs"]["cpu"]["artifacts"]["ds_report"] = str(outside)
    (results / "results.json").write_text(json.dumps(data))
    said: list[str] = []
    request = bundle.BundleRequest(env_id="cpu", out=work / "bundles" / "cpu", results=results)
    result = bundle.make_bundle(
        request, client, Scrubber.from_host(paths={"<repo>": str(bundle.REPO_ROOT)}), say=said.append
    )
    assert not any(canary.encode() in data for data in all_bytes(result.folder).values())
    assert any("not copied: cpu/artifacts/linked.txt" in line for line in said)
    comment = (result.folder / "ISSUE_COMMENT.md").read_text()
    assert "collect_env not read: its path leads outside the results folder" in comment


# ---- the issue comment ------------------------------------------------------------------------------


def _tables(tokens: list[Any]) -> list[list[list[str]]]:
    tables, rows, row, in_cell = [], [], [], False
    for tok in tokens:
        if tok.type == "table_open":
            rows = []
        elif tok.type == "tr_open":
            row = []
        elif tok.type in ("th_open", "td_open"):
            in_cell = True
        elif tok.type == "inline" and in_cell:
            row.append(tok.content)
            in_cell = False
        elif tok.type == "tr_close":
            rows.append(row)
        elif tok.type == "table_close":
            tables.append(rows)
    return tables


def test_issue_comment_is_valid_markdown_whose_facts_match_the_records(
    tmp_path: Path, host: dict[str, str]
) -> None:
    result = new_bundle(tmp_path, host)
    text = (result.folder / "ISSUE_COMMENT.md").read_text()
    assert len(text) <= issue_comment.GITHUB_COMMENT_LIMIT
    md = MarkdownIt("commonmark").enable("table")
    tokens = md.parse(text)
    records = json.loads((result.folder / "results" / "results.json").read_text())["runs"]

    environment = dict(row[:2] for row in _tables(tokens)[0][1:])
    assert environment["torch"] == "2.1.0" and environment["DeepSpeed"] == "0.13.1"
    assert "built on `mics-repro/base:bookworm`" in environment["base image"]

    evidence = next(t for t in _tables(tokens) if t[0][:2] == ["run", "outcome"])
    rows = {r[0].strip("`"): r for r in evidence[1:]}
    assert set(rows) == {r["run_name"] for r in records}
    for rec in records:
        row = rows[rec["run_name"]]
        assert row[1] == f"**{rec['outcome']}**" and row[2] == rec["signature"]
        assert row[3] == str(rec["illegal_work_messages"])

    # Headline first: the first heading names what reproduced, from the records.
    first = next(t for t in tokens if t.type == "inline")
    assert first.content == "Reproduced on torch 2.1.0 + DeepSpeed 0.13.1: Flat MiCS, Hierarchical MiCS"

    # The folded blocks are real HTML blocks around fenced code, and every fence is closed.
    html = [t.content.strip() for t in tokens if t.type == "html_block"]
    assert html.count("</details>") == 2 and sum(h.startswith("<details>") for h in html) == 2
    fences = [t for t in tokens if t.type == "fence"]
    assert [f.info for f in fences] == ["diff", "sh", "text", "text"]
    assert "SECRET_TOKEN" in fences[2].content  # ds_report, scrubbed, inside its fence
    assert fences[0].content == (result.folder / "deepspeed-0.13.1.patch").read_text()

    # Root-cause links point at the lines of the release's own source.
    refs = source_refs.find_refs("0.13.1", {source_refs.COMM: COMM_SOURCE, source_refs.MICS: MICS_SOURCE})
    links = [
        t.attrGet("href")
        for t in tokens
        if t.type == "inline"
        for t in (t.children or [])
        if t.type == "link_open"
    ]
    assert links == [r.url("0.13.1") for r in refs.refs]
    ret = refs.get("comm.return")
    assert ret is not None and ret.start == 12


def test_issue_comment_headline_follows_the_records(tmp_path: Path) -> None:
    b = ResultsBuilder(tmp_path, "r")
    b.env("cpu")
    standard_env(b, "cpu", bug=False)
    data = json.loads(b.write().joinpath("results.json").read_text())
    refs = source_refs.Refs("0.13.1", (), source_refs.EXPECTED)
    text = issue_comment.render_fitting(
        issue_comment.IssueInput(
            "cpu", data["envs"]["cpu"], data["runs"], refs, "", "", "r", "c", ["true"], "make repro"
        )
    )
    assert text.startswith("### Not reproduced on torch 2.1.0 + DeepSpeed 0.13.1")
    assert "Not found in this release's source" in text


def test_issue_comment_fits_a_github_comment(tmp_path: Path) -> None:
    b = ResultsBuilder(tmp_path, "r")
    b.env("cpu")
    standard_env(b, "cpu")
    data = json.loads(b.write().joinpath("results.json").read_text())
    refs = source_refs.Refs("0.13.1", (), ())
    huge = "x" * 50_000 + "\n"
    text = issue_comment.render_fitting(
        issue_comment.IssueInput(
            "cpu", data["envs"]["cpu"], data["runs"], refs, "p.patch", "diff\n", huge, huge, ["true"], "make"
        )
    )
    assert len(text) <= issue_comment.GITHUB_COMMENT_LIMIT and "cut to fit a GitHub comment" in text
