"""Issue #32, round 3, item 1: no value reaches a generated Slurm or shell script as script.

SLURM_TIME / SLURM_PARTITION (and every other value the probe array job and `make cluster`'s
launchers interpolate) are checked against their grammar at the front door (UsageError, exit 2,
naming the option and the grammar), and the templates refuse or quote them again where they write
them. A script is read back the way sbatch reads it: its #SBATCH lines, split like sbatch splits them.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from repro.bisect import rounds
from repro.bisect.probe import ProbeSpec
from repro.cli.main import main
from repro.core import templating
from repro.core.errors import UsageError
from repro.upstream.cluster import scripts as cluster

USAGE_EXIT = 2

# A newline that adds a shell line, a space that adds sbatch options (the emptied-file report),
# command substitutions and backticks, a shell separator.
HOSTILE = [
    "1:00:00\ntouch {marker}",
    "1:00:00 --error={victim} --open-mode=truncate",
    "$(touch {marker})",
    "`touch {marker}`",
    "$(id)",
    "`id`",
    "1:00:00;touch {marker}",
    "1:00:00\r\n#SBATCH --error={victim}",
    '1:00:00" --error={victim} "',
    "1:00:00\u00a0--error={victim}",  # a no-break space
    "gpu\u202e--error={victim}",  # a bidi override: shown as something else than it is
]
VALID_TIMES = ["90", "0", "10:00", "1:00:00", "2-12", "2-12:30", "2-12:30:00", "UNLIMITED", "INFINITE"]
VALID_PARTITIONS = ["gpu", "debug", "gpu,debug", "a100_80g.long-q"]


def sbatch_lines(script: str) -> list[list[str]]:
    """The #SBATCH options sbatch reads: those before the first command, split at whitespace
    with quotes honoured (sbatch's own tokenizer does that)."""
    options = []
    for line in script.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break  # sbatch stops at the first command
        if line.startswith("#SBATCH"):
            options.append(shlex.split(line[len("#SBATCH") :]))
    return options


def shell_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A user's file outside every output folder, that the reported options emptied."""
    path = tmp_path / "home" / "thesis.tex"
    path.parent.mkdir()
    path.write_text("two years of work\n")
    return path


def bisect_argv(tmp_path: Path, *extra: str) -> list[str]:
    # A dry run: without the check, this command line is valid and exits 0 having written nothing.
    return ["bisect", "--axis", "torch", "--versions", "2.0.1,2.1.0", "--good", "2.0.1", "--bad", "2.1.0",
            "--dry-run", "--runner", "slurm", "--parallel", "2", "--out", str(tmp_path / "out"),
            "--results-root", str(tmp_path / "results"), *extra]  # fmt: skip


# -- the front door: bisect/survey's --slurm-time and --slurm-partition -------------------------
@pytest.mark.parametrize("flag", ["--slurm-time", "--slurm-partition"])
@pytest.mark.parametrize("template", HOSTILE)
def test_a_hostile_slurm_value_is_a_usage_error_before_anything_is_written(
    flag: str, template: str, tmp_path: Path, victim: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "pwned"
    value = template.format(marker=marker, victim=victim)
    assert main(bisect_argv(tmp_path, flag, value)) == USAGE_EXIT
    err = capsys.readouterr().err
    assert flag in err  # names the option
    if any(ch in value for ch in "\n\r"):
        # A control character is refused by the front door for every option, before any grammar.
        assert "newline" in err or "control character" in err
    elif "\u202e" in value:
        # So is an invisible bidi override (hardening round 4): named, and the make variable too.
        assert (
            "format character U+202E" in err
            and {"--slurm-time": "SLURM_TIME=", "--slurm-partition": "SLURM_PARTITION="}[flag] in err
        )
    else:
        make_name = {"--slurm-time": "SLURM_TIME=", "--slurm-partition": "SLURM_PARTITION="}[flag]
        grammar = "HH:MM:SS" if flag == "--slurm-time" else "comma"
        assert make_name in err and grammar in err  # the make variable and its grammar
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists() and not marker.exists()
    assert victim.read_text() == "two years of work\n"


@pytest.mark.parametrize("value", VALID_TIMES)
def test_every_slurm_time_format_is_accepted(value: str, tmp_path: Path) -> None:
    runner = rounds.Slurm(
        tmp_path, rounds.ProbeCommand(python="py"), 1, rounds.SlurmOptions(time_limit=value)
    )
    script = runner.script([ProbeSpec("cpu", label="a")], [tmp_path / "p1"])
    assert ["--time=" + value] in sbatch_lines(script)


@pytest.mark.parametrize("value", VALID_PARTITIONS)
def test_partition_lists_are_accepted(value: str, tmp_path: Path) -> None:
    runner = rounds.Slurm(tmp_path, rounds.ProbeCommand(python="py"), 1, rounds.SlurmOptions(partition=value))
    script = runner.script([ProbeSpec("cpu", label="a")], [tmp_path / "p1"])
    assert ["--partition=" + value] in sbatch_lines(script)


@pytest.mark.parametrize("value", ["1:00:00:00", "1-", "-1", "1::00", "１:00", "soon", "1:00:00\n", ""])
def test_near_misses_of_the_time_grammar_are_refused(value: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="Slurm time limit"):
        rounds.Slurm(tmp_path, rounds.ProbeCommand(), 1, rounds.SlurmOptions(time_limit=value))


@pytest.mark.parametrize("value", ["gpu,", ",gpu", "gpu,,cpu", "gpu debug", "gpu/1", "gpu\n"])
def test_near_misses_of_the_partition_grammar_are_refused(value: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="partition"):
        rounds.Slurm(tmp_path, rounds.ProbeCommand(), 1, rounds.SlurmOptions(partition=value))


def test_gpus_per_task_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(bisect_argv(tmp_path, "--slurm-gpus-per-task", "-1")) == USAGE_EXIT
    assert "--slurm-gpus-per-task" in capsys.readouterr().err


# -- the probe array script: exactly the expected #SBATCH lines ----------------------------------
def test_the_array_script_has_exactly_the_expected_sbatch_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The work folder and the probes' own values are shell words: quoted, whatever they hold.
    odd = tmp_path / "work $(touch pwned) `id` 'q'"
    odd.mkdir()
    monkeypatch.chdir(odd)
    runner = rounds.Slurm(
        tmp_path / "res%u",
        rounds.ProbeCommand(python="py"),
        2,
        rounds.SlurmOptions(partition="gpu,debug", time_limit="2-00:00:00", gpus_per_task=2, image="a b.sif"),
    )
    specs = [ProbeSpec("cpu", label="x; touch pwned"), ProbeSpec("cpu", label="$(id)\nid")]
    script = runner.script(specs, [tmp_path / "p1", tmp_path / "p2"])
    assert sbatch_lines(script) == [
        [f"--job-name={runner.job_name}"],
        ["--array=0-1"],
        ["--ntasks=1"],
        ["--time=2-00:00:00"],
        # %u in a folder name is text, not Slurm's user-name pattern
        [f"--output={tmp_path}/res%%u/slurm/round-00-%a.out"],
        ["--partition=gpu,debug"],
        ["--gpus-per-task=2"],
    ]
    lines = shell_lines(script)
    assert shlex.split(lines[1]) == ["cd", str(odd)]
    arms = [line for line in lines if line.lstrip().startswith(("0)", "1)"))]
    assert len(arms) == 2  # the newline in a label stays inside its quotes
    first = shlex.split(arms[0].strip().removeprefix("0) ").removesuffix(";;"))
    assert first[:6] == ["exec", "apptainer", "exec", "--nv", "--cleanenv", "a b.sif"]
    assert first[first.index("--label") + 1] == "x; touch pwned"


def test_a_results_folder_with_letters_of_any_script_is_fine(tmp_path: Path) -> None:
    runner = rounds.Slurm(tmp_path / "josé" / "結果", rounds.ProbeCommand(python="py"), 1)
    script = runner.script([ProbeSpec("cpu", label="a")], [tmp_path / "p1"])
    assert [f"--output={tmp_path}/josé/結果/slurm/round-00-%a.out"] in sbatch_lines(script)


def test_a_results_folder_with_spaces_is_refused_not_split(tmp_path: Path) -> None:
    runner = rounds.Slurm(tmp_path / "my results", rounds.ProbeCommand(python="py"), 1)
    with pytest.raises(UsageError, match="--output") as caught:
        runner.script([ProbeSpec("cpu", label="a")], [tmp_path / "p1"])
    assert "OUT=" in caught.value.fix


def array_template(**options: Any) -> Any:
    from repro.core.script_values import script_filters

    env = templating.environment(rounds.TEMPLATES, filters=script_filters())
    return lambda: env.get_template("probe-array.sbatch.j2").render(
        commands=[["py", "-m", "repro"]],
        options=SimpleNamespace(
            **{"partition": None, "time_limit": "1:00", "gpus_per_task": None, "extra": (), **options}
        ),  # fmt: skip
        job_name="j",
        log_pattern="/out/%a.out",
        workdir="/w",
    )


@pytest.mark.parametrize("field", ["time_limit", "partition", "gpus_per_task"])
@pytest.mark.parametrize("template", HOSTILE)
def test_the_template_itself_refuses_what_the_front_door_would(field: str, template: str) -> None:
    """Defence in depth: a caller that builds options without the front door's check still cannot
    write a second option or a shell line."""
    value = template.format(marker="/tmp/pwned", victim="/tmp/victim")
    with pytest.raises(UsageError, match="#SBATCH"):
        array_template(**{field: value})()


@pytest.mark.parametrize("extra", ["--account=a --error=/x", "--account=a\nid", "id", "--qos=", "-A x"])
def test_extra_sbatch_options_are_single_options(extra: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        rounds.Slurm(tmp_path, rounds.ProbeCommand(), 1, rounds.SlurmOptions(extra=(extra,)))
    with pytest.raises(UsageError):
        array_template(extra=(extra,))()
    ok = rounds.Slurm(tmp_path, rounds.ProbeCommand(), 1, rounds.SlurmOptions(extra=("--account=proj-1",)))
    assert ["--account=proj-1"] in sbatch_lines(ok.script([ProbeSpec("cpu", label="a")], [tmp_path]))


# -- make cluster's launchers --------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--env", "--image-ref"])
@pytest.mark.parametrize("template", HOSTILE)
def test_cluster_refuses_hostile_names_before_writing(
    flag: str, template: str, tmp_path: Path, victim: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    value = template.format(marker=tmp_path / "pwned", victim=victim)
    out = tmp_path / "cluster"
    assert main(["cluster", "--out", str(out), "--layout", "cpu-twin", flag, value]) == USAGE_EXIT
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
    assert not out.exists() and victim.read_text() == "two years of work\n"


@pytest.mark.parametrize("template", HOSTILE)
def test_cluster_render_refuses_a_hostile_time_limit(template: str) -> None:
    value = template.format(marker="/tmp/pwned", victim="/tmp/victim")
    with pytest.raises(UsageError, match="time limit"):
        cluster.render(cluster.CPU_TWIN, env_id="cpu", image_ref="img:1", time_limit=value)


@pytest.mark.parametrize("template", HOSTILE)
def test_cluster_templates_refuse_or_quote_without_the_checks(
    template: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With render()'s grammar checks switched off, the templates' filters still refuse a value
    that would leave its #SBATCH line or comment, and quote it as a shell word."""
    from repro.core import script_values

    for check in ("name", "image_ref", "slurm_time"):
        monkeypatch.setattr(script_values, check, lambda value, *a: value)
    value = template.format(marker="/tmp/pwned", victim="/tmp/victim")
    for field in ("env_id", "time_limit"):
        kwargs = {"env_id": "cpu", "image_ref": "img:1", "time_limit": "1:00:00", field: value}
        with pytest.raises(UsageError, match="refusing"):
            cluster.render(cluster.CPU_TWIN, **kwargs)
    if value.isprintable():  # no line break or format character: fine in a comment, quoted elsewhere
        scripts = {s.path: s.text for s in cluster.render(cluster.CPU_TWIN, env_id="cpu", image_ref=value)}
        for text in (scripts["mics-cpu-twin.sbatch"], scripts["launch-node.sh"]):
            line = next(line for line in shell_lines(text) if "IMAGE_REF=${IMAGE_REF:-" in line)
            assert line.split(":-", 1)[1] == shlex.quote(value) + "}"


@pytest.mark.parametrize("layout", [cluster.CPU_TWIN, cluster.REPORTER])
def test_cluster_job_script_has_exactly_the_expected_sbatch_lines(layout: cluster.Layout) -> None:
    scripts = cluster.render(layout, env_id="cpu+torch2.1.0", image_ref="reg:5000/a/b:t@sha256:0f")
    name = "mics-cpu-twin.sbatch" if layout.device == "cpu" else "mics-hier.sbatch"
    text = next(s.text for s in scripts if s.path == name)
    per_node = [["--cpus-per-task=4"]] if layout.device == "cpu" else [["--gpus-per-node=8"], ["--exclusive"]]
    assert sbatch_lines(text) == [
        ["--job-name=mics-repro-cpu+torch2.1.0"],
        [f"--nodes={layout.nodes}"],
        ["--ntasks-per-node=1"],
        *per_node,
        [f"--time={cluster.job_time_limit(len(cluster.RUNS), 600)}"],
        ["--output=mics-repro-%j.out"],
    ]
