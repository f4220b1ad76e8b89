"""Write or check patches/deepspeed-<version>.patch from the fix's own text.

    python -m repro patches --check     shipped patches == what the fix generates (exit 0), else 21
    python -m repro patches --write     regenerate them
    python -m repro patches --print 0.19.6

Each patch is the pristine sdist file (read straight from deepspeed-<version>.tar.gz in the
wheelhouse) against the same file after `repro.workload.fix.patched_source`, the splice the
run-time fix also uses. A sdist missing from the wheelhouse is fetched with `pip download` (pip
checks it against the hash the index publishes); only an offline host (MICS_REPRO_OFFLINE=1)
stops with exit 17.
"""

from __future__ import annotations

import difflib
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from repro.core import cmd, console, paths
from repro.core.errors import ReproError
from repro.engines.wheelhouse import offline_mode
from repro.workload import fix

# The releases we ship patches for: the reporter's (0.13.1) and the last one with MiCS (0.19.6).
SHIPPED = ("0.13.1", "0.19.6")
PATCH_DIR = paths.PATCH_DIR


class SdistMissingError(ReproError):
    """The pristine DeepSpeed sdist the patch is made from is not in the wheelhouse."""

    exit_code = 17


class PatchDriftError(ReproError):
    """A shipped patch differs from what the fix's text generates."""

    exit_code = 21


def default_wheelhouse() -> Path:
    return paths.cache_root() / "wheelhouse"


def download_argv(version: str, wheelhouse: Path) -> list[str]:
    """pip fetches the sdist from the configured index (PIP_INDEX_URL etc.) and verifies it against
    the sha256 the index lists for it; a mismatch fails the download."""
    return [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
        "--no-binary", ":all:", "-d", str(wheelhouse), f"deepspeed=={version}",
    ]  # fmt: skip


def sdist_path(version: str, wheelhouse: Path, *, offline: bool | None = None) -> Path:
    """The pristine sdist in the wheelhouse, downloaded there first when missing (not offline)."""
    path = wheelhouse / f"deepspeed-{version}.tar.gz"
    if path.is_file():
        return path
    argv = download_argv(version, wheelhouse)
    if offline_mode() if offline is None else offline:
        raise SdistMissingError(
            f"{path} not found and MICS_REPRO_OFFLINE is set",
            why="patches are generated from the pristine DeepSpeed sdist",
            fix=f"on a host with access to PyPI run: {' '.join(argv[2:])} "
            "(or pass --wheelhouse with a folder that holds it)",
        )
    wheelhouse.mkdir(parents=True, exist_ok=True)
    log = paths.cache_root() / "logs" / "patches-sdist.log"  # pip's lines; shown in full if it fails
    with console.task(f"patches: {path.name} is not in the wheelhouse; fetching it"):
        done, _ = cmd.run_logged(argv, log, f"patches: pip download {path.name}")
    if not done.ok or not path.is_file():
        raise SdistMissingError(
            f"could not download {path.name}",
            why=f"`pip download` exited with {done.returncode} (output above, and in {log})",
            fix="check access to PyPI (behind a TLS-intercepting proxy set PIP_CERT), or pass "
            "--wheelhouse with a folder that holds the sdist",
        )
    return path


def read_members(sdist: Path, version: str, paths: Sequence[str]) -> dict[str, str]:
    """The named files of an sdist, by path relative to its root."""
    out: dict[str, str] = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for rel in paths:
            member = f"deepspeed-{version}/{rel}"
            handle = tar.extractfile(member)
            if handle is None:
                raise SdistMissingError(f"{sdist} has no regular file {member}")
            out[rel] = handle.read().decode("utf-8")
    return out


@dataclass(frozen=True)
class FileDiff:
    path: str
    diff: str
    added: int
    removed: int


def diff_file(path: str, before: str, after: str) -> FileDiff:
    if not before.endswith("\n"):
        # difflib would emit a line `patch` cannot apply without a "\ No newline" marker
        raise ReproError(f"{path} does not end with a newline; cannot write a clean diff")
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    lines = list(difflib.unified_diff(old, new, fromfile=f"a/{path}", tofile=f"b/{path}", n=3))
    added = sum(1 for ln in lines[2:] if ln.startswith("+"))
    removed = sum(1 for ln in lines[2:] if ln.startswith("-"))
    return FileDiff(path, "".join(lines), added, removed)


def file_diffs(version: str, wheelhouse: Path, *, offline: bool | None = None) -> list[FileDiff]:
    paths = sorted({t.path for t in fix.TARGETS})
    pristine = read_members(sdist_path(version, wheelhouse, offline=offline), version, paths)
    diffs = []
    for path in paths:
        targets = tuple(t for t in fix.TARGETS if t.path == path)
        try:
            after = fix.patched_source(pristine[path], targets)
        except fix.FixNotApplicableError as exc:
            raise ReproError(f"cannot make a patch for DeepSpeed {version}", why=exc.reason) from exc
        diffs.append(diff_file(path, pristine[path], after))
    return diffs


def render(version: str, diffs: Sequence[FileDiff]) -> str:
    # `patch` and `git apply` skip text before the first `---` line, so the header can explain.
    names = ", ".join(t.qualname for t in fix.TARGETS)
    header = (
        f"Fix for DeepSpeed {version}: wait on the coalescing manager's real work in MiCS's\n"
        "all-gather, and stop swallowing a failed wait (deepspeedai/DeepSpeed#5080).\n"
        f"Changes: {names}\n"
        "Generated by `python -m repro patches --write` from repro/workload/fix.py "
        f"(fix {fix.FIX_ID});\n"
        "do not edit by hand. Apply in the unpacked sdist root: patch -p1 < this-file\n\n"
    )
    return header + "".join(d.diff for d in diffs)


def patch_file(version: str, patch_dir: Path = PATCH_DIR) -> Path:
    return patch_dir / f"deepspeed-{version}.patch"


def generate(version: str, wheelhouse: Path, *, offline: bool | None = None) -> tuple[str, list[FileDiff]]:
    diffs = file_diffs(version, wheelhouse, offline=offline)
    return render(version, diffs), diffs


def stats(diffs: Sequence[FileDiff]) -> str:
    parts = [f"{d.path} +{d.added} -{d.removed}" for d in diffs]
    return f"{len(diffs)} files; " + ", ".join(parts)


def check(versions: Sequence[str], wheelhouse: Path, patch_dir: Path) -> list[str]:
    """Versions whose shipped patch is missing or differs from the generated one."""
    drifted = []
    for version in versions:
        text, diffs = generate(version, wheelhouse)
        shipped = patch_file(version, patch_dir)
        ok = shipped.is_file() and shipped.read_text() == text
        console.result(f"{'ok   ' if ok else 'DRIFT'} {shipped.name}: {stats(diffs)}")
        if not ok:
            drifted.append(version)
    return drifted
