"""What may reach a generated batch or shell script (the probe array job, `make cluster`'s
launchers): each value is checked against its grammar at the front door, and quoted or refused
again where a template writes it.

A value is data, never script. sbatch reads `#SBATCH` lines as whitespace-separated options, so
`SLURM_TIME='1:00:00 --error=/path --open-mode=truncate'` used to add options (the named file was
emptied), and a newline in any value ended the `#SBATCH` line and started a shell line that the job
ran. Two layers stop that: the grammars below turn bad input into a UsageError naming the option
(exit 2), and the Jinja filters refuse or quote whatever reaches a template, so a caller that skips
the front door still cannot write a second option or a shell line.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from collections.abc import Callable

from repro.core.errors import UsageError

# Slurm's --time formats (sbatch(1)); 0 is also "no limit" to Slurm, so plain minutes cover it.
SLURM_TIME_GRAMMAR = (
    "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (digits only), or UNLIMITED/INFINITE"
)
_SLURM_TIME = re.compile(r"[0-9]+(?::[0-9]+){0,2}|[0-9]+-[0-9]+(?::[0-9]+){0,2}|(?i:UNLIMITED|INFINITE)")
# Slurm accepts a comma-separated list of partitions; names are held to a strict alphabet.
PARTITION_GRAMMAR = "a partition name, or several separated by commas, each of A-Z a-z 0-9 _ . -"
_PARTITION = re.compile(r"[A-Za-z0-9_.-]+(?:,[A-Za-z0-9_.-]+)*")
# Env ids (`cpu`, `rocm56`, derived `cpu+torch2.1.0+ds0.13.1`) and file names.
NAME_GRAMMAR = "letters, digits and _ . + - (starting with a letter or digit)"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
# Docker image references: [registry[:port]/]name[:tag][@digest].
IMAGE_REF_GRAMMAR = "a Docker image reference: letters, digits and _ . + - / : @"
_IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+/:@-]*")
# What a shell word may hold unquoted, for the few places a template writes a value inside double
# quotes or as a case pattern, where shlex.quote's single quotes would change its meaning.
_WORD = re.compile(r"[A-Za-z0-9_.:+/@%,=-]+")
_CASE_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?(?: \| [A-Za-z_][A-Za-z0-9_]*\*?)*")
_SBATCH_PUNCTUATION = frozenset("_.:+/@%,=-")
# One extra #SBATCH option: --name or --name=value (the value is checked like any other).
_OPTION = re.compile(r"--[a-z][a-z0-9-]*")


def _check(value: str, pattern: re.Pattern[str], option: str, what: str, grammar: str, example: str) -> str:
    if not pattern.fullmatch(value):
        raise UsageError(
            f"{option} {value!r} is not {what}",
            why=f"it is written into a generated job script; it must be {grammar}",
            fix=f"give {option} as e.g. {example}",
        )
    return value


def slurm_time(value: str, option: str = "SLURM_TIME= (--slurm-time)") -> str:
    """`value` when it is a Slurm time limit; a UsageError naming `option` and the formats if not."""
    return _check(
        value, _SLURM_TIME, option, "a Slurm time limit", SLURM_TIME_GRAMMAR, "90, 1:30:00 or 2-00:00:00"
    )


def slurm_partition(value: str, option: str = "SLURM_PARTITION= (--slurm-partition)") -> str:
    return _check(value, _PARTITION, option, "a Slurm partition list", PARTITION_GRAMMAR, "gpu or gpu,debug")


def name(value: str, option: str) -> str:
    """An env id or a file name that scripts and job names are built from."""
    return _check(value, _NAME, option, "a plain name", NAME_GRAMMAR, "rocm56")


def image_ref(value: str, option: str = "--image-ref") -> str:
    return _check(
        value, _IMAGE_REF, option, "an image reference", IMAGE_REF_GRAMMAR, "mics-repro-bundle:rocm56"
    )


def positive(value: int | None, option: str) -> int | None:
    if value is not None and value < 1:
        raise UsageError(f"{option} {value} is not a positive number", fix=f"give {option} as 1 or more")
    return value


# -- where a template writes a value -------------------------------------------------------------
def _refuse(value: str, where: str, why: str) -> UsageError:
    return UsageError(
        f"refusing to write {value!r} into {where}",
        why=why,
        fix="give the value without spaces, quotes or control characters "
        "(a results folder: OUT= without spaces)",
    )


def sbatch_value(value: object, option: str) -> str:
    """A value for `#SBATCH option=value`: one plain token, or an error. sbatch splits the line at
    whitespace and honours quotes, so any of those would start another option; `$`, backticks
    and the like are no use in any Slurm value and are refused too."""
    text = str(value)
    # Letters of any script are fine (a results folder under /home/josé); what would split the
    # line or mean something to a shell is not.
    if not text or not all(c.isalnum() or c in _SBATCH_PUNCTUATION for c in text):
        raise _refuse(
            text,
            f"the job script's `#SBATCH {option}=` line",
            "sbatch splits #SBATCH lines at whitespace and quotes: the rest would become more "
            "options, and a newline a shell line the job runs; only letters, digits and "
            "_ . : + / @ % , = - are written there",
        )
    return text


def sbatch_option(value: object) -> str:
    """A whole extra option for an `#SBATCH` line: `--name` or `--name=value`, nothing else."""
    text = str(value)
    flag, eq, rest = text.partition("=")
    if not _OPTION.fullmatch(flag) or (eq and not rest):
        raise _refuse(text, "an #SBATCH line", "an extra #SBATCH option must be one --name[=value]")
    if eq:
        sbatch_value(rest, flag)
    return text


def shell_word(value: object) -> str:
    """A value as one shell word (shlex.quote: single quotes unless it needs none)."""
    return shlex.quote(str(value))


def join_argv(argv: object) -> str:
    """A command (a list of arguments) as one shell line, each argument quoted."""
    if isinstance(argv, str) or not isinstance(argv, (list, tuple)):
        raise TypeError(f"join_argv wants a list of arguments, not {type(argv).__name__}")
    return shlex.join(str(arg) for arg in argv)


def plain_word(value: object) -> str:
    """A value written where quoting would change the meaning (inside double quotes, a case
    pattern): letters, digits and _ . : + / @ % , = - only, or an error."""
    text = str(value)
    if not _WORD.fullmatch(text):
        raise _refuse(text, "a shell line", "only plain words may be written there unquoted")
    return text


def case_pattern(value: object) -> str:
    """A bash `case` pattern of variable names and name prefixes (`NCCL_* | CUDA_VISIBLE_DEVICES`):
    written unquoted, since quotes would make its `*` literal."""
    text = str(value)
    if not _CASE_PATTERN.fullmatch(text):
        raise _refuse(text, "a case pattern", "only NAME and NAME* alternatives may be written there")
    return text


def comment(value: object) -> str:
    """Text for a `# ...` comment line: a newline would end the comment and start a command."""
    text = str(value)
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text):
        raise _refuse(text, "a comment line", "a line break would end the comment and start a command")
    return text


def slurm_filename(path: object) -> str:
    """A folder in a Slurm filename pattern: `%` doubled, so `%u` in a path stays text."""
    return str(path).replace("%", "%%")


def script_filters() -> dict[str, Callable[..., str]]:
    """The Jinja filters every generated script uses (repro/core/templating.environment)."""
    return {
        "sbatch": sbatch_value,
        "sbatch_option": sbatch_option,
        "sh": shell_word,
        "join_argv": join_argv,
        "word": plain_word,
        "comment": comment,
        "case_pattern": case_pattern,
    }
