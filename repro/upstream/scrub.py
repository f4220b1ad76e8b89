"""Keep the host out of what we hand to others: secrets, home paths, host and user names.

A `Scrubber` is built once from the host (`Scrubber.from_host()`), then rewrites every text that
goes into a bundle and, as a second line of defence, `leaks()` finds any value that survived.
What counts as host-identifying:
- the value of every environment variable whose name looks secret (token, key, password, proxy
  with credentials...), whatever its length;
- the value of any other environment variable that looks like a credential: a token-like string
  (TOKEN_LIKE: long, no spaces, letters and digits mixed) or a URL with a user and password.
  Other values ("1", "cpu", "/usr/bin/python3", "noninteractive") identify nobody, and replacing
  them everywhere would garble the evidence;
- the home folder, the repository checkout and the tool's cache folder (as path prefixes);
- the host name (short and fully qualified) and the user name, as whole words, unless they are
  generic (`root`, `localhost`).
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

SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|API_?KEY|"
    r"ACCESS_?KEY|_KEY$|^KEY$|PROXY|WEBHOOK|DSN$",
    re.IGNORECASE,
)
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

        for name, value in sorted(env.items()):
            if SECRET_NAME.search(name):
                add(value, f"<{name}>")
            elif TOKEN_LIKE.match(value.strip()) or URL_CREDENTIALS.search(value):
                add(value, f"<${name}>")
        for placeholder, path in sorted((paths or {}).items()):
            add(str(path).rstrip("/"), placeholder, kind=Kind.PATH, minimum=2)
        home_dir = (home if home is not None else str(Path.home())).rstrip("/")
        if home_dir and home_dir != "/":
            add(home_dir, "~", kind=Kind.PATH, minimum=2)
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
        """Placeholders of the values still present in `text` (never the values themselves)."""
        return sorted({r.placeholder for r in self.rules if r.secret in text and r.pattern().search(text)})


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
