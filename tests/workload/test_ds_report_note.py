"""Issue 33 item 5: DeepSpeed >= 0.14 installed with the GPUs hidden records accelerator 'cpu';
the GPU env's ds_report artifact opens with a note saying so. A stand-in `deepspeed` package
(its git_version_info and env_report) plays the installed DeepSpeed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from repro.workload import ds_report

REPORT = "DeepSpeed general environment info:"


def _fake_deepspeed(root: Path, monkeypatch: pytest.MonkeyPatch, accelerator: str | None) -> None:
    pkg = root / "deepspeed"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    info = "version = '0.14.5'\n"
    if accelerator is not None:
        info += f"accelerator_name = {accelerator!r}\n"
    (pkg / "git_version_info.py").write_text(info)
    (pkg / "env_report.py").write_text(f"def main():\n    print({REPORT!r})\n")
    for name in [m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(root))


def test_gpu_report_of_a_gpu_hidden_install_opens_with_the_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_deepspeed(tmp_path, monkeypatch, "cpu")
    assert ds_report.main(["--device", "gpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[mics-repro] note: DeepSpeed 0.14.5 was installed with the GPUs hidden")
    assert "'cpu'" in lines[0] and "ran_on" in lines[0]
    assert lines[1] == REPORT  # DeepSpeed's own report follows, unchanged


@pytest.mark.parametrize(
    ("device", "accelerator"),
    [("gpu", "cuda"), ("gpu", None), ("cpu", "cpu")],  # saw the GPUs; DeepSpeed < 0.14; a CPU env
)
def test_no_note_where_the_record_is_right(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    device: str,
    accelerator: str | None,
) -> None:
    _fake_deepspeed(tmp_path, monkeypatch, accelerator)
    monkeypatch.setattr("repro.workload.cpu.shims.install_placeholders", lambda version: [])
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # main() sets it for a CPU report: undone afterwards
    assert ds_report.install_note(device) is None
    assert ds_report.main(["--device", device]) == 0
    assert capsys.readouterr().out.splitlines() == [REPORT]
