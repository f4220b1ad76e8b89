"""Issue #29 item 6: a report over several folders of the user's own jobs names each job by its
command, gives each its own results-folder row and reproduce line, draws each job (and patch) in
its own colour, and draws NaN the job's framework logged as 0.0 as NaN (counted in "NaN steps").
The folders are made by the real job path (repro.run.job) with the fake job engine."""

from __future__ import annotations

import json
from pathlib import Path

from repro.core.results import InvocationDir, invocation_meta
from repro.report.build import build_report
from repro.report.merge import load_and_merge
from repro.report.plots import plot_group
from repro.run.job import JobRequest, execute_job, reproduce_line
from tests.fixtures.fake_bisect import FakeMatrix
from tests.fixtures.fake_job import BAD_LOG, FakeJobEngine

HF = "torchrun --nproc_per_node 2 hf_train.py --deepspeed ds_config.json"
PLAIN = "python -m torch.distributed.run --nproc_per_node 2 plain.py"
# HF Trainer logs a NaN loss as 0.0 (logging_nan_inf_filter): the hook sees the fixed run's finite.
NAN_AS_ZERO = "[Rank 0] Error message: Illegal to call wait on IllegalWork object\n" + "".join(
    f"step {i} loss {0.0 if i else 2.5}\n" for i in range(4)
)
FINITE = "".join(f"step {i} loss {2.5 - 0.25 * i}\n" for i in range(4))


def job_folder(tmp_path: Path, name: str, command: str, stock_log: str, fixed_log: str) -> Path:
    work = tmp_path / f"work-{name}"
    work.mkdir()
    request = JobRequest(env_id="cpu", command=command, workdir=work, patches=("stock", "fixed"))
    folder = tmp_path / f"results-{name}"
    folder.mkdir()
    inv = InvocationDir(folder, invocation_meta(["run"], reproduce_line(request)))
    inv.save()
    engine = FakeJobEngine(lambda env: stock_log, fixed_log=fixed_log)
    execute_job(request, FakeMatrix().get("cpu"), engine, inv, say=lambda _: None)
    return folder


def two_jobs(tmp_path: Path) -> tuple[Path, Path]:
    return (
        job_folder(tmp_path, "hf", HF, NAN_AS_ZERO, FINITE),
        job_folder(tmp_path, "plain", PLAIN, BAD_LOG, BAD_LOG),
    )


def test_each_job_is_named_by_its_command_with_its_own_folder_and_line(tmp_path: Path) -> None:
    hf, plain = two_jobs(tmp_path)
    paths = build_report([hf, plain], tmp_path / "report")
    text = paths.markdown.read_text()
    html = paths.html.read_text()
    for command, folder in ((HF, hf), (PLAIN, plain)):
        line = json.loads((folder / "results.json").read_text())["invocation"]["command"]
        assert line in text  # its own reproduce line, not only the newest folder's
        assert f"`{folder.name}`" in text and folder.name in html
        assert command[:40] in text and command[:40] in html
    hashes = {
        r["job"]["job_id"] for f in (hf, plain) for r in json.loads((f / "results.json").read_text())["runs"]
    }
    assert len(hashes) == 2
    for job_id in hashes:  # never a bare hash: the id only follows its command
        assert f"your command {job_id}" not in text


def test_nan_logged_as_zero_is_drawn_and_counted_as_nan(tmp_path: Path) -> None:
    hf, plain = two_jobs(tmp_path)
    stock = next(r for r in json.loads((hf / "results.json").read_text())["runs"] if r["patch"] == "stock")
    assert stock["job"]["nan_logged_as_zero_from"] == 1 and stock["losses"][1:] == [0.0, 0.0, 0.0]
    report = build_report([hf, plain], tmp_path / "report")
    rows = json.loads(report.data.read_text())["table"]
    hf_row = next(r for r in rows if r["job"] == stock["job"]["job_id"])
    assert hf_row["stock"]["nan_steps"] == 3 and hf_row["fixed"]["nan_steps"] == 0
    merged = load_and_merge([hf, plain])
    runs = list(merged.runs_of("cpu"))
    plot = plot_group("cpu", ("fp32", "async", 2), runs)
    assert plot is not None
    series = next(s for s in plot.loss if s.label.startswith("torchrun") and s.label.endswith("stock"))
    assert series.values[0] == 2.5 and series.values[1:] == (None, None, None)


def test_each_job_and_patch_has_its_own_colour(tmp_path: Path) -> None:
    from repro.report.plots import run_colors

    hf, plain = two_jobs(tmp_path)
    runs = list(load_and_merge([hf, plain]).runs_of("cpu"))
    colors = run_colors(runs)
    custom = [r for r in runs if r.key.job]
    assert len(custom) == 4 and len({colors[r.ident] for r in custom}) == 4
    plot = plot_group("cpu", ("fp32", "async", 2), runs)
    assert plot is not None
    assert all("[" in s.label and not s.label.startswith("custom") for s in plot.loss)
