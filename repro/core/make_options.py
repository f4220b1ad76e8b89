"""Every make variable, declared once: its name, the CLI flag the Makefile turns it into, whether
make checks it as a yes/no, the targets that read it, whether the tool writes it into the make
lines it prints, and a line of help (issue #46: "one table of options").

The places that used to list variables by hand come from this table or are checked against it by
tests/project/test_make_options.py: the Makefile's USER_VARIABLES and SWITCHES, the recipes' flags, the
argparse parsers, docs/options.md, and every make line built with repro.core.makeline.make_line.
Adding a make option: one entry here, then its code (docs/developing.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Targets by the flag groups of the Makefile (RUN_FLAGS, WALK_FLAGS, PROBE_FLAGS, ...), so an
# entry reads like the recipe it describes.
RUN_TARGETS = ("build", "repro", "check-fix", "matrix")
WALK_TARGETS = ("bisect", "survey")
PROBE_TARGETS = ("bisect", "survey", "probe")
RUN_AND_PROBE = (*RUN_TARGETS, *PROBE_TARGETS)
JOB_TARGETS = (*PROBE_TARGETS, "run")  # CMD= runs in these
JOB_DEPS_TARGETS = (*JOB_TARGETS, "shell")
PR_VERIFY_TARGETS = ("pr", "pr-verify")
ENV_TARGETS = ("bench", "bundle", "cluster", "gpu-check", "run", "shell")
ENGINE_TARGETS = (*PR_VERIFY_TARGETS, "bench", "run", "shell")
OUT_TARGETS = ("bundle", "cluster", "gpu-check", "issue", "pr", "report", "run")
MATRIX_TARGETS = ("bundle", "gpu-check", "list", "run", "shell")
RESUME_TARGETS = ("repro", "check-fix", "matrix", "run")  # the tool reads RESUME= itself
# Every target whose recipe runs `$(REPRO)` (`python -m repro`, with --quiet/--verbose first).
TOOL_TARGETS = (
    *RUN_AND_PROBE,
    *PR_VERIFY_TARGETS,
    *("help", "list", "report", "base-image", "gpu-check", "bench", "issue", "bundle", "verify-bundle"),
    *("cluster", "pr-regression", "run", "shell", "clean"),
)
# Every target that runs the host-side Python (the tool, pytest, ruff, mypy or pip).
PYTHON_TARGETS = (*TOOL_TARGETS, "venv", "test", "test-unit", "test-fast", "lint")


@dataclass(frozen=True)
class MakeOption:
    """One make variable."""

    name: str  # as the user writes it: WORLD_SIZE
    flag: str | None  # the `python -m repro` flag it becomes (--world-size); None: make reads it
    targets: tuple[str, ...]  # the make targets that read it
    help: str  # one line; docs/options.md has the whole story
    # Checked yes/no by make before any recipe runs (SWITCHES in the Makefile). RESUME= is a
    # yes/no too, but the tool checks it (repro/core/flags.py), so it is not one of these.
    switch: bool = False
    # The tool may write it into a make line it prints (the line that reproduces a run or probe,
    # a resume hint, a next step); reproduce_pairs and checked_pairs refuse any other name.
    reproduce: bool = False
    # Handed to the tool in the environment make exports, not as a flag on the recipe line.
    via_environment: bool = False


# Short constructors, so each entry stays one line: a value or a yes/no switch, and whether the
# tool writes it into the make lines it prints ("line").
def _value(name: str, flag: str | None, targets: tuple[str, ...], help: str) -> MakeOption:
    return MakeOption(name, flag, targets, help)


def _switch(name: str, flag: str, targets: tuple[str, ...], help: str) -> MakeOption:
    return MakeOption(name, flag, targets, help, switch=True)


def _line(name: str, flag: str, targets: tuple[str, ...], help: str) -> MakeOption:
    return MakeOption(name, flag, targets, help, reproduce=True)


def _line_switch(name: str, flag: str, targets: tuple[str, ...], help: str) -> MakeOption:
    return MakeOption(name, flag, targets, help, switch=True, reproduce=True)


# The one canonical order: reproduce_pairs writes a line's variables in it. The first block is the
# order of the probe lines (ProbeSpec.repro_command, ProbeSpec.make_pairs), which users have
# saved in results.json and bisect.json: keep it.
OPTIONS: tuple[MakeOption, ...] = (
    # What runs: the env and its pins, where, which scenario, how.
    _line("ENV", "--env", (*RUN_AND_PROBE, *ENV_TARGETS), "env id(s), comma-separated"),
    _line("TORCH", "--torch", RUN_AND_PROBE, "override the env's torch pin (a derived env)"),
    _line("DEEPSPEED", "--deepspeed", RUN_AND_PROBE, "override the env's DeepSpeed pin (a derived env)"),
    _line("DS_REPO", "--ds-repo", (*PROBE_TARGETS, *PR_VERIFY_TARGETS, "bench"), "a DeepSpeed clone or URL"),
    _line("DEEPSPEED_COMMIT", "--deepspeed-commit", ("probe", "bench"), "a commit of DS_REPO to build"),
    _line("ENGINE", "--engine", (*RUN_AND_PROBE, *ENGINE_TARGETS), "docker|venv|auto: where to run"),
    _line("SCENARIO", "--scenario", PROBE_TARGETS, "the one scenario a probe runs (default mics)"),
    _line("SCENARIOS", "--scenarios", RUN_TARGETS, "a comma-separated subset of the scenarios"),
    _line("PATCH", "--patch", (*RUN_AND_PROBE, "run", "shell"), "stock, fixed or both"),
    _line("DTYPE", "--dtype", RUN_AND_PROBE, "fp32, bf16 or fp16"),
    _line("TRANSPORT", "--transport", (*RUN_AND_PROBE, "run", "shell", "pr-regression"), "CPU transport(s)"),
    _line("CONFIG", "--config", RUN_TARGETS, "your DeepSpeed config JSON"),
    _line("STEPS", "--steps", RUN_AND_PROBE, "training steps per run"),
    _line("WORLD_SIZE", "--world-size", RUN_AND_PROBE, "ranks per run"),
    _line("TIMEOUT", "--timeout", (*RUN_AND_PROBE, "run"), "per-run time limit in seconds"),
    _line("STALL_TIMEOUT", "--stall-timeout", (*RUN_TARGETS, "run"), "seconds without a step: hung"),
    _line_switch("NETWORK", "--network", ("run",), "a network for your command's container"),
    _line("CMD", "--cmd", JOB_TARGETS, "your own command, run instead of a scenario"),
    _line("WORKDIR", "--workdir", (*JOB_TARGETS, "verify-bundle"), "the folder your command runs in"),
    _line("LOSS_REGEX", "--loss-regex", JOB_TARGETS, "the loss pattern of your command's output"),
    _line("REQUIREMENTS", "--requirements", JOB_DEPS_TARGETS, "your command's own requirements file"),
    _line("PACKAGES", "--packages", JOB_DEPS_TARGETS, "your command's own packages, a list"),
    # The range a bisection or survey walks, and how its probes run.
    _line("AXIS", "--axis", WALK_TARGETS, "torch, deepspeed or deepspeed-commit: what is walked"),
    _line("GOOD", "--good", ("bisect",), "a release (or commit) expected good"),
    _line("BAD", "--bad", ("bisect",), "a release (or commit) expected bad"),
    _line("FROM", "--from", WALK_TARGETS, "the first release of the range"),
    _line("TO", "--to", WALK_TARGETS, "the last release of the range"),
    _line("BAD_IF", "--bad-if", ("bisect", "probe"), "what counts as bad: reproduced, failed or differs"),
    _line_switch("COMMITS", "--commits", WALK_TARGETS, "go on from the boundary releases into their commits"),
    _line_switch("EVERY", "--every", ("survey",), "probe every release, not only where the ends differ"),
    _line("VERSIONS", "--versions", WALK_TARGETS, "these candidates instead of the index's list"),
    _switch("PRERELEASES", "--prereleases", WALK_TARGETS, "include pre-releases from the index"),
    _switch("REFRESH_VERSIONS", "--refresh-versions", WALK_TARGETS, "ignore the cached release list"),
    _line("PARALLEL", "--parallel", (*WALK_TARGETS, *PR_VERIFY_TARGETS), "probes side by side"),
    _line("RUNNER", "--runner", WALK_TARGETS, "local or slurm: where parallel probes run"),
    _value("DEVICES", "--devices", WALK_TARGETS, "GPU ids split between the parallel probes"),
    _value("SLURM_PARTITION", "--slurm-partition", WALK_TARGETS, "the Slurm partition of the array jobs"),
    _value("SLURM_TIME", "--slurm-time", WALK_TARGETS, "the time limit of each Slurm array task"),
    _value("SLURM_GPUS_PER_TASK", "--slurm-gpus-per-task", WALK_TARGETS, "GPUs per Slurm array task"),
    _value("IMAGE", "--image", WALK_TARGETS, "the Apptainer image each Slurm probe runs in"),
    _line("DEEPSPEED_SRC", "--deepspeed-src", ("probe", "run"), "a DeepSpeed checkout built into the env"),
    _value("REFERENCE", "--reference", ("probe",), "OUTCOME/SIGNATURE of the good state (BAD_IF=differs)"),
    # How the runs of a reproduction are scheduled.
    _value("JOBS", "--jobs", RUN_TARGETS, "runs at once inside an env"),
    _value("LAUNCHER", "--launcher", RUN_TARGETS, "how ranks start: prefork, torchrun or auto"),
    _switch("NO_SYNC_PROOF", "--no-sync-proof", RUN_TARGETS, "skip the extra mics stock run over sync"),
    # Where results go and which matrix is read.
    _value("OUT", "--out", (*RUN_AND_PROBE, *OUT_TARGETS), "the output folder"),
    _line("RESULTS", "--results", ("report", "issue", "bundle"), "the results folder(s) to read"),
    _value("MATRIX", "--matrix", (*RUN_AND_PROBE, *MATRIX_TARGETS), "the env matrix TOML"),
    _switch("DRY_RUN", "--dry-run", (*RUN_TARGETS, *WALK_TARGETS), "print the plan and stop"),
    MakeOption(
        "RESUME", "--resume", RESUME_TARGETS, "finish an interrupted run in OUT=", via_environment=True
    ),
    # Hand-off: bundles, cluster scripts, the PR.
    _line("BUNDLE", "--bundle", ("verify-bundle",), "a bundle folder or its .tar archive"),
    _line_switch("ALLOW_PRIVILEGES", "--allow-gpu-privileges", ("verify-bundle",), "GPU access for a bundle"),
    _switch("REUSE_IMAGE", "--reuse-image", ("verify-bundle",), "use the manifest's image if Docker has it"),
    _value("GZIP_LEVEL", "--gzip-level", ("bundle",), "gzip level of the bundle's image (1-9)"),
    _value("LAYOUT", "--layout", ("cluster",), "reporter or cpu-twin: the cluster layout"),
    _value("PR", "--pr", ("pr-verify",), "the folder a make pr wrote"),
    _value("REF", "--ref", ("pr",), "the DeepSpeed ref the branch is built on"),
    _value("BRANCH", "--branch", ("pr",), "the new branch's name"),
    _switch("KEEP", "--keep", ("pr",), "keep the branch's work tree in OUT/worktree"),
    _value("AUTHOR_NAME", "--author-name", ("pr",), "the commit's author name"),
    _value("AUTHOR_EMAIL", "--author-email", ("pr",), "the commit's author email"),
    _switch("VERIFY", "--verify", PR_VERIFY_TARGETS, "the lab verifies the branch at its commit"),
    _switch("RANGE", "--range", PR_VERIFY_TARGETS, "also the affected range of releases x torch"),
    _value("TORCHES", "--torches", PR_VERIFY_TARGETS, "the torch releases the branch is verified with"),
    _value("RANGE_TORCH", "--range-torch", PR_VERIFY_TARGETS, "the torch releases of the affected range"),
    _value("RELEASES", "--releases", PR_VERIFY_TARGETS, "the DeepSpeed releases of the affected range"),
    _value("PYTHON_VENV", "--python", ("pr-regression",), "the python of a venv with torch and DeepSpeed"),
    # One target each.
    _switch("NO_HANG", "--no-hang", ("bench",), "skip the hung vs clean probe pair"),
    _switch("FORCE", "--force", ("base-image",), "rebuild the base image even if it exists"),
    # Make's own: how much the tool says, which Python runs it, pytest's arguments.
    _switch("QUIET", "--quiet", TOOL_TARGETS, "show only results, warnings and errors"),
    _switch("VERBOSE", "--verbose", TOOL_TARGETS, "also show details"),
    _value("PYTHON", None, PYTHON_TARGETS, "this interpreter as it is, instead of .venv/"),
    _value("BOOTSTRAP_PYTHON", None, PYTHON_TARGETS, "the Python .venv/ is made with (default python3)"),
    _value("PYTEST_ARGS", None, ("test", "test-unit", "test-fast"), "extra arguments for pytest"),
)

_POSITION = {option.name: index for index, option in enumerate(OPTIONS)}
_ON_MAKE_LINES = frozenset(option.name for option in OPTIONS if option.reproduce)


def option(name: str) -> MakeOption:
    """The table's entry for `name`; KeyError names the table when it has none."""
    if name not in _POSITION:
        raise KeyError(f"{name} is not a make option (repro/core/make_options.py)")
    return OPTIONS[_POSITION[name]]


def reproduce_pairs(values: Mapping[str, object]) -> list[tuple[str, object]]:
    """`values` as (NAME, value) pairs in the table's order, for make_line (which leaves out the
    unset ones). A name the table lacks, or does not put on make lines, is a bug: ValueError."""
    _refuse_others(values)
    return sorted(values.items(), key=lambda pair: _POSITION[pair[0]])


def checked_pairs(pairs: Iterable[tuple[str, object]]) -> list[tuple[str, object]]:
    """`pairs` in the order given, each name refused (ValueError) unless the table puts it on make
    lines. For the lines whose printed order predates the table and differs from it (run_make_line,
    the bisect/survey lines, `make run`'s): reordering them would change lines users have saved."""
    listed = list(pairs)
    _refuse_others(name for name, _ in listed)
    return listed


def _refuse_others(names: Iterable[str]) -> None:
    others = sorted(set(names) - _ON_MAKE_LINES)
    if others:
        raise ValueError(f"not make options for a printed make line (repro/core/make_options.py): {others}")
