"""`python -m repro COMMAND`: the one front door (the Makefile, CI and the docs all call it).

Every error of the tool is a `ReproError`, caught once here: its message says what, why and
what to do, and its exit code tells the kind (the table is in docs/options.md, "Exit codes"; the
codes are defined in repro/core/errors.py). Subcommands live in thin handler modules that
register themselves with `repro.cli.registry.command`.
"""

from __future__ import annotations

import argparse
import sys
import unicodedata
from collections.abc import Sequence
from typing import NoReturn

from repro.cli.registry import SPECS, Handler
from repro.core import console, run_lock
from repro.core.diskfull import disk_full_error, is_disk_full
from repro.core.errors import Interrupted, ReproError, UsageError
from repro.core.signals import install_stop_handlers

# Exit codes that are not a ReproError's own (see docs/options.md, "Exit codes").
EXIT_USAGE = UsageError.exit_code
EXIT_INTERRUPTED = Interrupted.exit_code

_COMMAND_MODULES = (
    "repro.cli.run_commands",
    "repro.cli.bisect_commands",
    "repro.cli.upstream_commands",
    "repro.cli.pr_commands",
    "repro.cli.maintenance_commands",
    "repro.cli.job_commands",
    "repro.cli.gpu_check_commands",
)


class _BadOptions(Exception):
    """argparse's complaint, raised instead of its sys.exit(2) so the command picks the code."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser, self.message = parser, message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _BadOptions(self, message)


def build_parser() -> argparse.ArgumentParser:
    for name in _COMMAND_MODULES:  # the modules register their subcommands (heavy deps load on use only)
        __import__(name)
    parser = _Parser(
        prog="python -m repro",
        description=(
            "Reproduce DeepSpeed MiCS + torch>=2.1 IllegalWork bug (deepspeedai/DeepSpeed#5080) in "
            "pinned environments, with and without our fix."
        ),
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="show only results, warnings and errors (make: QUIET=1)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="also show details (make: VERBOSE=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for spec in SPECS.values():
        p = sub.add_parser(spec.name, help=spec.help, description=spec.help)
        if spec.configure is not None:
            spec.configure(p)
    return parser


# Options whose value is the user's free text and may itself start with `-`: make passes
# PACKAGES="--extra-index-url=..." as `--packages '--extra-index-url=...'`, which argparse took for
# an option of its own ("expected one argument"), so the check that says why pip options are not
# taken (repro/engines/jobdeps.py) was never reached. Such a value is attached as `--packages=...`.
_FREE_TEXT_OPTIONS = frozenset({"--packages", "--requirements"})


def attach_free_text_values(argv: Sequence[str]) -> list[str]:
    """`argv` with each free-text option's value attached to it when that value starts with `-`."""
    out: list[str] = []
    taken = False
    for i, arg in enumerate(argv):
        if taken:
            taken = False
            continue
        taken = arg in _FREE_TEXT_OPTIONS and i + 1 < len(argv) and argv[i + 1].startswith("-")
        out.append(f"{arg}={argv[i + 1]}" if taken else arg)
    return out


def main(argv: Sequence[str] | None = None, *, handler: Handler | None = None) -> int:
    """Parse, dispatch, and turn every ReproError into its exit code. `handler` replaces the
    registered one (tests drive `git bisect run` through here with a scripted probe)."""
    if argv is None:  # a real command line (tests pass argv): SIGTERM/SIGHUP act like Ctrl-C
        install_stop_handlers()
    args_list = attach_free_text_values(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    chosen = next((a for a in args_list if a in SPECS), None)
    error_exit = SPECS[chosen].error_exit if chosen else None
    try:
        refuse_control_characters(args_list)
    except UsageError as exc:
        console.error(exc.render())
        return error_exit or EXIT_USAGE
    try:
        args = parser.parse_args(args_list)
    except _BadOptions as bad:
        bad.parser.print_usage(sys.stderr)
        console.error(f"{bad.parser.prog}: error: {bad.message}")
        return error_exit or EXIT_USAGE
    # Set on every call, so one invocation's level never leaks into the next (tests call main()).
    console.set_level(console.level_from_flags(quiet=args.quiet, verbose=args.verbose))
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    args.argv = args_list
    try:
        return (handler or SPECS[args.command].handler)(args)
    except (KeyboardInterrupt, Interrupted) as exc:
        console.error(exc.render() if isinstance(exc, Interrupted) else "interrupted")
        return EXIT_INTERRUPTED
    except ReproError as exc:
        console.error(exc.render())
        return error_exit or exc.exit_code
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        # A write of ours that no door turned into its own message: still the disk's words, no
        # traceback (what was written is known only by its path here).
        full = disk_full_error(exc, "a file of this run")
        console.error(full.render())
        return error_exit or full.exit_code
    finally:
        console.close()  # a live display (repro/core/progress.py) leaves the terminal as it found it
        run_lock.release_all()  # tests call main() again in one process: the next run may lock


# Zero-width (non-)joiners are format characters that Persian, the Indic scripts and emoji need to
# be written at all: a folder name may hold them. Every other format character is invisible (or
# reorders what is shown, the bidi controls) and has no place in a name, path or command.
_JOINERS = frozenset("\u200c\u200d")


def _control_character(text: str) -> str | None:
    """How to name the first control character in `text`, or None: C0, DEL and C1 (U+0085 NEL
    among them); the line and paragraph separators U+2028/U+2029, which Python's splitlines(),
    editors and JavaScript take as line breaks; format characters (category Cf: the bidi marks,
    embeddings, overrides and isolates, zero-width spaces, the BOM), which make the value read
    as something it is not."""
    names = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab"}
    for ch in text:
        if ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0:
            return names.get(ch, f"the control character U+{ord(ch):04X}")
        kind = unicodedata.category(ch)
        if kind in ("Zl", "Zp"):
            return f"the {'line' if kind == 'Zl' else 'paragraph'} separator U+{ord(ch):04X}"
        if kind == "Cf" and ch not in _JOINERS:
            return f"the invisible format character U+{ord(ch):04X}"
    return None


def refuse_control_characters(argv: Sequence[str]) -> None:
    """No argument may hold a control character. Every value is a name, number, path or command
    line; a newline in one splits make recipes and the shell lines the tool prints to reproduce a
    run, and an escape sequence rewrites the terminal. UsageError naming the option, not the value."""
    for i, arg in enumerate(argv):
        found = _control_character(arg)
        if found is None:
            continue
        if arg.startswith("--") and "=" in arg:
            option = arg.split("=", 1)[0]
        elif i > 0 and argv[i - 1].startswith("-") and not arg.startswith("-"):
            option = argv[i - 1]
        else:
            option = f"argument {i + 1}"
        # The fix names it as make's users know it too: SLURM_TIME= (--slurm-time).
        given = f"{option[2:].upper().replace('-', '_')}= ({option})" if option.startswith("--") else option
        raise UsageError(
            f"the value of {option} holds {found}",
            why="values are names, numbers, paths or one-line commands; a control character in one "
            "would split the make and shell lines the tool runs and prints, and an invisible or bidi "
            "one makes them read as something they are not",
            fix=f"give {given} without it (several commands: put them in a script and run that)",
        )
