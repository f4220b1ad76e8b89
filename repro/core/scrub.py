"""Keep the host out of what we hand to others: secrets, home paths, host and user names.

A `Scrubber` is built once from the host (`Scrubber.from_host()`), then rewrites every text that
goes into a bundle and, as a second line of defence, `leaks()` finds anything that survived.
Two kinds of rule:
- by value, from this host: the value of every environment variable whose name looks secret
  (a `_`-separated part such as PASS, PW, PWD, KEY, TOKEN, SECRET, CREDENTIAL, AUTH, COOKIE, or
  a known compound like PASSWORD, API_KEY, PROXY), whatever its length; the value of any other
  variable that looks like a credential (TOKEN_LIKE: long, no spaces, letters and digits mixed;
  or a URL with a user and password); the home folder, the repository checkout and the tool's
  cache folder (as path prefixes); the host name and user name as whole words unless generic.
  Other values ("1", "cpu", "/usr/bin/python3") identify nobody, and replacing them everywhere
  would garble the evidence;
- by shape, whatever the host (VALUE_PATTERNS): AWS access key ids, Hugging Face, GitHub and Slack
  tokens, private-key blocks, the user:password of a URL. These catch a secret that reached a
  record or collect_env output from somewhere else, when the bundling shell's environment is clean.
Longer values are replaced first, so a path inside a longer value is never half-replaced.
"""

from __future__ import annotations

import enum
import getpass
import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Matched anywhere in the name: compounds that are secret wherever they appear.
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|API_?KEY|"
    r"ACCESS_?KEY|PROXY|WEBHOOK|DSN$",
    re.IGNORECASE,
)
# Matched against whole `_`-separated parts of the name: short words that are secret as a part
# (DB_PASS, MY_PW, SSH_KEY) but not inside another word (PATH, KEYBOARD, COMPASS, BYPASS_CACHE).
SECRET_NAME_PARTS = frozenset({"PASS", "PWD", "PW", "KEY", "KEYS", "CREDS", "CRED"})
# A part that ends in one of these is a secret's name too (SSHPASS, DBPWD, SSHKEY, APIKEY), unless
# it is an ordinary word that happens to end so.
SECRET_NAME_ENDINGS = ("PASS", "PWD", "KEY")
ORDINARY_WORDS = frozenset({"BYPASS", "COMPASS", "SURPASS", "OVERPASS", "MONKEY", "HOCKEY", "TURNKEY"})
# Variables that hold the current or previous working directory: a path, scrubbed as one.
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


@dataclass(frozen=True)
class ValuePattern:
    """A secret recognised by its shape; `group` is the part replaced (0: the whole match);
    `accept`, when given, decides for each match (a name that says secret)."""

    name: str
    regex: re.Pattern[str]
    group: int = 0
    accept: Callable[[re.Match[str]], bool] | None = None

    def matches(self, text: str) -> bool:
        return any(self.accept is None or self.accept(m) for m in self.regex.finditer(text))

    @property
    def placeholder(self) -> str:
        return f"<{self.name}>"


VALUE_PATTERNS = (
    ValuePattern(
        "private-key",
        re.compile(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"
            r"(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----|[A-Za-z0-9+/=\s]*)",
            re.DOTALL,
        ),
    ),
    ValuePattern("aws-access-key-id", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])")),
    ValuePattern("hf-token", re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{20,}")),
    ValuePattern(
        "github-token",
        re.compile(r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
    ),
    ValuePattern("slack-token", re.compile(r"(?<![A-Za-z0-9])xox[abprs]-[A-Za-z0-9-]{10,}")),
    ValuePattern("credentials", re.compile(r"://([^/\s:@<>]+:[^/\s@<>]+)@"), group=1),
    # SSHPASS=..., Password=... in a connection string, "DB_TOKEN": "..." in a dump; the value
    # never starts with "<" (a placeholder already put there) and ends at a separator.
    ValuePattern(
        "secret",
        re.compile(
            r"(?<![A-Za-z0-9_$])[\"']?([A-Za-z_][A-Za-z0-9_]{1,63})[\"']?\s*[=:]\s*[\"']?(?![<\s])([^\s'\";&,]+)"
        ),
        group=2,
        accept=lambda m: _secret_assignment(m),
    ),
)


def secret_name(name: str) -> bool:
    """Whether an environment variable's name says its value is a secret."""
    parts = {p for p in re.split(r"[_\W]+", name.upper()) if p}
    ends = any(p.endswith(SECRET_NAME_ENDINGS) and p not in ORDINARY_WORDS for p in parts)
    return bool(SECRET_NAME.search(name)) or bool(parts & SECRET_NAME_PARTS) or ends


def _secret_assignment(match: re.Match[str]) -> bool:
    """`NAME=value` in a text (an env dump, a command line, a connection string's `Password=`)
    whose name says secret; `PWD=/path` is the working directory, scrubbed as a path."""
    name, value = match.group(1), match.group(2)
    return secret_name(name) and not (name.upper() in CWD_NAMES and value.startswith("/"))


def _replace_group(pattern: ValuePattern) -> Callable[[re.Match[str]], str]:
    def sub(match: re.Match[str]) -> str:
        if pattern.accept is not None and not pattern.accept(match):
            return match.group(0)
        if pattern.group == 0:
            return pattern.placeholder
        start, end = match.span(pattern.group)
        whole_start = match.start()
        text = match.group(0)
        return text[: start - whole_start] + pattern.placeholder + text[end - whole_start :]

    return sub


class Kind(enum.Enum):
    LITERAL = "literal"  # anywhere (secrets: a partial match is still a leak)
    PATH = "path"  # a path prefix: not when the next character continues a name (/home/al vs /home/alice)
    WORD = "word"  # a whole word (host and user names)


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
    ) -> Scrubber:
        env = dict(os.environ if environ is None else environ)
        rules: dict[str, Rule] = {}

        def add(
            value: str, placeholder: str, *, kind: Kind = Kind.LITERAL, minimum: int = MIN_SECRET
        ) -> None:
            value = value.strip()
            if len(value) < minimum or value in rules:
                return
            rules[value] = Rule(value, placeholder, kind)

        cwd: list[tuple[str, str]] = []
        for name, value in sorted(env.items()):
            if name.upper() in CWD_NAMES and value.strip().startswith("/"):
                cwd.append((value, f"<{name}>"))  # after the named folders: <repo> or ~ reads better
            elif secret_name(name):
                add(value, f"<{name}>")
            elif TOKEN_LIKE.match(value.strip()) or URL_CREDENTIALS.search(value):
                add(value, f"<${name}>")
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

    def with_paths(self, paths: Mapping[str, str | Path]) -> Scrubber:
        """This scrubber plus folders to replace by a placeholder (e.g. where the bundle is written)."""
        extra = [Rule(str(p).rstrip("/"), name, Kind.PATH) for name, p in paths.items() if len(str(p)) > 1]
        known = {r.secret for r in self.rules}
        rules = [*self.rules, *(r for r in extra if r.secret not in known)]
        return Scrubber(tuple(sorted(rules, key=lambda r: (-len(r.secret), r.secret))))

    def text(self, text: str) -> str:
        for rule in self.rules:
            if rule.secret in text:
                # A function, not a template: placeholders like "<$X>" must not be read as escapes.
                text = rule.pattern().sub(_constant(rule.placeholder), text)
        for pattern in VALUE_PATTERNS:
            text = pattern.regex.sub(_replace_group(pattern), text)
        return text

    def data(self, value: Any) -> Any:
        """Every string inside a JSON-like value, keys included."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.data(v) for v in value]
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.data(v) for k, v in value.items()}
        return value

    def leaks(self, text: str) -> list[str]:
        """Placeholders of the values and shapes still present in `text` (never the values themselves)."""
        found = {r.placeholder for r in self.rules if r.secret in text and r.pattern().search(text)}
        found |= {p.placeholder for p in VALUE_PATTERNS if p.matches(text)}
        return sorted(found)


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
