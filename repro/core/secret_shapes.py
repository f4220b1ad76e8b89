"""What a secret looks like in a text, whatever the host: token shapes, and values that a name
says are secret (`NAME=value`, `"password": "..."`, `--api-key X`, `Authorization: Bearer ...`).

Each `ValuePattern` marks the part of a match that is the secret (its `v*` groups) so the
scrubber (repro.core.scrub) replaces the whole value and keeps the evidence around it. The same
patterns are the leak check: a text that still matches one after scrubbing is refused.

Why our own list and not detect-secrets (Yelp): its last release (1.5.0, 2024-05) has no shape for
Google `AIza...`, Hugging Face `hf_...`, Anthropic `sk-ant-...` or OpenAI keys without the
`T3BlbkFJ` marker, its keyword and entropy plugins flag 40-hex commit hashes and checksums (the
evidence of every bisection here), and it reports findings per line, not spans to replace. The
shapes below follow its plugins where it has one (GitLab prefixes, JWT, AWS, Slack, private keys).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

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
# Words that contain TOKEN or SESSION and name no secret: counts of text tokens and tokenizers
# (TOKENIZERS_PARALLELISM=false would otherwise replace every "false" of a bundle), a desktop's
# session type (XDG_SESSION_CLASS=user: every "user").
_NOT_SECRET_WORDS = re.compile(r"TOKENI[SZ][A-Z]*|TOKENS(?![A-Z])|XDG_SESSION_[A-Z]+|DBUS_SESSION_[A-Z_]+")
# Options whose value is a place or a switch, not the secret (--password-file, --use-auth-token).
_OPTION_NOT_VALUE_PARTS = frozenset({"FILE", "PATH", "DIR", "ENV", "CMD", "COMMAND"})
_OPTION_SWITCH_PARTS = frozenset({"NO", "USE", "WITH", "WITHOUT", "SKIP"})
# A value already replaced: `<secret>`, `<$NAME>`, `<hf-token>`; or a scheme and one (`Bearer <jwt>`).
PLACEHOLDER = re.compile(r"(?:[A-Za-z]+[ \t]+)?<[\w$.:-]+>")


def secret_name(name: str) -> bool:
    """Whether a variable's, key's or option's name says its value is a secret."""
    upper = _NOT_SECRET_WORDS.sub("", name.upper())
    parts = {p for p in re.split(r"[_\W]+", upper) if p}
    ends = any(p.endswith(SECRET_NAME_ENDINGS) and p not in ORDINARY_WORDS for p in parts)
    return bool(SECRET_NAME.search(upper)) or bool(parts & SECRET_NAME_PARTS) or ends


@dataclass(frozen=True)
class ValuePattern:
    """A secret recognised by its shape. The replaced part is the first named group whose name
    starts with "v" that took part in the match (the value of `key: value`), else the whole match;
    `accept`, when given, decides for each match (a name that says secret)."""

    name: str
    regex: re.Pattern[str]
    accept: Callable[[re.Match[str]], bool] | None = None

    def span(self, match: re.Match[str]) -> tuple[int, int] | None:
        """Where the secret is in `match`, or None when this match is no secret."""
        if self.accept is not None and not self.accept(match):
            return None
        for group, value in match.groupdict().items():
            if group.startswith("v") and value is not None:
                return match.span(group)
        return match.span()

    def found(self, text: str) -> Iterator[tuple[int, int]]:
        """The secrets' spans in `text`, left to right. A match that is no secret (a name that
        is not secret) is stepped over to the end of its name, not skipped whole: `"log": "... \\"password\\":
        \\"x\\" ..."` holds a secret inside the value of a harmless name."""
        pos = 0
        while (match := self.regex.search(text, pos)) is not None:
            where = self.span(match)
            if where is None:
                # A new match cannot start inside a name (each begins after a non-word
                # character), so the search goes on after it: into the value, never past it.
                named = match.end("name") if "name" in match.groupdict() else -1
                pos = max(match.start() + 1, named)
                continue
            yield where
            pos = max(match.end(), match.start() + 1)

    def matches(self, text: str) -> bool:
        return next(self.found(text), None) is not None

    @property
    def placeholder(self) -> str:
        return f"<{self.name}>"

    def sub(self, text: str) -> str:
        out, last = [], 0
        for start, end in self.found(text):
            out += [text[last:start], self.placeholder]
            last = end
        return "".join(out) + text[last:]


def _not_placeholder(match: re.Match[str]) -> bool:
    value = next((v for g, v in match.groupdict().items() if g.startswith("v") and v is not None), "")
    return bool(value.strip()) and not PLACEHOLDER.fullmatch(value.strip())


def _named_secret(match: re.Match[str]) -> bool:
    """`NAME=value`, `"name": "value"` whose name says secret; `PWD=/path` is the working
    directory (scrubbed as a path by the host rules)."""
    name = match.group("name")
    value = next((v for g, v in match.groupdict().items() if g.startswith("v") and v is not None), "")
    if name.upper() in ("PWD", "OLDPWD") and value.startswith("/"):
        return False
    return secret_name(name) and _not_placeholder(match)


def secret_option(name: str) -> bool:
    """Whether the option `--<name>` takes a secret as its value (--password, --api-key; not
    --password-file, --use-auth-token)."""
    parts = [p for p in re.split(r"[_\W]+", name.upper()) if p]
    if not parts or parts[-1] in _OPTION_NOT_VALUE_PARTS or parts[0] in _OPTION_SWITCH_PARTS:
        return False
    return secret_name(name)


def takes_secret(arg: str) -> bool:
    """`--password` alone in an argv list: the next argument is its value."""
    match = re.fullmatch(r"--?([A-Za-z][A-Za-z0-9_-]*)", arg)
    return match is not None and secret_option(match.group(1))


def _secret_option(match: re.Match[str]) -> bool:
    return secret_option(match.group("name")) and _not_placeholder(match)


# The value after a separator, to its end: inside a JSON string (\"...\"), double or single
# quoted (to the closing quote, spaces included), or bare. An unclosed quote ends at the line's end,
# or at a bare double quote (the end of the JSON string it is in: an argv element `AUTH='a` of
# `AUTH='a b'`), so a value never runs on into the next JSON string.
_ESCAPED = r'\\"(?P<ve>(?:(?!\\")[^\n"])*)(?:\\")?'
_DOUBLE = r'"(?P<vd>(?:[^"\\\n]|\\.)*)"?'
_SINGLE = r"""'(?P<vs>[^'\n"]*)'?"""
# A value single-quoted inside a word that is single-quoted again: `make run CMD='... --password
# '"'"'a b'"'"''` (how shlex.quote closes, quotes and reopens a quote), `'\''`, and both as JSON
# escapes them. Matched before _SINGLE, which would stop at the first inner quote.
_REQUOTE = r"""'(?:"'"|\\"'\\"|\\'|\\\\')'"""
_NESTED = rf"{_REQUOTE}(?P<vn>(?:(?!{_REQUOTE})[^\n])*)(?:{_REQUOTE})?"
_QUOTED = rf"(?:{_NESTED}|{_ESCAPED}|{_DOUBLE}|{_SINGLE})"
_NAME = r"(?P<name>[A-Za-z_][A-Za-z0-9_-]{1,63})"
_TOKEN_CHARS = r"[A-Za-z0-9_-]"


def _named(*, bare: bool) -> tuple[ValuePattern, ValuePattern]:
    """`NAME=value` and `name: value` whose name says secret. `bare`: also an unquoted value;
    in source code one is an expression (`key: str`, `api_key = os.environ[...]`), not a secret."""
    assign_bare = r"|(?P<vu>[^\s'\"\\;&,]+)" if bare else ""
    line_bare = r"|(?P<vl>[^\s\"'\\][^\n\"'\\]*?)(?=[ \t]*(?:[\r\n\"'\\]|\Z))" if bare else ""
    return (
        # NAME=value (shell, env dumps, connection strings): a bare value ends at a separator;
        # `==` is a comparison.
        ValuePattern(
            "secret",
            re.compile(
                rf"(?<![A-Za-z0-9_$-])\\?[\"']?{_NAME}\\?[\"']?[ \t]*=(?!=)[ \t]*(?:{_QUOTED}{assign_bare})"
            ),
            accept=_named_secret,
        ),
        # name: value (JSON, YAML, logs): a bare value runs to the end of the line (or of the
        # string it is in), since "password: correct horse battery staple" is one value.
        ValuePattern(
            "secret",
            re.compile(rf"(?<![A-Za-z0-9_$-])\\?[\"']?{_NAME}\\?[\"']?[ \t]*:[ \t]*(?:{_QUOTED}{line_bare})"),
            accept=_named_secret,
        ),
    )


VALUE_PATTERNS: tuple[ValuePattern, ...] = (
    ValuePattern(
        "private-key",
        re.compile(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"
            r"(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----|[A-Za-z0-9+/=\s]*)",
            re.DOTALL,
        ),
    ),
    ValuePattern(
        "jwt", re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{4,}(?:\.[A-Za-z0-9_-]*)?")
    ),
    ValuePattern(
        "aws-access-key-id",
        re.compile(
            r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA)[A-Z0-9]{16}(?![A-Za-z0-9])"
        ),
    ),
    ValuePattern(
        "github-token",
        re.compile(r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
    ),
    ValuePattern(
        "gitlab-token",
        re.compile(
            rf"(?<![A-Za-z0-9_])gl(?:pat|oas|dt|rt|cbt|ptt|ft|imt|agent|soat|sa)-{_TOKEN_CHARS}{{20,}}"
        ),
    ),
    ValuePattern("anthropic-key", re.compile(rf"(?<![A-Za-z0-9_-])sk-ant-{_TOKEN_CHARS}{{20,}}")),
    # Legacy sk-<48>, project sk-proj-..., service account sk-svcacct-...; a digit somewhere, so
    # that no long hyphenated word beginning "sk-" is taken for one.
    ValuePattern(
        "openai-key", re.compile(rf"(?<![A-Za-z0-9_-])sk-(?={_TOKEN_CHARS}*[0-9]){_TOKEN_CHARS}{{20,}}")
    ),
    ValuePattern("google-api-key", re.compile(rf"(?<![A-Za-z0-9_-])AIza{_TOKEN_CHARS}{{30,}}")),
    ValuePattern("hf-token", re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{20,}")),
    ValuePattern("slack-token", re.compile(r"(?<![A-Za-z0-9])(?:xox[abposr]|xapp)-[A-Za-z0-9-]{10,}")),
    ValuePattern("stripe-key", re.compile(r"(?<![A-Za-z0-9_])[rs]k_(?:live|test)_[A-Za-z0-9]{16,}")),
    ValuePattern("npm-token", re.compile(r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}")),
    ValuePattern("pypi-token", re.compile(rf"(?<![A-Za-z0-9_])pypi-AgE{_TOKEN_CHARS}{{50,}}")),
    # An HTTP header: the credential after the scheme (Bearer, Basic, token...), or the whole value.
    ValuePattern(
        "credentials",
        re.compile(
            r"(?i:(?<![A-Za-z0-9_-])(?:proxy-)?authorization)\\?[\"']?[ \t]*[:=][ \t]*\\?[\"']?"
            r"(?:[A-Za-z]+[ \t]+)?(?P<v>[^\s\"'\\,;]+)"
        ),
        accept=_not_placeholder,
    ),
    ValuePattern(
        "credentials",
        re.compile(
            r"(?<![A-Za-z0-9_-])(?:[Bb]earer|[Bb]asic)[ \t]+"
            r"(?P<v>(?=[A-Za-z0-9._~+/-]*[0-9._~+/=-])[A-Za-z0-9._~+/-]{8,}=*)"
        ),
        accept=_not_placeholder,
    ),
    # user:password@ in a URL, to the last "@" before the host (a password may hold "@").
    ValuePattern("credentials", re.compile(r"://(?P<v>[^/\s:<>\"']+:[^/\s<>\"']+)@")),
    # --password X, --api-key "a b", --token=X, "--password", "X" (an argv list in JSON).
    ValuePattern(
        "secret",
        re.compile(
            rf"(?<![A-Za-z0-9_-])--?(?P<name>[A-Za-z][A-Za-z0-9_-]*)(?:=|[ \t]+|\\?[\"'][ \t]*,\s*)"
            rf"(?:{_QUOTED}|(?P<vu>(?!-)[^\s'\"\\;&,]+))"
        ),
        accept=_secret_option,
    ),
    *_named(bare=True),
)


# Source code (a job's working directory): quoted values only for a name that says secret.
CODE_PATTERNS: tuple[ValuePattern, ...] = (*VALUE_PATTERNS[:-2], *_named(bare=False))


# -- secrets in an argv: a command line split into its words (shlex) ---------------------------------
# Options whose value is `user:password` (curl -u/--user/--proxy-user, wget-style --user): the
# part after the first colon is the secret. Without a colon the value is only a name (or, for
# `python -u` and `pip install --user`, no value at all), so nothing is taken; nor from a URL
# (`pip install --user git+https://...`: its credentials have a shape of their own) or a
# `uid:gid` (`docker run -u 1000:1000`).
USER_OPTIONS = frozenset({"-u", "--user", "--proxy-user"})
_OPTION_EQ = re.compile(r"(--?[A-Za-z][A-Za-z0-9_-]*)=", re.DOTALL)
_ATTACHED_USER = re.compile(r"-u(?=[^\s:=-][^\s:]*:.)")  # curl -ualice:pw
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]{0,63})=", re.DOTALL)
# A value that names another place instead of holding the secret: `$HF_TOKEN`, `${HF_TOKEN}`.
_REFERENCE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
# Switch values of secret-named options and variables (--use_auth_token=true, HF_HUB_DISABLE_TOKEN=1).
_SWITCH_VALUES = frozenset({"", "0", "1", "true", "false", "none", "null", "yes", "no", "on", "off"})


def argv_secret_spans(argv: Sequence[str]) -> list[tuple[int, int, int]]:
    """Where the secrets are in `argv`, as (index, start, end) inside argv[index]: the argument
    after `--password`/`--token`/`--api-key` (takes_secret), the value of `--password=X`, the
    password of `-u user:pass`/`--user=user:pass`, the value of a `NAME=value` assignment whose name
    says secret (`PASSWORD=x python ...`, `hub.token=x`). Token shapes and URL credentials inside
    an argument are found by VALUE_PATTERNS, like anywhere else."""
    found = []
    for index, arg in enumerate(argv):
        span = _argv_value(argv[index - 1] if index else "", arg)
        if span is not None and _is_value(arg[span[0] : span[1]]):
            found.append((index, *span))
    return found


def _argv_value(prev: str, arg: str) -> tuple[int, int] | None:
    if takes_secret(prev):
        return None if arg.startswith("-") else (0, len(arg))
    if prev in USER_OPTIONS:
        return _password_of(arg, 0)
    if (option := _OPTION_EQ.match(arg)) is not None:
        if takes_secret(option.group(1)):
            return option.end(), len(arg)
        return _password_of(arg, option.end()) if option.group(1) in USER_OPTIONS else None
    if (attached := _ATTACHED_USER.match(arg)) is not None:
        return _password_of(arg, attached.end())
    if (assign := _ASSIGNMENT.match(arg)) is not None:
        name, value = assign.group(1), arg[assign.end() :]
        if name.upper() in ("PWD", "OLDPWD") and value.startswith("/"):
            return None  # the working directory: a path, scrubbed as one by the host rules
        return (assign.end(), len(arg)) if secret_name(name) else None
    return None


def _password_of(arg: str, start: int) -> tuple[int, int] | None:
    user, colon, password = arg[start:].partition(":")
    if not colon or not user or "//" in arg[start:] or (user.isdigit() and password.isdigit()):
        return None
    return start + len(user) + 1, len(arg)


def _is_value(value: str) -> bool:
    return not (
        value.lower() in _SWITCH_VALUES or _REFERENCE.fullmatch(value) or PLACEHOLDER.fullmatch(value.strip())
    )
