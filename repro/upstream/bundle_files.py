"""The files of a bundle besides the image: scrubbed copies, the final leak scan, sums, the archive."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from repro.core.errors import BundleError
from repro.core.paths import confined
from repro.upstream.bundle_manifest import MANIFEST
from repro.upstream.scrub import Scrubber

IMAGE_FILE = "image.tar.gz"
SUMS_FILE = "SHA256SUMS"


def copy_scrubbed(src: Path, dst: Path, scrubber: Scrubber) -> None:
    data = src.read_bytes()
    try:
        text, codec = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, codec = data.decode("latin-1"), "latin-1"
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(scrubber.text(text).encode(codec))


def copy_results(
    results: Path, env_id: str, dest: Path, scrubber: Scrubber, data: Mapping[str, Any]
) -> list[str]:
    """results.json with only this env, and the env's folder (logs, artifacts), scrubbed.

    Returns what was not copied because it leads outside the results folder (a symlink, or an env
    id that climbs out): a bundle carries the run's files, never a file the results merely point at.
    """
    own = dict(data)
    own["envs"] = {env_id: data["envs"][env_id]}
    own["runs"] = [r for r in data["runs"] if r.get("env") == env_id]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "results.json").write_text(
        json.dumps(scrubber.data(own), indent=1, sort_keys=True, allow_nan=False) + "\n"
    )
    source = confined(results, env_id)
    if source is None:
        return [f"{env_id}/"]
    root = Path(results).resolve()
    skipped: list[str] = []
    for path in sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else []:
        if path.suffix == ".pid":
            continue  # process ids of a finished run: nothing for a reader, something about the host
        rel = path.relative_to(root)
        if confined(root, rel) is None:  # a symlink (or a linked folder) that leads out
            skipped.append(rel.as_posix())
            continue
        copy_scrubbed(path, dest / env_id / path.relative_to(source), scrubber)
    return skipped


def artifact(folder: Path, env: Mapping[str, Any], name: str) -> str:
    """The text of one of the env's artifacts, read only from inside the results folder."""
    rel = (env.get("artifacts") or {}).get(name)
    path = confined(folder, str(rel)) if rel else None
    if rel and path is None:
        return f"({name} not read: its path leads outside the results folder)"
    return (
        path.read_text(errors="replace") if path is not None and path.is_file() else f"({name} not captured)"
    )


def scan(folder: Path, scrubber: Scrubber, skip: Sequence[str] = (IMAGE_FILE,)) -> None:
    """Refuse the bundle if any file still holds a value the scrubber knows, or a secret's shape
    (scrub.VALUE_PATTERNS, whatever this host's environment holds). The image is skipped: it is
    gzip (no text to match) and holds only what the build put there (build-only files flattened out)."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel in skip:
            continue
        hits = scrubber.leaks(path.read_bytes().decode("latin-1"))
        if hits:
            found.append(f"{rel}: {', '.join(hits)}")
    if found:
        raise BundleError(
            "the bundle would contain values from this host",
            why="; ".join(found),
            fix="report this as a bug of mics-repro; the bundle folder was left for inspection",
        )


def write_sums(folder: Path, hashes: Mapping[str, str]) -> None:
    lines = [f"{digest}  {rel}" for rel, digest in sorted(hashes.items()) if rel not in (MANIFEST, SUMS_FILE)]
    (folder / SUMS_FILE).write_text("\n".join(lines) + "\n")


def archive(folder: Path) -> Path:
    """<folder>.tar next to the folder: uncompressed (the image inside is already gzipped)."""
    target = folder.with_name(folder.name + ".tar")
    tmp = target.with_name(target.name + ".part")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(folder, arcname=folder.name, filter=_normalise)
    tmp.replace(target)
    return target


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # The archive must not carry the bundler's user and group names.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
