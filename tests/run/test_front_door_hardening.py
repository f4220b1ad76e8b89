"""Bad input at the front door, round 2 (issue 22, items 9-13): each is a clear message with the
documented exit code, and nothing is written."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from repro.cli import main as cli
from repro.core.errors import BuildError, ConfigError, MatrixError, UsageError
from tests.fixtures.report_records import ResultsBuilder, standard_env
from tests.fixtures.stand_in_engine import FailingBuild, use_engine


def run(args: list[str], tmp_path: Path) -> int:
    return cli.main([*args, "--results-root", str(tmp_path / "results")])


def left_behind(tmp_path: Path) -> list[Path]:
    root = tmp_path / "results"
    return list(root.rglob("*")) if root.exists() else []


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FailingBuild:
    fake = use_engine(monkeypatch, FailingBuild())
    return use_engine(monkeypatch, fake, "job_commands")


# ---- item 9: `make run` checks its time limits as `repro` does -----------------------------------


@pytest.mark.parametrize(
    "flag,value", [("--timeout", "nan"), ("--timeout", "-5"), ("--timeout", "0"), ("--stall-timeout", "inf")]
)
def test_run_refuses_a_time_limit_that_is_not_finite_and_positive(
    flag: str, value: str, tmp_path: Path, engine: FailingBuild, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(["run", "--env", "cpu", "--cmd", "true", "--workdir", str(tmp_path), flag, value], tmp_path)
    assert code == UsageError.exit_code
    assert "finite" in capsys.readouterr().err
    assert engine.calls == [] and left_behind(tmp_path) == []


# ---- item 10: WORLD_SIZE on CPU is bounded by the host -------------------------------------------


def test_a_world_size_the_host_cannot_hold_is_refused_before_any_build(
    tmp_path: Path, engine: FailingBuild, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(["repro", "--env", "cpu", "--world-size", "1000000000"], tmp_path)
    err = capsys.readouterr().err
    assert code == UsageError.exit_code, err
    assert "at most" in err and "prepare" not in engine.calls and left_behind(tmp_path) == []


def test_the_cpu_rank_limit_admits_the_defaults() -> None:
    from repro.engines.preflight import check_world_size, cpu_rank_limit
    from repro.matrix.schema import load_matrix

    env = load_matrix().get("cpu")
    limit = cpu_rank_limit()
    assert limit >= 4 and limit % 2 == 0
    check_world_size(env, 4)
    check_world_size(env, limit)
    with pytest.raises(UsageError):
        check_world_size(env, limit + 2)


# ---- item 11: CONFIG= is a regular file of bounded size ------------------------------------------


def test_a_config_from_a_device_is_refused_without_reading_it(tmp_path: Path) -> None:
    from repro.core.smallfile import NotRegularFile, read_regular  # the bounded reader (issue 22)
    from repro.run.orchestrate import load_user_config

    with pytest.raises(NotRegularFile):
        read_regular("/dev/zero", 16)  # refused before a byte is read (and bounded anyway)
    for path in ("/dev/null", "/dev/stdin"):
        if os.path.exists(path) and not os.path.isfile(path):  # stdin may be redirected from a file
            with pytest.raises(ConfigError, match="not a DeepSpeed config file"):
                load_user_config(path)


def test_a_config_that_is_a_fifo_is_refused_not_waited_on(
    tmp_path: Path, engine: FailingBuild, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    codes: list[int] = []
    worker = threading.Thread(target=lambda: codes.append(run(["repro", "--config", str(fifo)], tmp_path)))
    worker.start()
    worker.join(60)  # only bounds a failure of this test: the old read waited for a writer
    stuck = worker.is_alive()
    if stuck:  # release it: a writer that closes at once is an end of file
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join()
    assert not stuck and codes == [ConfigError.exit_code]
    assert "regular" in capsys.readouterr().err and left_behind(tmp_path) == []


def test_a_config_too_large_for_one_argument_is_refused(
    tmp_path: Path, engine: FailingBuild, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"zero_optimization": {"stage": 3}, "comment": "x" * (200 << 10)}))
    assert run(["repro", "--config", str(big)], tmp_path) == ConfigError.exit_code
    assert engine.calls == [] and left_behind(tmp_path) == []


# ---- item 12: documented codes instead of tracebacks ---------------------------------------------


def test_a_matrix_that_is_a_folder_or_not_utf8_is_a_matrix_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "m.toml"
    binary.write_bytes(b"schema = 1\n# \xff\xfe\n")
    for path in (tmp_path, binary):
        assert cli.main(["list", "--matrix", str(path)]) == MatrixError.exit_code
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "content,named",
    [
        (b'{"zero_optimization": {"stage": 3}, "x": "\xff"}', "UTF-8"),
        (b"[" * 20_000 + b"]" * 20_000, "nested"),
        (b'{"fp16": true}', "fp16"),
        (b'{"zero_optimization": {"stage": 3, "reduce_bucket_size": "big"}}', "reduce_bucket_size"),
        (b'{"train_batch_size": "eight"}', "train_batch_size"),
        (b'{"bf16": {"enabled": "yes"}}', "bf16.enabled"),
    ],
)
def test_a_config_of_the_wrong_shape_is_a_config_error_on_the_host(
    content: bytes,
    named: str,
    tmp_path: Path,
    engine: FailingBuild,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "c.json"
    config.write_bytes(content)
    assert run(["repro", "--config", str(config)], tmp_path) == ConfigError.exit_code
    assert named in capsys.readouterr().err
    assert engine.calls == [] and left_behind(tmp_path) == []


def _results(tmp_path: Path) -> Path:
    b = ResultsBuilder(tmp_path / "r", "20250101T000000Z-cpu")
    b.env("cpu")
    standard_env(b, "cpu")
    return b.write()


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text.encode()[:-2] + b"\xff}",
        lambda text: (b'{"a":' * 50_000) + b"1" + b"}" * 50_000,
        lambda text: text.replace('"ran_on": null', '"ran_on": "gpu"', 1).encode(),
    ],
    ids=["not-utf8", "nested", "ran_on-string"],
)
def test_a_damaged_results_file_is_a_usage_error_for_report(
    damage: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _results(tmp_path)
    path = folder / "results.json"
    text = json.dumps(json.loads(path.read_text()), indent=1)
    data = damage(text)
    assert data != text.encode()
    path.write_bytes(data)
    before = sorted(folder.rglob("*"))
    assert cli.main(["report", "--results", str(folder)]) == UsageError.exit_code
    assert "Traceback" not in capsys.readouterr().err
    assert sorted(folder.rglob("*")) == before


# ---- item 13: half-written results ---------------------------------------------------------------


def test_an_out_folder_holding_other_files_is_refused(
    tmp_path: Path, engine: FailingBuild, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "home"
    out.mkdir()
    (out / ".bashrc").write_text("# mine\n")
    code = run(["repro", "--env", "cpu", "--out", str(out)], tmp_path)
    assert code == UsageError.exit_code
    assert sorted(p.name for p in out.iterdir()) == [".bashrc"]
    assert "prepare" not in engine.calls


def test_a_failed_build_of_make_run_leaves_no_folder_and_keeps_latest(
    tmp_path: Path, engine: FailingBuild
) -> None:
    root = tmp_path / "results"
    root.mkdir()
    (root / "20240101T000000Z-cpu").mkdir()
    (root / "latest").symlink_to("20240101T000000Z-cpu")
    code = run(["run", "--env", "cpu", "--cmd", "true", "--workdir", str(tmp_path)], tmp_path)
    assert code == BuildError.exit_code
    assert sorted(p.name for p in root.iterdir()) == ["20240101T000000Z-cpu", "latest"]
    assert os.readlink(root / "latest") == "20240101T000000Z-cpu"


def test_an_env_named_twice_is_refused(
    tmp_path: Path, engine: FailingBuild, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["repro", "--env", "cpu,cpu", "--dry-run"], tmp_path) == UsageError.exit_code
    assert "more than once" in capsys.readouterr().err


# Issue #45 item 2: Unicode's own line breaks and format characters passed the control-character
# check: U+2028 splits a line for Python's splitlines(), editors and JavaScript; a bidi override
# or isolate makes a printed reproduce line read as another command (Trojan Source).
@pytest.mark.parametrize(
    ("char", "named"),
    [
        ("\u2028", "the line separator U+2028"),
        ("\u2029", "the paragraph separator U+2029"),
        ("\u0085", "the control character U+0085"),
        ("\u200e", "the invisible format character U+200E"),
        ("\u200f", "the invisible format character U+200F"),
        *((chr(c), f"the invisible format character U+{c:04X}") for c in range(0x202A, 0x202F)),
        *((chr(c), f"the invisible format character U+{c:04X}") for c in range(0x2066, 0x206A)),
        ("\ufeff", "the invisible format character U+FEFF"),
    ],
)
def test_unicode_line_breaks_and_format_characters_are_refused_like_controls(
    char: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["repro", "--dry-run", "--env", f"cpu{char}x"]) == 2
    err = capsys.readouterr().err
    assert f"the value of --env holds {named}" in err
    assert char not in err


def test_joiners_that_scripts_need_are_not_refused() -> None:
    # Persian and the Indic scripts (and emoji) are written with zero-width (non-)joiners.
    assert cli._control_character("/home/u/\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645/job") is None
    assert cli._control_character("/data/\u0915\u094d\u200d\u0937/run") is None
