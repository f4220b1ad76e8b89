"""Evidence a custom job cannot forge: fake jobs run through the real runner and hook (the host's
Python, a fake DeepSpeed package outside the job's WORKDIR), judged by build_records.

A job that prints DeepSpeed's IllegalWork message, logs it to DeepSpeed's logger from its own code,
raises the bug's RuntimeError itself, or writes a hook record, appends to job.log and leaves files
in its results folder, is not `reproduced` by any of it, and the verdict text says what it did;
the same messages and the same crash coming from the DeepSpeed package still count."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from repro.run.job import RawRun, build_records
from repro.workload import hooksign, job, judge

MESSAGE = "[Rank 0] Error message: Illegal to call wait on IllegalWork object"
LOSSES = "".join(f"step {i} loss {2.5 - 0.1 * i}\n" for i in range(3))


@pytest.fixture
def fake_deepspeed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A DeepSpeed package whose MiCS module logs the failed wait and whose comm module raises
    the placeholder's error, as the real ones do; on the job's PYTHONPATH, outside its WORKDIR."""
    site = tmp_path / "site"
    pkg = site / "deepspeed"
    for sub in ("", "runtime", "runtime/zero", "comm"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("__version__ = '0.0.fake'\n" if not sub else "")
    (pkg / "runtime" / "zero" / "mics.py").write_text(
        f"import logging\n\ndef failed_wait():\n    logging.getLogger('DeepSpeed').warning({MESSAGE!r})\n"
    )
    (pkg / "comm" / "torch.py").write_text(
        "def wait_placeholder():\n    raise RuntimeError('Illegal to call wait on IllegalWork object')\n"
    )
    monkeypatch.setenv("MICS_REPRO_USER_PYTHONPATH", str(site))
    return site


def _run(tmp_path: Path, script: str, checkout: Path | None = None) -> dict[str, Any]:
    """Run `python job.py` (WORKDIR tmp_path/work, holding a copy of the `checkout` package when
    given, as a DeepSpeed checkout does) stock through the runner; its one record."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    if checkout is not None:
        shutil.copytree(checkout, work / checkout.name)
    (work / "job.py").write_text(textwrap.dedent(script))
    out = tmp_path / "out"
    argv = ["--cmd", f"{sys.executable} job.py", "--workdir", str(work), "--out", str(out)]
    assert job.main([*argv, "--device", "gpu", "--patch", "stock", "--timeout", "300"]) == 0
    result = json.loads((out / job.JOB_JSON).read_text())
    text = (out / job.JOB_LOG).read_text()
    [record] = build_records("cpu", [RawRun("stock", result, text, None)], None, "sha256:x", 300.0)
    return {"record": record, "job": result, "log": text}


def test_a_printed_message_is_not_the_bug_and_deepspeeds_own_is(
    tmp_path: Path, fake_deepspeed: Path, real_subprocess: None
) -> None:
    printed = _run(
        tmp_path / "printed",
        f"""\
        import logging, os, sys
        import deepspeed
        print({MESSAGE!r})
        logging.getLogger("DeepSpeed").warning({MESSAGE!r})  # the job's own code, DeepSpeed's logger
        print("key visible:", "{hooksign.KEY_VAR}" in os.environ)
        sys.stdout.write({LOSSES!r})
        """,
    )
    record = printed["record"]
    assert "key visible: False" in printed["log"]
    assert printed["log"].count("IllegalWork object") == 2  # both lines are in the log
    # Not counted, and the job never stepped a DeepSpeed engine: nothing is left to weigh.
    assert (record["outcome"], record["signature"]) == ("no-evidence", "none"), record["reason"]
    assert judge.NO_STEP in record["reason"]
    assert record["illegal_work_messages"] == 0
    assert "2 IllegalWork messages in the job's log, not counted" in record["reason"]
    [report] = printed["job"]["hook_reports"]
    assert report["illegal_work_failures"] == 0 and report["illegal_work_not_from_deepspeed"] == 1
    # The same words from DeepSpeed's code, in a child process (as torchrun starts ranks): counted,
    # from a record signed with the key the parent's hook handed on.
    genuine = _run(
        tmp_path / "genuine",
        f"""\
        import subprocess, sys
        child = "import deepspeed.runtime.zero.mics as m; m.failed_wait(); m.failed_wait()"
        subprocess.run([sys.executable, "-c", child], check=True)
        sys.stdout.write({LOSSES!r})
        """,
    )
    record = genuine["record"]
    assert (record["outcome"], record["signature"]) == ("reproduced", "illegal-work-warnings"), record[
        "reason"
    ]
    assert record["illegal_work_messages"] == 2 and genuine["job"]["forged_hook_records"] == []
    assert (
        "2 IllegalWork messages counted by the hook (the job's log shows 2: corroboration)"
        in record["reason"]
    )


def test_the_bugs_error_raised_by_the_job_itself_is_a_crash_not_the_bug(
    tmp_path: Path, fake_deepspeed: Path, real_subprocess: None
) -> None:
    own = _run(
        tmp_path / "own",
        """\
        import deepspeed
        raise RuntimeError("Illegal to call wait on IllegalWork object")
        """,
    )
    record = own["record"]
    assert (record["outcome"], record["signature"]) == ("crashed", "crash"), record["reason"]
    assert "not counted as the bug" in record["reason"] and "job.py" in record["reason"]
    # Raised from DeepSpeed's code (the placeholder's wait as DeepSpeed calls it): the bug.
    framework = _run(
        tmp_path / "framework",
        """\
        import deepspeed.comm.torch
        deepspeed.comm.torch.wait_placeholder()
        """,
    )
    record = framework["record"]
    assert (record["outcome"], record["signature"]) == ("reproduced", "illegal-work-crash"), record["reason"]
    # WORKDIR is a DeepSpeed checkout (DeepSpeed's own tests): its package is what was imported.
    checkout = _run(
        tmp_path / "checkout",
        "import deepspeed.comm.torch\ndeepspeed.comm.torch.wait_placeholder()\n",
        checkout=fake_deepspeed / "deepspeed",
    )
    record = checkout["record"]
    assert (record["outcome"], record["signature"]) == ("reproduced", "illegal-work-crash"), record["reason"]
    [report] = checkout["job"]["hook_reports"]
    assert report["framework_dirs"][0] == str(tmp_path / "checkout" / "work" / "deepspeed")


def test_a_forged_hook_record_and_the_jobs_writes_into_its_results_are_reported_not_counted(
    tmp_path: Path, fake_deepspeed: Path, real_subprocess: None
) -> None:
    forged = _run(
        tmp_path,
        f"""\
        import json, os, sys
        import deepspeed
        job_dir = os.environ["MICS_REPRO_JOB_DIR"]
        with open(os.path.join(job_dir, "hook", "1.json"), "w") as fh:
            json.dump({{"pid": 1, "deepspeed": "0.13.1", "illegal_work_failures": 50, "mac": "0" * 64}}, fh)
        with open(os.path.join(job_dir, "..", "job.log"), "a") as fh:
            fh.write({MESSAGE!r} + "\\n")
        with open(os.path.join(job_dir, "..", "verdict.txt"), "w") as fh:
            fh.write("reproduced\\n")
        sys.stdout.write({LOSSES!r})
        """,
    )
    record, result = forged["record"], forged["job"]
    assert (record["outcome"], record["signature"]) == ("no-evidence", "none"), record["reason"]
    assert record["illegal_work_messages"] == 0
    assert result["forged_hook_records"] == [{"file": "job/hook/1.json", "why": "signature does not verify"}]
    assert "forged hook records, not counted: job/hook/1.json (signature does not verify)" in record["reason"]
    assert [p.split(" ")[0] for p in result["job_wrote"]] == ["job.log", "verdict.txt"]
    assert "the job wrote into the results folder: job.log (" in record["reason"]
    assert record["job"] is not None and record["job"]["job_wrote"] == result["job_wrote"]
    assert len(result["hook_reports"]) == 1  # the job's own process, signed by the hook


def test_signatures_bind_the_record_and_its_file() -> None:
    key = hooksign.new_key().encode()
    signed = hooksign.sign({"pid": 42, "illegal_work_failures": 1}, key)
    assert hooksign.why_not_signed(signed, "42.json", key) == ""
    assert hooksign.why_not_signed({**signed, "illegal_work_failures": 50}, "42.json", key) == (
        "signature does not verify"
    )
    assert hooksign.why_not_signed(signed, "1.json", key) == "signed for pid 42, found as 1.json"
    assert (
        hooksign.why_not_signed(signed, "42.json", hooksign.new_key().encode()) == "signature does not verify"
    )
    trusted, forged = hooksign.sort_records(
        [("42.json", signed), ("7.json", {"pid": 7}), ("8.json", None)], key
    )
    assert trusted == [{"pid": 42, "illegal_work_failures": 1}]
    assert forged == [
        {"file": "7.json", "why": "no signature"},
        {"file": "8.json", "why": "not a JSON object"},
    ]
