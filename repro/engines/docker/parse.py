"""A small Dockerfile reader for the lint: instructions, and the `pip install` runs inside RUN.

Enough of the Dockerfile and shell grammar for files this project generates (and hand edits of
them): continuation lines, comments, `&&`/`;` chains, `VAR=value` prefixes, pip options.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Instruction:
    line: int  # first line of the instruction, 1-based
    keyword: str  # upper case
    value: str  # continuation lines joined, comments dropped


def parse(text: str) -> list[Instruction]:
    """Dockerfile instructions (default escape character, no parser directives needed here)."""
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continuation are removed by Docker too
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        joined = " ".join(part.strip() for part in pending if part.strip())
        keyword, _, value = joined.partition(" ")
        out.append(Instruction(start, keyword.upper(), value.strip()))
        pending = []
    return out


# pip options that take a value (the value is not a requirement).
_PIP_VALUE_OPTIONS = set(
    "-i --index-url --extra-index-url -f --find-links --target -t --prefix --root --platform --python-version"
    " --implementation --abi --trusted-host --cert --client-cert --cache-dir --src --upgrade-strategy"
    " --progress-bar --log --proxy --retries --timeout --exists-action --global-option --config-settings -C"
    " --report --only-binary --no-binary".split()
)
PIP_UNVERIFIABLE = {"-r", "--requirement", "-c", "--constraint", "-e", "--editable"}
# `===` too: PyPI's torch is pinned by its whole version string (repro.matrix.compat.torch_spec).
EXACT_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)===?(?P<version>[0-9][A-Za-z0-9.+!-]*)$")
_PIP_EXE = re.compile(r"(^|/)pip(\d+(\.\d+)?)?$")
_SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}
_SHELL_WORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "{"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class PipInstall:
    line: int
    environment: dict[str, str] = field(hash=False)
    options: tuple[tuple[str, str | None], ...]
    specs: tuple[str, ...]

    def option(self, name: str) -> str | None:
        for key, value in self.options:
            if key == name:
                return value
        return None

    def has(self, name: str) -> bool:
        return any(key == name for key, _ in self.options)

    def names(self) -> set[str]:
        return {_name(spec) for spec in self.specs}


def _name(spec: str) -> str:
    return re.split(r"[=<>!~\[; @]", spec, maxsplit=1)[0].lower()


def _simple_commands(script: str) -> list[list[str]]:
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in _SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def pip_installs(instruction: Instruction) -> list[PipInstall]:
    found = []
    for words in _simple_commands(instruction.value):
        while words and words[0] in _SHELL_WORDS:
            words = words[1:]
        env: dict[str, str] = {}
        while words and _ASSIGNMENT.match(words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        for i in range(1, len(words)):
            if words[i] == "install" and _PIP_EXE.search(words[i - 1]):
                found.append(_pip_args(instruction.line, env, words[i + 1 :]))
                break
    return found


def _pip_args(line: int, env: dict[str, str], args: list[str]) -> PipInstall:
    options: list[tuple[str, str | None]] = []
    specs: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if eq:
                options.append((name, value))
            elif name in _PIP_VALUE_OPTIONS or name in PIP_UNVERIFIABLE:
                options.append((name, next(rest, None)))
            else:
                options.append((name, None))
        else:
            specs.append(arg)
    return PipInstall(line, env, tuple(options), tuple(specs))


def key_values(value: str) -> dict[str, str]:
    """`k="v" k2=v2` of LABEL/ENV instructions."""
    out = {}
    for word in shlex.split(value):
        key, _, val = word.partition("=")
        out[key] = val
    return out
