"""Loading and merging results folders into one consistent view."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.report_records import ResultsBuilder, rocm56_invocation, standard_env

from repro.core.errors import UsageError
from repro.report.build import build_report
from repro.report.merge import load_and_merge


def two_invocations(tmp_path: Path) -> tuple[Path, Path]:
    first = ResultsBuilder(tmp_path, "20250101T000000Z-cpu", started_at="2025-01-01T00:00:00+00:00")
    first.env("cpu")
    standard_env(first, "cpu")
    return first.write(), rocm56_invocation(tmp_path)


def test_two_invocations_merge_into_one_view(tmp_path: Path) -> None:
    a, b = two_invocations(tmp_path)
    merged = load_and_merge([b, a])  # order given does not matter: oldest first
    assert [inv.folder.name for inv in merged.invocations] == [a.name, b.name]
    assert list(merged.envs) == ["cpu", "rocm56"]
    expected = sum(len(json.loads((f / "results.json").read_text())["runs"]) for f in (a, b))
    assert len(merged.runs) == expected
    assert merged.envs["rocm56"].invocation.command == "make repro ENV=rocm56"
    assert merged.notes == ()


def test_merged_report_is_consistent(tmp_path: Path) -> None:
    a, b = two_invocations(tmp_path)
    out = tmp_path / "out"
    paths = build_report([a, b], out, gpu_env_hint=("rocm56",))
    data = json.loads(paths.data.read_text())
    assert [h["env"] for h in data["headline"]] == ["cpu", "rocm56"]
    assert data["cause"]["verdict"] == "mics-logic"  # needs the GPU runs of the second folder
    keys = [(r["env"], r["scenario"], r["dtype"], r["transport"], r["world_size"]) for r in data["table"]]
    assert len(keys) == len(set(keys))
    assert sorted(data["results"]) == sorted(str(p.resolve()) for p in (a, b))


def test_same_run_twice_keeps_the_newest_with_a_note(tmp_path: Path) -> None:
    old = ResultsBuilder(tmp_path, "20250101T000000Z-cpu", started_at="2025-01-01T00:00:00+00:00")
    old.env("cpu")
    old.clean("cpu", "zero3")
    old.diverging_bug("cpu", "mics", "fixed")
    new = ResultsBuilder(tmp_path, "20250103T000000Z-cpu", started_at="2025-01-03T00:00:00+00:00")
    new.env("cpu")
    new.clean("cpu", "mics", "fixed")
    merged = load_and_merge([new.write(), old.write()])
    fixed = [r for r in merged.runs if r.patch == "fixed"]
    assert [r.outcome.value for r in fixed] == ["clean"]
    assert fixed[0].invocation.folder.name == "20250103T000000Z-cpu"
    assert [r.outcome.value for r in merged.superseded] == ["reproduced"]
    assert len(merged.notes) == 1 and "cpu/mics-fixed-fp32-async-w2" in merged.notes[0]
    assert len([r for r in merged.runs if r.scenario == "zero3"]) == 1


def test_conflicting_pins_are_an_error(tmp_path: Path) -> None:
    one = ResultsBuilder(tmp_path, "20250101T000000Z-cpu")
    one.env("cpu", torch="2.1.0")
    one.clean("cpu", "zero3")
    two = ResultsBuilder(tmp_path, "20250102T000000Z-cpu", started_at="2025-01-02T00:00:00+00:00")
    two.env("cpu", torch="2.1.2")
    two.clean("cpu", "zero3")
    with pytest.raises(UsageError) as info:
        load_and_merge([one.write(), two.write()])
    assert "torch" in info.value.why and info.value.exit_code == UsageError.exit_code


def test_same_folder_twice_is_read_once(tmp_path: Path) -> None:
    b = ResultsBuilder(tmp_path, "20250101T000000Z-cpu")
    b.env("cpu")
    standard_env(b, "cpu")
    folder = b.write()
    (tmp_path / "latest").symlink_to(folder.name)
    merged = load_and_merge([folder, tmp_path / "latest"])
    assert len(merged.invocations) == 1
    assert len(merged.runs) == len(b.runs) and not merged.superseded
    assert any("more than once" in n for n in merged.notes)


def test_interrupted_invocation_is_noted(tmp_path: Path) -> None:
    b = ResultsBuilder(tmp_path, "20250101T000000Z-cpu", interrupted=True)
    b.env("cpu")
    b.clean("cpu", "zero3")
    merged = load_and_merge([b.write()])
    assert any("interrupted" in n for n in merged.notes)


def test_missing_results_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no results.json"):
        load_and_merge([tmp_path])


def test_no_folder_given() -> None:
    with pytest.raises(UsageError):
        load_and_merge([])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema=99), "schema"),
        (lambda d: d["runs"][0].update(outcome="exploded"), "outcome"),
        (lambda d: d["runs"][0].update(signature=None), "signature"),
        (lambda d: d["runs"][0].update(env="elsewhere"), "elsewhere"),
        (lambda d: d.pop("envs"), "envs"),
    ],
)
def test_damaged_results_are_rejected_with_the_reason(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    b = ResultsBuilder(tmp_path, "20250101T000000Z-cpu")
    b.env("cpu")
    b.clean("cpu", "zero3")
    folder = b.write()
    data = json.loads((folder / "results.json").read_text())
    mutate(data)
    (folder / "results.json").write_text(json.dumps(data))
    with pytest.raises(UsageError, match=message):
        load_and_merge([folder])


def test_truncated_results_json(tmp_path: Path) -> None:
    folder = tmp_path / "20250101T000000Z-cpu"
    folder.mkdir()
    (folder / "results.json").write_text('{"schema": 1, "runs": [')
    with pytest.raises(UsageError, match="not valid JSON"):
        load_and_merge([folder])


# ---- results.json is input: damaged fields and paths that leave the folder (issue 12, items 7 and 10) ----


def _one_env_folder(tmp_path: Path) -> Path:
    b = ResultsBuilder(tmp_path / "results", "20250101T000000Z-cpu")
    b.env("cpu")
    standard_env(b, "cpu")
    return b.write()


def _edit(folder: Path, mutate) -> None:  # type: ignore[no-untyped-def]
    data = json.loads((folder / "results.json").read_text())
    mutate(data)
    (folder / "results.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("mutate", "names"),
    [
        (lambda d: d.update(runs=None), "runs is null, not a list"),
        (lambda d: d.update(envs=["cpu"]), "envs is list, not an object"),
        (lambda d: d["runs"][0].update(world_size="four"), 'runs[0].world_size is "four"'),
        (lambda d: d["runs"][1].update(losses="nan"), "losses"),
        (lambda d: d["runs"][1].update(shard_size=2.5), "runs[1].shard_size is 2.5"),
        (lambda d: d["runs"].__setitem__(0, "zero3"), 'runs[0] is "zero3", not an object'),
        (lambda d: d["envs"]["cpu"].update(pins="torch==2.1"), "pins"),
    ],
)
def test_make_report_names_a_malformed_field_instead_of_a_traceback(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mutate,
    names: str,  # type: ignore[no-untyped-def]
) -> None:
    from repro.cli.main import main

    folder = _one_env_folder(tmp_path)
    _edit(folder, mutate)
    code = main(["report", "--results", str(folder), "--results-root", str(tmp_path / "results")])
    err = capsys.readouterr().err
    assert code == UsageError.exit_code
    assert names in err and "results.json" in err and "Traceback" not in err
    assert not (folder / "report.html").exists()


def test_artifact_paths_outside_the_results_folder_are_noted_not_read(tmp_path: Path) -> None:
    from repro.cli.main import main

    canary = "CANARY-8d1f outside the results folder"
    outside = tmp_path / "private.txt"
    outside.write_text(canary + "\n")
    folder = _one_env_folder(tmp_path)
    (folder / "cpu" / "artifacts" / "linked.txt").symlink_to(outside)
    climbing = "../" * (len(folder.resolve().parts) + 2) + str(outside).lstrip("/")
    _edit(
        folder,
        lambda d: d["envs"]["cpu"]["artifacts"].update(
            ds_report=climbing,
            collect_env=str(outside),
            linked="cpu/artifacts/linked.txt",
            near="../private.txt",
        ),
    )
    assert main(["report", "--results", str(folder), "--results-root", str(tmp_path / "results")]) == 0
    html = (folder / "report.html").read_text()
    markdown = (folder / "REPORT.md").read_text()
    assert canary not in html and canary not in markdown
    merged = load_and_merge([folder])
    assert merged.envs["cpu"].artifacts == {}
    refused = sorted(n.split()[3] for n in merged.notes if "outside the results folder" in n)
    assert refused == ["collect_env", "ds_report", "linked", "near"]
    assert "outside the results folder" in markdown  # the note is in the report, not just the log


def test_results_json_is_readable_like_any_file_the_user_writes(tmp_path: Path) -> None:
    import os
    import stat

    from repro.workload.record import write_json_atomic

    old = os.umask(0o022)
    try:
        write_json_atomic(str(tmp_path / "results.json"), {"schema": 1})
        folder = _one_env_folder(tmp_path)
        build_report([folder], folder)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "results.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((folder / "report.html").stat().st_mode) == 0o644
