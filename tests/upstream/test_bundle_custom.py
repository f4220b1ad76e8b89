"""`make bundle` of `make run CMD=` results: the command and its working directory travel in the
bundle, the manifest checks them as untrusted input, and `verify-bundle` reruns the command in the
bundle's image (through DockerEngine.run_job: workdir bound at its own path, network off) and
compares the outcomes like the suite's.

Default tier: the fake docker-py client of tests/upstream/test_bundle.py; the container run itself is a
DockerEngine whose `run` writes what the in-env job runner would, with outcomes the test chooses.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from repro.core.errors import BundleError
from repro.core.results import InvocationDir, invocation_meta
from repro.core.scrub import Scrubber
from repro.matrix.schema import load_matrix
from repro.run.job import JobRequest, execute_job
from repro.upstream.bundle import files as bundle_files
from repro.upstream.bundle import make as bundle
from repro.upstream.bundle import verify as verify_bundle
from repro.upstream.bundle.manifest import MANIFEST, Manifest, manifest_problems
from tests.fixtures.fake_bundle_docker import SOURCE_ID, SOURCE_TAG, FakeClient
from tests.fixtures.job_docker import STOCK_LOG, JobDocker, project

COMMAND = "torchrun --nproc_per_node 2 train.py --lr 0.1"


def custom_results(root: Path, work: Path, client: FakeClient) -> Path:
    """A results folder of `make run ENV=cpu ENGINE=docker CMD=...`, made by repro.run.job itself."""
    env = load_matrix().get("cpu")
    out = root / "20250101T000000Z-run-cpu"
    out.mkdir(parents=True)
    invocation = InvocationDir(out, invocation_meta(["run", "--env", "cpu"], "make run ENV=cpu"))
    execute_job(
        JobRequest(env_id="cpu", command=COMMAND, workdir=work), env, JobDocker(client), invocation, say=str
    )
    return out


def new_custom_bundle(tmp_path: Path, who: dict[str, str], client: FakeClient) -> bundle.BundleResult:
    client.add_source_image(SOURCE_ID, SOURCE_TAG)
    home = Path(who["home"])
    results = custom_results(home / "results", project(home, who["secret"]), client)
    request = bundle.BundleRequest(env_id="cpu", out=home / "bundles" / "cpu", results=results)
    scrubber = Scrubber.from_host(paths={"<repo>": str(bundle.REPO_ROOT)})
    return bundle.make_bundle(request, client, scrubber, say=lambda _line: None)


def custom_bundle(tmp_path: Path, who: dict[str, str]) -> tuple[FakeClient, bundle.BundleResult]:
    """A custom run's bundle made through a fresh fake Docker client, and that client."""
    client = FakeClient()
    return client, new_custom_bundle(tmp_path, who, client)


def test_a_bundle_of_custom_runs_carries_the_command_and_its_workdir(
    tmp_path: Path, host: dict[str, str]
) -> None:
    result = new_custom_bundle(tmp_path, host, FakeClient())
    manifest = Manifest.read(result.folder)
    assert manifest.job is not None
    assert manifest.job["command"] == COMMAND and manifest.job["workdir"] == bundle_files.WORKDIR_DIR
    assert manifest.job["patches"] == ["stock", "fixed"] and manifest.job["transport"] == "async"
    assert manifest.suite_args == ()  # only the command's runs: no suite to rerun
    assert [(e.run_name, e.outcome) for e in manifest.expected] == [
        ("custom-stock", "reproduced"),
        ("custom-fixed", "clean"),
    ]
    assert {"workdir/train.py", "workdir/data/cfg.json"} <= set(manifest.files)
    assert not any(rel.startswith("workdir/.git") for rel in manifest.files)
    train = (result.folder / "workdir" / "train.py").read_text()
    assert host["secret"] not in train and host["home"] not in train  # scrubbed like every file
    # The by-hand line: the workdir mounted at its own path, no network, the command as one argument.
    by_hand = shlex.split(manifest.commands["run_job_stock"].replace("$PWD", "/b"))
    assert by_hand[by_hand.index("--network") + 1] == "none"
    assert "/b/workdir:/b/workdir" in by_hand and by_hand[by_hand.index("--cmd") + 1] == COMMAND
    # The bundle holds no plain ZeRO-3 run: neither its README nor its comment compares with one.
    for name in ("README.md", "ISSUE_COMMENT.md"):
        text = (result.folder / name).read_text()
        assert "match plain ZeRO-3" not in text and "left plain ZeRO-3's" not in text, name
    assert (
        "this bundle holds no plain\n  ZeRO-3 run to compare losses with"
        in (result.folder / "README.md").read_text()
    )


def test_a_workdir_too_large_is_left_out_and_the_manifest_says_what_to_supply(
    tmp_path: Path, host: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bundle_files, "WORKDIR_MAX_BYTES", 10)
    client, result = custom_bundle(tmp_path, host)
    manifest = Manifest.read(result.folder)
    assert manifest.job is not None and manifest.job["workdir"] is None
    assert not (result.folder / "workdir").exists()
    assert any("workdir left out" in n and "--workdir" in n for n in manifest.notes)
    engine = JobDocker(client)
    with pytest.raises(BundleError, match="working directory"):
        verify_bundle.verify(
            result.folder, client, tmp_path / "v", engine_factory=lambda _c: engine, say=lambda _l: None
        )
    assert engine.runs == []
    supplied = project(tmp_path / "supplied", "x")
    got = verify_bundle.verify(
        result.folder,
        client,
        tmp_path / "v2",
        engine_factory=lambda _c: engine,
        say=lambda _l: None,
        workdir=supplied,
    )
    assert got.ok and len(engine.runs) == 2


def _manifest_data(tmp_path: Path, who: dict[str, str]) -> dict[str, Any]:
    result = new_custom_bundle(tmp_path, who, FakeClient())
    data: dict[str, Any] = json.loads((result.folder / MANIFEST).read_text())
    assert manifest_problems(data) == []
    return data


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("command", "python train.py\nrm -rf /", "job.command holds control characters"),
        ("command", "echo \x1b[2Jhi", "job.command holds control characters"),
        ("command", 42, "job.command is int"),
        ("command", "   ", "job.command is empty"),
        ("workdir", "/etc", "job.workdir is not a relative folder"),
        ("workdir", "../outside", "job.workdir is not a relative folder"),
        ("workdir", "workdir/train.py", "job.workdir names a file"),
        ("patches", ["stock", "patched"], "job.patches is not"),
        ("timeout_s", -1, "job.timeout_s is not a positive number"),
        ("loss_regex", "(", "job.loss_regex is not a regular expression"),
    ],
)
def test_a_crafted_job_block_is_refused(
    tmp_path: Path, host: dict[str, str], field: str, value: Any, problem: str
) -> None:
    data = _manifest_data(tmp_path, host)
    data["job"][field] = value
    assert any(problem in p for p in manifest_problems(data)), manifest_problems(data)


def test_custom_runs_and_an_empty_suite_need_the_job_block(tmp_path: Path, host: dict[str, str]) -> None:
    data = _manifest_data(tmp_path, host)
    data["job"]["shell"] = "/bin/sh"
    assert any("job does not have exactly the fields" in p for p in manifest_problems(data))
    data["job"] = None
    problems = manifest_problems(data)
    assert any("scenario 'custom' is not one of" in p for p in problems)
    assert any("suite_args does not run the env" in p for p in problems)


def test_a_crafted_job_manifest_is_refused_before_anything_runs(tmp_path: Path, host: dict[str, str]) -> None:
    client, result = custom_bundle(tmp_path, host)
    path = result.folder / MANIFEST
    data = json.loads(path.read_text())
    data["job"]["workdir"] = "../../home"
    path.write_text(json.dumps(data))
    engine = JobDocker(client)
    with pytest.raises(BundleError, match="job.workdir"):
        verify_bundle.verify(
            result.folder, client, tmp_path / "v", engine_factory=lambda _c: engine, say=lambda _l: None
        )
    assert engine.runs == [] and client.loaded == []


def test_verify_reruns_the_command_offline_with_its_workdir_bound_and_compares(
    tmp_path: Path, host: dict[str, str]
) -> None:
    client, result = custom_bundle(tmp_path, host)
    manifest = Manifest.read(result.folder)
    before = {p: p.read_bytes() for p in result.folder.rglob("*") if p.is_file()}
    engine = JobDocker(client)
    assert result.archive is not None
    got = verify_bundle.verify(
        result.archive, client, tmp_path / "verify", engine_factory=lambda _c: engine, say=lambda _l: None
    )
    assert client.loaded == [manifest.image["id"]]
    assert [r["command"][r["command"].index("--patch") + 1] for r in engine.runs] == ["stock", "fixed"]
    for run in engine.runs:
        assert run["image"] == manifest.image["id"] and run["network"] is False
        assert run["binds"] == (f"{run['workdir']}:{run['workdir']}:rw",)  # mounted at the same path
        assert run["command"][run["command"].index("--cmd") + 1] == COMMAND
    assert got.ok and [c.run_name for c in got.comparisons] == ["custom-stock", "custom-fixed"]
    verify_bundle.require_match(got)
    saved = json.loads((got.folder / "results.json").read_text())["runs"]
    assert [r["scenario"] for r in saved] == ["custom", "custom"]
    # The job ran in a scratch copy: the bundle folder itself is unchanged.
    assert {p: p.read_bytes() for p in result.folder.rglob("*") if p.is_file()} == before


def test_verify_says_when_the_command_no_longer_comes_out_as_expected(
    tmp_path: Path, host: dict[str, str]
) -> None:
    client, result = custom_bundle(tmp_path, host)
    engine = JobDocker(client, fixed_log=STOCK_LOG)  # the fix no longer helps this command
    got = verify_bundle.verify(
        result.folder, client, tmp_path / "verify", engine_factory=lambda _c: engine, say=lambda _l: None
    )
    assert not got.ok
    bad = [c for c in got.comparisons if not c.ok]
    assert [c.run_name for c in bad] == ["custom-fixed"] and bad[0].outcome != "clean"
    with pytest.raises(BundleError, match="did not reproduce"):
        verify_bundle.require_match(got)
