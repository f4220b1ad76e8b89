"""Round 3, item 2: no command loses or overwrites a file of the user's.

Every command that writes does so only inside a folder it made, was given empty, or wrote before,
never through a symbolic link, and removes or replaces only what it wrote; anything else is exit 2
naming the path. Each test keeps a real file of the user's outside the output (`precious/`) and
checks that it survives byte for byte and that nothing new appears next to it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from fixtures.report_records import ResultsBuilder, standard_env

from repro.cli import main as cli
from repro.core import safe_write
from repro.core.errors import UsageError
from repro.core.results import LATEST, open_invocation_dir, point_latest
from repro.core.scrub import Scrubber
from repro.report.build import build_report
from repro.upstream.cluster import scripts as cluster
from repro.upstream.issue import make as issue
from tests.fixtures.resume_job_engine import JobEngine, run_job
from tests.fixtures.stand_in_engine import PlanEngine, use_engine

MINE = b"\x89PNG my own plot, not the tool's\n"


def precious(tmp_path: Path, rel: str = "precious/mine.png") -> Path:
    """A file of the user's: what each test proves survives."""
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(MINE)
    return path


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (not following links) with its bytes: to prove nothing was
    written, removed or changed there."""
    found = {}
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(dirpath) / name
            found[str(path.relative_to(folder))] = b"<link>" if path.is_symlink() else path.read_bytes()
    return found


def results(tmp_path: Path, name: str = "20250101T000000Z-cpu", *, bug: bool = True) -> Path:
    b = ResultsBuilder(tmp_path, name)
    b.env("cpu")
    standard_env(b, "cpu")
    if bug:
        b.clean("cpu", "zero3", dtype="bf16")
    return b.write()


# -- make report ---------------------------------------------------------------------------------


def test_report_into_a_folder_of_the_users_is_refused(tmp_path: Path) -> None:
    mine = precious(tmp_path, "precious/plots/mine.png")
    before = tree(tmp_path / "precious")
    with pytest.raises(UsageError, match="already holds other files") as refused:
        build_report([results(tmp_path)], tmp_path / "precious")
    assert refused.value.exit_code == 2 and str(tmp_path / "precious") in str(refused.value)
    assert mine.read_bytes() == MINE and tree(tmp_path / "precious") == before


def test_report_never_writes_through_a_linked_plots_folder(tmp_path: Path) -> None:
    mine = precious(tmp_path, "precious/plots/mine.png")
    before = tree(tmp_path / "precious")
    folder = results(tmp_path)
    (folder / "plots").symlink_to(tmp_path / "precious" / "plots", target_is_directory=True)
    with pytest.raises(UsageError, match="symbolic link") as refused:
        build_report([folder], folder)
    assert str(folder / "plots") in str(refused.value)
    assert mine.read_bytes() == MINE and tree(tmp_path / "precious") == before


def test_report_removes_only_the_plots_it_wrote(tmp_path: Path) -> None:
    folder = results(tmp_path)
    mine = precious(folder, "plots/mine.png")  # the user's own image, kept next to the report's
    first = build_report([folder], folder)
    assert len(first.plots) == 2 and mine.read_bytes() == MINE
    # The env's runs are gone from the next report: its plots go, the user's file stays.
    second = build_report([results(tmp_path, "20250102T000000Z-cpu", bug=False)], folder)
    left = sorted(p.name for p in (folder / "plots").iterdir())
    assert left == sorted(["mine.png", *(p.name for p in second.plots)])
    assert mine.read_bytes() == MINE


def test_report_does_not_replace_a_plot_it_did_not_write(tmp_path: Path) -> None:
    folder = results(tmp_path)
    slug = build_report([folder], tmp_path / "probe").plots[0].name
    theirs = precious(folder, f"plots/{slug}")
    for _ in range(2):  # the refused report claimed nothing in its manifest: refused again
        with pytest.raises(UsageError, match="not written by this tool"):
            build_report([folder], folder)
    assert theirs.read_bytes() == MINE


# -- make issue ----------------------------------------------------------------------------------


def bisect_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "bisect-1"
    folder.mkdir()
    (folder / "results.json").write_text("{}")
    (folder / "bisect.json").write_text(
        json.dumps(
            {
                "kind": "bisect",
                "axis": "deepspeed",
                "env": "cpu",
                "scenario": "mics",
                "patch": "stock",
                "bad_if": "failed",
                "status": "found",
                "first_bad": "0.19.3",
                "last_good": "0.19.2",
                "unknown_between": [],
                "evidence": {},
                "change_points": [],
                "probes": [],
                "repro_command": "make repro ENV=cpu DEEPSPEED=0.19.3",
            }
        )
    )
    return folder


def scrubber() -> Scrubber:
    return Scrubber.from_host({}, home="/home/alice", hostnames=["gpubox17"], user="alice")


def test_issue_never_writes_through_a_linked_issue_md(tmp_path: Path) -> None:
    mine = precious(tmp_path, "precious/notes.md")
    folder = bisect_folder(tmp_path)
    (folder / "ISSUE.md").symlink_to(mine)
    with pytest.raises(UsageError, match="symbolic link") as refused:
        issue.write(folder, scrubber())
    assert str(folder / "ISSUE.md") in str(refused.value)
    assert mine.read_bytes() == MINE
    # A regular ISSUE.md in the walk's folder is the one an earlier `make issue` wrote: replaced.
    (folder / "ISSUE.md").unlink()
    assert issue.write(folder, scrubber()).read_text().startswith("# MiCS (mics")
    assert issue.write(folder, scrubber()).is_file()


def test_issue_out_an_existing_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = precious(tmp_path, "precious/notes.md")
    folder = bisect_folder(tmp_path)
    code = cli.main(["issue", "--results", str(folder), "--out", str(mine)])
    assert code == 2 and str(mine) in capsys.readouterr().err
    assert mine.read_bytes() == MINE
    link = tmp_path / "link.md"
    link.symlink_to(mine)
    assert cli.main(["issue", "--results", str(folder), "--out", str(link)]) == 2
    assert mine.read_bytes() == MINE and link.is_symlink()
    new = tmp_path / "new.md"
    assert cli.main(["issue", "--results", str(folder), "--out", str(new)]) == 0
    assert new.read_text().startswith("# MiCS")


# -- make cluster --------------------------------------------------------------------------------


def scripts() -> list[cluster.Script]:
    return cluster.render(cluster.CPU_TWIN, env_id="cpu", image_ref="mics-repro-bundle:cpu")


def test_cluster_into_a_folder_of_the_users_is_refused(tmp_path: Path) -> None:
    mine = precious(tmp_path, "precious/README.md")
    before = tree(tmp_path / "precious")
    with pytest.raises(UsageError, match="already holds other files") as refused:
        cluster.write(scripts(), tmp_path / "precious")
    assert refused.value.exit_code == 2 and str(tmp_path / "precious") in str(refused.value)
    assert mine.read_bytes() == MINE and tree(tmp_path / "precious") == before


def test_cluster_never_writes_through_a_link_and_rewrites_only_its_own_files(tmp_path: Path) -> None:
    mine = precious(tmp_path, "precious/ds.json")
    out = tmp_path / "launchers"
    cluster.write(scripts(), out)
    extra = precious(out, "notes.txt")  # the user's note, added later: never touched
    cluster.write(scripts(), out)  # a second run replaces the files it wrote
    assert extra.read_bytes() == MINE
    # A linked configs/ leads to the user's folder: refused, nothing written there.
    configs = out / "configs"
    for path in configs.iterdir():
        path.unlink()
    configs.rmdir()
    configs.symlink_to(tmp_path / "precious", target_is_directory=True)
    before = tree(tmp_path / "precious")
    with pytest.raises(UsageError, match="symbolic link"):
        cluster.write(scripts(), out)
    assert mine.read_bytes() == MINE and tree(tmp_path / "precious") == before


def test_cluster_cli_refuses_an_existing_folder_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = precious(tmp_path, "precious/README.md")
    assert cli.main(["cluster", "--out", str(tmp_path / "precious"), "--layout", "cpu-twin"]) == 2
    assert str(tmp_path / "precious") in capsys.readouterr().err
    assert mine.read_bytes() == MINE


# -- results/latest ------------------------------------------------------------------------------


def test_a_plain_file_named_latest_is_not_replaced(tmp_path: Path) -> None:
    root = tmp_path / "results"
    mine = precious(root, LATEST)
    with pytest.raises(UsageError, match="is a file") as refused:
        open_invocation_dir(root, None, ["cpu"])
    assert str(root / LATEST) in str(refused.value)
    assert mine.read_bytes() == MINE and sorted(os.listdir(root)) == [LATEST]  # no folder made
    with pytest.raises(UsageError):
        point_latest(root, root / "20250101T000000Z-cpu")
    assert mine.read_bytes() == MINE


def test_a_folder_named_latest_is_refused_not_a_crash(tmp_path: Path) -> None:
    root = tmp_path / "results"
    mine = precious(root, f"{LATEST}/mine.png")
    with pytest.raises(UsageError, match="is a folder") as refused:
        open_invocation_dir(root, None, ["cpu"])
    assert refused.value.exit_code == 2 and str(root / LATEST) in str(refused.value)
    with pytest.raises(UsageError, match="is a folder"):
        point_latest(root, root / "20250101T000000Z-cpu")
    assert mine.read_bytes() == MINE
    # The link this tool keeps there is still moved on.
    (root / LATEST / "mine.png").unlink()
    (root / LATEST).rmdir()
    folder, _ = open_invocation_dir(root, None, ["cpu"])
    point_latest(root, folder)
    assert os.readlink(root / LATEST) == folder.name


# -- RESUME=1 ------------------------------------------------------------------------------------


@pytest.fixture
def interrupted_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobEngine:
    """A `make run` cut short in its stock run: RESUME=1 would clear custom-stock/ and run it."""
    engine = JobEngine(cut=("stock",))
    monkeypatch.setattr("repro.cli.job_commands._engine", lambda choice: engine)
    assert run_job(tmp_path) == 130
    assert (tmp_path / "out" / "cpu" / "custom-stock" / "job.log").is_file()
    engine.outs.clear()
    return engine


def test_resume_with_a_linked_env_folder_deletes_and_writes_nothing_there(
    tmp_path: Path, interrupted_job: JobEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    elsewhere = tmp_path / "precious" / "cpu"
    elsewhere.parent.mkdir()
    (out / "cpu").rename(elsewhere)  # the user keeps the env's folder elsewhere and links to it
    mine = precious(tmp_path, "precious/cpu/custom-stock/mine.png")
    (out / "cpu").symlink_to(elsewhere, target_is_directory=True)
    before = tree(tmp_path / "precious")
    capsys.readouterr()
    assert run_job(tmp_path, "--resume") == 2
    assert str(out / "cpu") in capsys.readouterr().err
    assert interrupted_job.outs == []
    assert mine.read_bytes() == MINE and tree(tmp_path / "precious") == before


def test_resume_with_a_linked_run_folder_writes_nothing_through_it(
    tmp_path: Path, interrupted_job: JobEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    mine = precious(tmp_path, "precious/stock/mine.png")
    run = out / "cpu" / "custom-stock"
    for path in run.iterdir():
        path.unlink()
    run.rmdir()
    run.symlink_to(mine.parent, target_is_directory=True)
    before = tree(tmp_path / "precious")
    capsys.readouterr()
    assert run_job(tmp_path, "--resume") == 2
    assert str(run) in capsys.readouterr().err
    assert interrupted_job.outs == []
    assert mine.read_bytes() == MINE and tree(tmp_path / "precious") == before


def test_repro_resume_with_a_linked_env_folder_runs_no_suite_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = use_engine(monkeypatch, PlanEngine(stop_at=("cpu",)))  # its suite is interrupted each time
    out = tmp_path / "out"
    argv = ["repro", "--env", "cpu", "--world-size", "2", "--out", str(out)]
    assert cli.main(argv) == 130
    elsewhere = tmp_path / "precious" / "cpu"
    elsewhere.parent.mkdir()
    (out / "cpu").rename(elsewhere)
    mine = precious(tmp_path, "precious/cpu/runs/control-stock-fp32-async-w2/mine.png")
    (out / "cpu").symlink_to(elsewhere, target_is_directory=True)
    before = tree(tmp_path / "precious")
    engine.calls.clear()
    capsys.readouterr()
    assert cli.main([*argv, "--resume"]) == 2
    assert str(out / "cpu") in capsys.readouterr().err
    assert engine.calls == []
    assert mine.read_bytes() == MINE and tree(tmp_path / "precious") == before


# -- the one door ----------------------------------------------------------------------------------


def test_write_file_refuses_a_link_anywhere_below_the_root(tmp_path: Path) -> None:
    mine = precious(tmp_path, "precious/a.txt")
    root = tmp_path / "out"
    (root / "x").mkdir(parents=True)
    (root / "x" / "y").symlink_to(tmp_path / "precious", target_is_directory=True)
    with pytest.raises(UsageError, match="symbolic link"):
        safe_write.write_file(root, "x/y/a.txt", b"new", replace=True)
    with pytest.raises(UsageError, match="symbolic link"):
        safe_write.check_inside(root, "x/y/z")
    (root / "f.txt").symlink_to(mine)
    with pytest.raises(UsageError, match="symbolic link"):
        safe_write.write_file(root, "f.txt", b"new", replace=True)
    assert not safe_write.remove_file(root, "f.txt")  # a link is not a file this tool wrote
    assert (root / "f.txt").is_symlink() and mine.read_bytes() == MINE
    with pytest.raises(UsageError, match="not written by this tool"):
        safe_write.write_file(tmp_path / "precious", "a.txt", b"new")
    assert mine.read_bytes() == MINE
    with pytest.raises(UsageError, match="not a folder"):
        safe_write.write_file(tmp_path / "precious", "a.txt/b", b"new")


# -- the other writers: bundle archive, gpu-check, bisect/survey/probe OUT, pr-regression --------------


def test_bundle_archive_never_replaces_a_file_next_to_the_bundle(tmp_path: Path) -> None:
    from repro.upstream.bundle.files import archive

    bundle = tmp_path / "bundles" / "cpu"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text("{}")
    mine = precious(tmp_path, "bundles/cpu.tar")
    with pytest.raises(UsageError, match="already exists") as refused:
        archive(bundle)
    assert str(mine) in str(refused.value) and mine.read_bytes() == MINE
    mine.unlink()
    mine.symlink_to(precious(tmp_path))  # a link at the archive's name: not followed either
    with pytest.raises(UsageError, match="already exists"):
        archive(bundle)
    assert (tmp_path / "precious" / "mine.png").read_bytes() == MINE
    mine.unlink()
    assert archive(bundle).is_file() and sorted(os.listdir(bundle.parent)) == ["cpu", "cpu.tar"]


class NoDevice:
    """gpu-check must refuse OUT= before it asks the host anything."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the device was used ({name}) before OUT= was checked")


def test_gpu_check_into_a_folder_of_the_users_is_refused(tmp_path: Path) -> None:
    from repro.matrix.schema import load_matrix
    from repro.run.gpu_check import gpu_check

    mine = precious(tmp_path, "precious/gpu-check.txt")
    before = tree(tmp_path / "precious")
    with pytest.raises(UsageError, match="already holds other files"):
        gpu_check(tmp_path / "precious", NoDevice(), load_matrix())
    assert mine.read_bytes() == MINE and tree(tmp_path / "precious") == before


def test_bisect_out_a_folder_of_the_users_is_refused(tmp_path: Path) -> None:
    from repro.bisect.driver import Folder

    mine = precious(tmp_path, "precious/notes.md")
    with pytest.raises(UsageError, match="already holds other files"):
        Folder(tmp_path / "results", tmp_path / "precious").open("bisect-torch", "bisect.json")
    assert sorted(os.listdir(tmp_path / "precious")) == ["notes.md"] and mine.read_bytes() == MINE
    folder, fresh = Folder(tmp_path / "results", tmp_path / "new").open("bisect-torch", "bisect.json")
    assert folder == tmp_path / "new" and folder.is_dir() and not fresh


def test_bisect_refuses_a_file_named_latest_before_making_a_folder(tmp_path: Path) -> None:
    from repro.bisect.driver import Folder

    mine = precious(tmp_path, f"results/{LATEST}")
    with pytest.raises(UsageError, match="is a file"):
        Folder(tmp_path / "results").open("bisect-torch", "bisect.json")
    assert os.listdir(tmp_path / "results") == [LATEST] and mine.read_bytes() == MINE


def test_pr_regression_work_a_folder_of_the_users_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = precious(tmp_path, "precious/stock/junit-stock.xml")
    before = tree(tmp_path / "precious")
    code = cli.main(["pr-regression", "--python", "python3", "--work", str(tmp_path / "precious")])
    assert code == 2 and str(tmp_path / "precious") in capsys.readouterr().err
    assert mine.read_bytes() == MINE and tree(tmp_path / "precious") == before


def test_clean_refuses_a_linked_results_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = precious(tmp_path, "precious/run/mine.png")
    before = tree(tmp_path / "precious")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "results").symlink_to(tmp_path / "precious", target_is_directory=True)
    (repo / "bundles").mkdir()  # the tool's: would go, but only once every path is checked
    monkeypatch.setattr("repro.cli.run_commands.DEFAULT_RESULTS_ROOT", repo / "results")
    monkeypatch.setattr("repro.cli.run_commands.REPO_ROOT", repo)
    assert cli.main(["clean"]) == 2
    assert str(repo / "results") in capsys.readouterr().err
    assert (repo / "results").is_symlink() and (repo / "bundles").is_dir()
    assert mine.read_bytes() == MINE and tree(tmp_path / "precious") == before


def test_the_suite_clears_no_runs_through_a_linked_runs_folder(tmp_path: Path) -> None:
    from repro.workload import resume

    mine = precious(tmp_path, "precious/mics-stock-fp32-async-w2/mine.png")
    out = tmp_path / "out" / "cpu"
    out.mkdir(parents=True)
    (out / "runs").symlink_to(tmp_path / "precious", target_is_directory=True)
    assert resume.clear_stale(str(out), ["mics-stock-fp32-async-w2"]) == []
    assert mine.read_bytes() == MINE


def test_a_manifest_that_names_paths_outside_is_not_followed(tmp_path: Path) -> None:
    folder = results(tmp_path)
    mine = precious(tmp_path, "precious/mine.png")
    hostile = ["../precious/mine.png", "plots/../../precious/mine.png", str(mine), "plots/", ""]
    (folder / ".report-files.json").write_text(json.dumps({"files": hostile}))
    build_report([folder], folder)
    assert mine.read_bytes() == MINE
    out = tmp_path / "launchers"
    cluster.write(scripts(), out)
    (out / ".cluster-files.json").write_text(json.dumps({"files": ["../precious/mine.png", str(mine)]}))
    for _ in range(2):  # the refused run claimed nothing in the manifest: refused again
        with pytest.raises(UsageError, match="not written by this tool"):  # its files are no longer listed
            cluster.write(scripts(), out)
    assert mine.read_bytes() == MINE


def fake_bench_command(argv: list[str], **kw: Any) -> Any:
    """Every step of `make bench` succeeds; a suite leaves one clean record."""
    from repro.core.cmd import CmdResult

    if argv[3] == "repro":
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        runs = [{"run_name": "zero3", "outcome": "clean", "signature": "none", "durations": {"total_s": 1}}]
        (out / "results.json").write_text(json.dumps({"runs": runs}))
    return CmdResult(tuple(argv), 0, "", "", False, 1.0)


def test_bench_never_appends_through_a_linked_bench_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from repro.run import bench

    mine = precious(tmp_path, "precious/notes.jsonl")
    (tmp_path / "repo" / "results").mkdir(parents=True)
    (tmp_path / "repo" / "results" / "bench.jsonl").symlink_to(mine)
    monkeypatch.setattr(bench, "REPO", tmp_path / "repo")
    monkeypatch.setattr(bench.cmd, "run", fake_bench_command)
    with pytest.raises(UsageError, match="symbolic link"):
        bench.bench("cpu", "venv")
    assert mine.read_bytes() == MINE


def test_a_report_made_before_the_manifest_is_re_rendered_in_place(tmp_path: Path) -> None:
    folder = results(tmp_path)
    first = build_report([folder], folder)
    (folder / ".report-files.json").unlink()  # as a report of an earlier version left it
    mine = precious(folder, "plots/mine.png")
    second = build_report([folder], folder)  # its plots are known from its report.json
    assert [p.name for p in second.plots] == [p.name for p in first.plots] and mine.read_bytes() == MINE


def test_a_folder_that_cannot_be_written_is_a_usage_error(tmp_path: Path) -> None:
    # /proc takes no new entries, even for root (tests may run as root, so no chmod here).
    with pytest.raises(UsageError, match="cannot write /proc/"):
        safe_write.write_file(Path("/proc"), "mics-repro-test/x", b"")
    with pytest.raises(UsageError, match="cannot write"):
        safe_write.write_file(tmp_path / "missing", "x", b"")
