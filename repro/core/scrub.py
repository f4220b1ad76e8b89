"""Keep the host and secrets out of what the lab hands out: bundles, ISSUE.md, REPORT.md,
report.html, ISSUE_COMMENT.md, the bundle's README and cluster scripts.

A `Scrubber` is built once (`Scrubber.from_host()` for what goes to others; `Scrubber.secrets()`
for a report read on this host, whose paths must keep working). Every text handed out goes through
one gate, `hand_out()`: scrub, then the leak check (`leaks()`) on the result; a text that still
holds anything is refused (LeakError), never written. Two kinds of rule:
- by value, from this host: the value of every environment variable whose name looks secret
  (a `_`-separated part such as PASS, PW, PWD, KEY, TOKEN, SECRET, CREDENTIAL, AUTH, COOKIE, or
  a known compound like PASSWORD, API_KEY, PROXY), whatever its length; the value of any other
  variable that looks like a credential (TOKEN_LIKE: long, no spaces, letters and digits mixed;
  or a URL with a user and password); the home folder, the repository checkout and the tool's
  cache folder (as path prefixes); the host name and user name as whole words unless generic.
  Other values ("1", "cpu", "/usr/bin/python3") identify nobody, and replacing them everywhere
  would garble the evidence;
- by shape, whatever the host (repro.core.secret_shapes.VALUE_PATTERNS): token shapes (JWT, AWS,
  GitHub, GitLab, OpenAI, Anthropic, Google, Hugging Face, Slack...), private-key blocks, auth
  headers, URL passwords, and whole values that a name says are secret (`--password X`,
  `"password": "a b c"`, `NAME=value`). These catch a secret that reached a record, a log or a
  command from somewhere else, when the bundling shell's environment is clean.
Longer values are replaced first, so a path inside a longer value is never half-replaced.
"""

from __future__ import annotations

import enum
import getpass
import html
import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.core import command_scrub
from repro.core.errors import CommandSecretError, LeakError
from repro.core.secret_shapes import (
    CODE_PATTERNS,
    PLACEHOLDER,
    VALUE_PATTERNS,
    ValuePattern,
    secret_name,
    takes_secret,
)

__all__ = ["Form", "Kind", "Rule", "Scrubber", "ValuePattern", "hand_out", "refuse_leaks", "secret_name"]

CWD_NAMES = frozenset({"PWD", "OLDPWD"})
TOKEN_LIKE = re.compile(r"^(?=[^/\s]*\d)(?=[^/\s]*[A-Za-z])[A-Za-z0-9_\-+=.~:]{16,}$")
URL_CREDENTIALS = re.compile(r"://[^/\s:@]+:[^/\s@]+@")
# Values that appear in every log on every machine: replacing them would hide evidence, and
# they identify nobody.
GENERIC_WORDS = frozenset(
    {
        "root",
        "localhost",
        "localhost.localdomain",
        "user",
        "runner",
        "docker",
        "ubuntu",
        "debian",
        "admin",
        "nobody",
        "vm",
        "host",
        "server",
    }
)
MIN_SECRET = 4
MIN_WORD = 3
# Values of secret-named variables that are switches, not secrets (HF_HUB_DISABLE_..._TOKEN=true):
# replacing every "true" of a bundle would hide evidence and protect nothing.
TRIVIAL_VALUES = frozenset({"true", "false", "none", "null", "yes", "no", "on", "off"})
# Images embedded in report.html: base64, not text; a token shape inside is chance, not a secret.
DATA_URI = re.compile(r"data:[\w/+.-]+;base64,[A-Za-z0-9+/=]+")


class Kind(enum.Enum):
    LITERAL = "literal"  # anywhere (secrets: a partial match is still a leak)
    PATH = "path"  # a path prefix: not when the next character continues a name (/home/al vs /home/alice)
    WORD = "word"  # a whole word (host and user names)
    COMMAND = "command"  # a secret value of a recorded command line: anywhere, like LITERAL


@dataclass(frozen=True)
class Rule:
    secret: str
    placeholder: str
    kind: Kind = Kind.LITERAL

    def pattern(self) -> re.Pattern[str]:
        escaped = re.escape(self.secret)
        if self.kind is Kind.WORD:
            return re.compile(rf"(?<![\w.-]){escaped}(?![\w-])")
        if self.kind is Kind.PATH:
            return re.compile(rf"{escaped}(?![\w.-])")
        return re.compile(escaped)


@dataclass(frozen=True)
class Scrubber:
    rules: tuple[Rule, ...]

    @classmethod
    def from_host(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        home: str | None = None,
        hostnames: Iterable[str] | None = None,
        user: str | None = None,
        paths: Mapping[str, str] | None = None,
        secrets_only: bool = False,
    ) -> Scrubber:
        """`secrets_only`: the values of secret-named variables and credential URLs, and no
        paths, host or user names (a report read on this host links to its own files)."""
        env = dict(os.environ if environ is None else environ)
        rules: dict[str, Rule] = {}

        def add(
            value: str, placeholder: str, *, kind: Kind = Kind.LITERAL, minimum: int = MIN_SECRET
        ) -> None:
            value = value.strip()
            if len(value) < minimum or value in rules or value.lower() in TRIVIAL_VALUES:
                return
            rules[value] = Rule(value, placeholder, kind)

        cwd: list[tuple[str, str]] = []
        for name, value in sorted(env.items()):
            if name.upper() in CWD_NAMES and value.strip().startswith("/"):
                cwd.append((value, f"<{name}>"))  # after the named folders: <repo> or ~ reads better
            elif secret_name(name):
                add(value, f"<{name}>")
            elif URL_CREDENTIALS.search(value) or (TOKEN_LIKE.match(value.strip()) and not secrets_only):
                add(value, f"<${name}>")
        if secrets_only:
            return cls(tuple(sorted(rules.values(), key=lambda r: (-len(r.secret), r.secret))))
        for placeholder, path in sorted((paths or {}).items()):
            add(str(path).rstrip("/"), placeholder, kind=Kind.PATH, minimum=2)
        home_dir = (home if home is not None else str(Path.home())).rstrip("/")
        if home_dir and home_dir != "/":
            add(home_dir, "~", kind=Kind.PATH, minimum=2)
        for value, placeholder in cwd:
            add(value.rstrip("/"), placeholder, kind=Kind.PATH, minimum=2)
        names = list(hostnames) if hostnames is not None else _host_names()
        for name in names:
            if name and name.lower() not in GENERIC_WORDS:
                add(name, "<host>", kind=Kind.WORD, minimum=MIN_WORD)
        login = user if user is not None else _user_name()
        if login and login.lower() not in GENERIC_WORDS:
            add(login, "<user>", kind=Kind.WORD, minimum=MIN_WORD)
        ordered = sorted(rules.values(), key=lambda r: (-len(r.secret), r.secret))
        return cls(tuple(ordered))

    @classmethod
    def secrets(cls, environ: Mapping[str, str] | None = None) -> Scrubber:
        """Secrets only: this host's secret values and every secret shape, no paths or names."""
        return cls.from_host(environ, secrets_only=True)

    def with_paths(self, paths: Mapping[str, str | Path]) -> Scrubber:
        """This scrubber plus folders to replace by a placeholder (e.g. where the bundle is written)."""
        extra = [Rule(str(p).rstrip("/"), name, Kind.PATH) for name, p in paths.items() if len(str(p)) > 1]
        known = {r.secret for r in self.rules}
        rules = [*self.rules, *(r for r in extra if r.secret not in known)]
        return Scrubber(tuple(sorted(rules, key=lambda r: (-len(r.secret), r.secret))))

    def with_command_secrets(self, records: Any) -> Scrubber:
        """This scrubber plus every secret value of the command lines in `records` (a results,
        bisect or survey file, a run record): each replaced wherever it appears in any text, in
        every form a rendering may give it (command_scrub.renderings), not only where its option
        name stands next to it."""
        known = {r.secret for r in self.rules}
        extra: dict[str, Rule] = {}
        for value in command_scrub.secret_values(records):
            for form in command_scrub.renderings(value.strip()):
                if form not in known and _worth_a_rule(form):
                    extra[form] = Rule(form, _placeholder_of(form), Kind.COMMAND)
        if not extra:
            return self
        rules = [*self.rules, *extra.values()]
        return Scrubber(tuple(sorted(rules, key=lambda r: (-len(r.secret), r.secret))))

    def command(self, line: str) -> str:
        """A command line with its secrets replaced word by word before it is quoted again
        (command_scrub.scrub_line), then scrubbed as any text."""
        return self.text(command_scrub.scrub_line(line)[0])

    def text(self, text: str, form: Form | None = None) -> str:
        """`text` scrubbed; `form` Form.CODE: source code, where an unquoted value is code."""
        for rule in self.rules:
            if rule.secret in text:
                # A function, not a template: placeholders like "<$X>" must not be read as escapes.
                text = rule.pattern().sub(_constant(rule.placeholder), text)
        for pattern in _patterns(form):  # token shapes first: their placeholder names the kind
            text = pattern.sub(text)
        return text

    def data(self, value: Any) -> Any:
        """Every string inside a JSON-like value, keys included, also by the secret values of
        the command lines it holds (with_command_secrets). A command line (a key such as
        "command", "argv", "reproduce": command_scrub.command_key) loses its secrets word by word
        before its quoting is seen; in a list (an argv), the argument after `--password` or
        `--api-key` is its value and replaced whole."""
        return self.with_command_secrets(value)._data(value, None)

    def _data(self, value: Any, kind: str | None) -> Any:
        """`kind`: command_scrub.ARGV or LINE when `value` is (or holds) command lines."""
        inner = command_scrub.LINE if kind is not None else None
        if isinstance(value, str):
            return self.command(value) if kind is not None else self.text(value)
        if isinstance(value, list):
            if kind == command_scrub.ARGV and all(isinstance(v, str) for v in value):
                value = command_scrub.scrub_argv(value)[0]
            out = [self._data(v, inner) for v in value]
            for i in range(1, len(out)):
                prev, item = value[i - 1], out[i]
                if isinstance(prev, str) and takes_secret(prev) and isinstance(item, str):
                    if not item.startswith("-") and not PLACEHOLDER.fullmatch(item):
                        out[i] = "<secret>"
            return out
        if isinstance(value, dict):
            kinds = {k: command_scrub.command_kind(k) or inner for k in value}
            return {
                self.text(k) if isinstance(k, str) else k: self._data(v, kinds[k]) for k, v in value.items()
            }
        return value

    def command_leaks(self, text: str, form: Form | None = None) -> bool:
        """Whether `text` still holds a secret value of a recorded command line (Kind.COMMAND)."""
        plain = DATA_URI.sub("", text)
        texts = [plain, html.unescape(plain)] if form is Form.HTML else [plain]
        return any(r.kind is Kind.COMMAND and r.secret in seen for r in self.rules for seen in texts)

    def leaks(self, text: str, form: Form | None = None) -> list[str]:
        """Placeholders of the values and shapes still present in `text` (never the values
        themselves); in HTML, also as a reader sees it (entities decoded). Embedded images skipped."""
        texts = [DATA_URI.sub("", text)]
        if form is Form.HTML:
            texts.append(html.unescape(texts[0]))
        found: set[str] = set()
        for seen in texts:
            found |= {r.placeholder for r in self.rules if r.secret in seen and r.pattern().search(seen)}
            found |= {p.placeholder for p in _patterns(form) if p.matches(seen)}
        return sorted(found)


class Form(enum.Enum):
    TEXT = "text"  # plain text, Markdown, JSON, shell
    HTML = "html"  # also checked as a reader sees it: entities decoded (&quot; is a quote)
    CODE = "code"  # source code: `key: str`, `token = os.environ[...]` are code, not secrets

    @classmethod
    def for_path(cls, path: Path) -> Form:
        if path.suffix.lower() in (".html", ".htm"):
            return cls.HTML
        return cls.CODE if path.suffix.lower() in CODE_SUFFIXES else cls.TEXT


# A job's own sources travel in its working directory and must still run in verify-bundle.
CODE_SUFFIXES = frozenset(
    {".py", ".pyi", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".js", ".ts", ".rs", ".go"}
)


def _patterns(form: Form | None) -> tuple[ValuePattern, ...]:
    return CODE_PATTERNS if form is Form.CODE else VALUE_PATTERNS


def hand_out(text: str, scrubber: Scrubber, name: str, form: Form = Form.TEXT) -> str:
    """The gate every text the lab hands out passes: scrubbed, then refused if anything survived.
    `name` says which text in the error (ISSUE.md, report/report.html...)."""
    # Scrubbed around embedded images, never inside them (base64 that happens to look like a key).
    parts, images = DATA_URI.split(text), DATA_URI.findall(text)
    clean = scrubber.text(parts[0], form) + "".join(
        i + scrubber.text(p, form) for i, p in zip(images, parts[1:])
    )
    refuse_leaks(clean, scrubber, name, form)
    return clean


def refuse_leaks(text: str, scrubber: Scrubber, name: str, form: Form = Form.TEXT) -> None:
    """Raise LeakError when `text` still holds a value or shape the scrubber knows (the message
    names the kinds, never the values); CommandSecretError when what it holds is a secret of the
    recorded command line."""
    if scrubber.command_leaks(text, form):
        raise command_secret_error([name])
    hits = scrubber.leaks(text, form)
    if hits:
        raise LeakError(
            f"{name} would still hold: {', '.join(hits)}",
            why="after scrubbing, the leak check still finds these (placeholders, not the values); "
            "nothing was written",
            fix="report this as a bug of mics-repro with the kinds above; until it is fixed, remove "
            "the secret from the results folder, the command line or the environment and run again",
        )


def command_secret_error(where: Iterable[str]) -> CommandSecretError:
    """The refusal when a secret of the command line would be handed out (in a file's name, in a
    form no rendering replaces). `where`: the files, never the value."""
    return CommandSecretError(
        f"refused: {', '.join(where)} would hand out a secret from the recorded command line "
        "(a --password/--token/--api-key value, a user:password, a NAME=value whose name says secret)",
        why="the value could not be replaced there (the secret itself is not shown here); "
        "nothing was handed out: what this command wrote is removed",
        fix="keep secrets off the command line: let the job read them from an environment variable "
        "or a file (e.g. --password-file), rename any file named after one, run the job again "
        "(`make run RESUME=1` does not help: the record keeps the command) and then bundle or report it",
    )


def _placeholder_of(value: str) -> str:
    """What replaces a command's secret value: what its token shapes become (`Bearer <jwt>`, as
    in any other text), else `<secret>`."""
    shaped = value
    for pattern in VALUE_PATTERNS:
        shaped = pattern.sub(shaped)
    return shaped if shaped != value else command_scrub.PLACEHOLDER


def _worth_a_rule(value: str) -> bool:
    """A value long enough to replace wherever it appears without garbling the evidence around it
    (`pw` would hit every `pwd`); shorter ones are replaced where their option names them."""
    trivial = value.lower() in TRIVIAL_VALUES or PLACEHOLDER.fullmatch(value) is not None
    return len(value) >= MIN_SECRET and not trivial


def _constant(value: str) -> Callable[[re.Match[str]], str]:
    return lambda _match: value


def _host_names() -> list[str]:
    names = {socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    names |= {n.split(".")[0] for n in list(names)}
    return sorted(n for n in names if n)


def _user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""
