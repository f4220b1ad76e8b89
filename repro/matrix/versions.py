"""The ordered list of releases to bisect or survey, asked of the package index through pip.

pip is the client that already knows the user's index, proxy, certificates and constraints, so
the list comes from `pip index versions --pre PKG` (pip >= 21.2), or, where that command is
missing, from the "(from versions: ...)" line of a `pip download` of a version that cannot exist.
The raw list (pre-releases included) is cached per package, index and target Python for a day;
filtering to stable releases and to a range happens here, after the cache.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from repro.core import cmd, console
from repro.core.errors import UsageError
from repro.core.paths import cache_root

CACHE_TTL_S = 24 * 3600.0
# A version no index will ever carry: pip then lists every version it saw in its error message.
_IMPOSSIBLE = "0+mics.repro.no.such.version"
_INDEX_LINE = re.compile(r"^Available versions:\s*(.*)$", re.MULTILINE)
_DOWNLOAD_LINE = re.compile(r"\(from versions:\s*([^)]*)\)")

Runner = Callable[..., cmd.CmdResult]


@dataclass(frozen=True)
class VersionQuery:
    package: str
    index_url: str | None = None  # None: pip's configured index (PyPI)
    python: str | None = None  # target major.minor; None: the interpreter running pip
    binary_only: bool = False  # wheels-only packages (torch) must be matched for the target Python

    def cache_name(self) -> str:
        blob = json.dumps([self.package.lower(), self.index_url, self.python, self.binary_only]).encode()
        safe = re.sub(r"[^a-z0-9_.-]+", "_", self.package.lower())
        return f"{safe}-{hashlib.sha256(blob).hexdigest()[:12]}.json"


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip() and t.strip() != "none"]


def parse_pip_index(text: str) -> list[str]:
    match = _INDEX_LINE.search(text)
    return _split(match.group(1)) if match else []


def parse_pip_download_error(text: str) -> list[str]:
    match = _DOWNLOAD_LINE.search(text)
    return _split(match.group(1)) if match else []


def order_versions(raw: Iterable[str], prereleases: bool = False) -> tuple[str, ...]:
    """Ascending public versions: local labels (+cpu, +rocm5.6) folded, invalid ones dropped.

    The env's torch index already decides which build a version means, so "2.1.0" and
    "2.1.0+cpu" are one candidate.
    """
    seen: dict[Version, str] = {}
    for text in raw:
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        public = Version(version.public)
        if not prereleases and (public.is_prerelease or public.is_devrelease):
            continue
        seen.setdefault(public, str(public))
    return tuple(seen[v] for v in sorted(seen))


def select_range(versions: Sequence[str], start: str, end: str) -> tuple[str, ...]:
    """The candidates from `start` to `end` inclusive, ordered from start to end.

    The ends are kept even when the index does not list them (a yanked release, a local build):
    the user named them, and a probe that cannot install one reports it as unknown.
    A start newer than the end gives a descending list (looking for where something was fixed).
    """
    try:
        a, b = Version(start), Version(end)
    except InvalidVersion as exc:
        raise UsageError(f"not a version: {exc}", fix="give versions like 2.1.0 or 0.13.1") from None
    if a == b:
        raise UsageError(f"the range {start} .. {end} has one version", fix="give two different versions")
    lo, hi = min(a, b), max(a, b)
    chosen = {Version(v): v for v in versions if lo <= Version(v) <= hi}
    chosen.setdefault(a, start)
    chosen.setdefault(b, end)
    ordered = [chosen[v] for v in sorted(chosen)]
    return tuple(ordered if a < b else reversed(ordered))


class VersionIndex:
    """Release lists for version queries, with a small on-disk cache."""

    def __init__(
        self,
        cache_dir: Path | None = None,
        *,
        runner: Runner = cmd.run,
        python_exe: str = sys.executable,
        ttl_s: float = CACHE_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache_dir = cache_dir if cache_dir is not None else cache_root() / "versions"
        self.runner = runner
        self.python_exe = python_exe
        self.ttl_s = ttl_s
        self.clock = clock

    def available(
        self, query: VersionQuery, *, prereleases: bool = False, refresh: bool = False
    ) -> tuple[str, ...]:
        raw = None if refresh else self._cached(query)
        if raw is None:
            raw = self._fetch(query)
            self._store(query, raw)
        return order_versions(raw, prereleases=prereleases)

    # -- cache -------------------------------------------------------------------------------
    def _path(self, query: VersionQuery) -> Path:
        return self.cache_dir / query.cache_name()

    def _cached(self, query: VersionQuery) -> list[str] | None:
        try:
            data = json.loads(self._path(query).read_text())
            if self.clock() - float(data["fetched_at"]) > self.ttl_s:
                return None
            return [str(v) for v in data["versions"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _store(self, query: VersionQuery, raw: list[str]) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = self._path(query).with_suffix(".tmp")
        tmp.write_text(json.dumps({"fetched_at": self.clock(), "query": query.__dict__, "versions": raw}))
        tmp.replace(self._path(query))

    # -- pip ---------------------------------------------------------------------------------
    def _target(self, query: VersionQuery) -> list[str]:
        args = ["--disable-pip-version-check"]
        if query.index_url:
            args += ["--index-url", query.index_url]
        if query.python:
            args += ["--python-version", query.python]
            if query.binary_only:
                args += ["--only-binary", ":all:"]
        return args

    def _fetch(self, query: VersionQuery) -> list[str]:
        console.info(
            f"versions: asking the index for {query.package} releases"
            f"{' on ' + query.index_url if query.index_url else ''}",
        )
        pip = [self.python_exe, "-m", "pip"]
        result = self.runner(
            [*pip, "index", "versions", "--pre", *self._target(query), query.package], capture=True
        )
        found = parse_pip_index(result.stdout) if result.ok else []
        if not found:
            # Older pip has no `index` command; a failed download of an impossible version lists
            # what the index has in its error message.
            with tempfile.TemporaryDirectory(prefix="mics-repro-versions-") as scratch:
                result = self.runner(
                    [
                        *pip,
                        "download",
                        "--no-deps",
                        "-d",
                        scratch,
                        *self._target(query),
                        f"{query.package}=={_IMPOSSIBLE}",
                    ],
                    capture=True,
                )
            found = parse_pip_download_error(result.stdout + "\n" + result.stderr)
        if not found:
            raise UsageError(
                f"could not get the list of {query.package} releases from the package index",
                why=result.tail() or "pip printed no versions",
                fix="check network access to the index, or pass the candidates yourself with "
                "VERSIONS=a,b,c (--versions)",
            )
        return found
