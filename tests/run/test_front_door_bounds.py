"""Issue #32 item 4 at the front door: RESUME= is a strict yes/no, and REQUIREMENTS= is read as an
untrusted file (a regular file, not a link out of its folder, size-capped, its content never
echoed in an error)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from repro.cli import bisect_commands as bisect_cli
from repro.cli import options
from repro.cli.main import main
from repro.core.errors import UsageError
from repro.engines import jobdeps
from tests.fixtures.fake_bisect import parse

SECRET = "root:$6$Zr3cretHashDoNotShow:19000:0:99999:7:::"


def target(argv: list[str]) -> options.RunTarget:
    p = argparse.ArgumentParser()
    options.add_run_options(p)
    args = p.parse_args(argv)
    args.argv, args.command = ["repro", *argv], "repro"
    return options.run_target_from_args(args)


@pytest.mark.parametrize(("value", "resume"), [("1", True), ("yes", True), ("TRUE", True), ("on", True)])
def test_resume_yes(monkeypatch: pytest.MonkeyPatch, value: str, resume: bool) -> None:
    monkeypatch.setenv("RESUME", value)
    assert target([]).resume is resume


@pytest.mark.parametrize("value", ["0", "false", "no", "off", "", "False", " no "])
def test_resume_no_means_no(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("RESUME", value)
    assert target([]).resume is False
    assert target(["--resume"]).resume is True  # the flag still asks for it


@pytest.mark.parametrize("value", ["maybe", "2", "y e s", "resume"])
def test_resume_neither_yes_nor_no_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("RESUME", value)
    with pytest.raises(UsageError, match="RESUME= is neither yes nor no") as err:
        target([])
    assert err.value.exit_code == 2 and "RESUME=1" in err.value.fix


def test_make_run_refuses_a_resume_that_is_neither_yes_nor_no(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RESUME", "maybe")
    code = main(["run", "--cmd", "true", "--env", "cpu", "--engine", "venv", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "RESUME= is neither yes nor no" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# -- REQUIREMENTS= ---------------------------------------------------------------------------------
@pytest.fixture
def shadow(tmp_path: Path) -> Path:
    """A file outside the project holding a secret, like /etc/shadow (which a test cannot read)."""
    secret = tmp_path / "etc" / "shadow"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\ndaemon:*:19000:0:99999:7:::\n")
    return secret


def test_a_link_out_of_its_folder_is_refused_without_showing_the_file(tmp_path: Path, shadow: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    link = project / "requirements.txt"
    link.symlink_to(shadow)
    with pytest.raises(UsageError, match="link to a file outside its folder") as err:
        jobdeps.parse(str(link), None)
    assert "Zr3cret" not in err.value.render() and err.value.exit_code == 2


def test_a_link_within_its_folder_is_read(tmp_path: Path) -> None:
    (tmp_path / "reqs-2024.txt").write_text("transformers==4.36.2\n")
    (tmp_path / "requirements.txt").symlink_to("reqs-2024.txt")
    deps = jobdeps.parse(str(tmp_path / "requirements.txt"), None)
    assert deps is not None and deps.lines == ("transformers==4.36.2",)


def test_a_bad_line_is_named_by_number_not_shown(shadow: Path) -> None:
    with pytest.raises(UsageError, match=r"line 1: is not a requirement") as err:
        jobdeps.parse(str(shadow), None)
    assert "Zr3cret" not in err.value.render()
    assert "root" not in err.value.render().replace(str(shadow), "")


def test_a_pip_option_line_is_not_shown_either(tmp_path: Path) -> None:
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("numpy\n--index-url https://user:tok3n@example.invalid/simple\n")
    with pytest.raises(UsageError, match="line 2: pip options are not taken here") as err:
        jobdeps.parse(str(reqs), None)
    assert "tok3n" not in err.value.render()


def test_packages_typed_on_the_command_line_are_still_quoted() -> None:
    with pytest.raises(UsageError, match="'not a package!'"):
        jobdeps.parse(None, "'not a package!'")


def test_a_large_file_is_refused_without_being_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "requirements.txt"
    big.write_bytes(b"numpy\n" * (jobdeps.REQUIREMENTS_LIMIT // 6 + 10))  # just over the cap
    asked: list[int] = []
    real = jobdeps.read_regular

    def spy(path: str | os.PathLike[str], limit: int) -> bytes:
        asked.append(limit)
        return real(path, limit)

    monkeypatch.setattr(jobdeps, "read_regular", spy)
    with pytest.raises(UsageError, match="larger than 1024 KiB"):
        jobdeps.parse(str(big), None)
    assert asked == [jobdeps.REQUIREMENTS_LIMIT]


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused(device: str) -> None:
    with pytest.raises(UsageError, match="not a regular file"):
        jobdeps.parse(device, None)


def test_a_device_behind_a_link_in_the_same_folder_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "requirements.txt"
    link.symlink_to("/dev/zero")
    with pytest.raises(UsageError, match="outside its folder|not a regular file"):
        jobdeps.parse(str(link), None)


def test_bisect_reads_requirements_before_any_probe(tmp_path: Path, shadow: Path) -> None:
    (tmp_path / "proj").mkdir()
    link = tmp_path / "proj" / "requirements.txt"
    link.symlink_to(shadow)
    argv = ["--axis", "torch", "--good", "2.0.0", "--cmd", "python train.py", "--requirements", str(link)]
    with pytest.raises(UsageError, match="outside its folder") as err:
        parse("bisect", argv)
    assert "Zr3cret" not in err.value.render()
    # the probes get the path as given (a link stays a link), not what it points to
    (tmp_path / "ok.txt").write_text("numpy\n")
    good = parse("bisect", [*argv[:-1], str(tmp_path / "ok.txt")])
    assert good.probe.requirements == str(tmp_path / "ok.txt")
    assert bisect_cli.probe_options  # the one place bisect, survey and probe read them
