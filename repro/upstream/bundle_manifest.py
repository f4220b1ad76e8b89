"""manifest.json of a bundle: what is in it (sha256 of every file), how to run it, what to expect.

Written last by `repro.upstream.bundle`, read first by `repro.upstream.verify_bundle`. The expected outcomes are
copied from the records of the env's runs, keyed by run name, so a verification compares like
with like.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from repro.core.errors import BundleError

MANIFEST = "manifest.json"
KIND = "mics-repro-bundle"
SCHEMA = 1


@dataclass(frozen=True)
class Expected:
    run_name: str
    scenario: str
    patch: str
    dtype: str
    transport: str
    world_size: int
    outcome: str
    signature: str

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Expected:
        return cls(
            str(rec["run_name"]),
            str(rec["scenario"]),
            str(rec["patch"]),
            str(rec["dtype"]),
            str(rec["transport"]),
            int(rec["world_size"]),
            str(rec["outcome"]),
            str(rec["signature"]),
        )


@dataclass(frozen=True)
class Manifest:
    tool_version: str
    created_at: str
    env: dict[str, Any]
    image: dict[str, Any]
    suite_args: tuple[str, ...]
    commands: dict[str, str]
    expected: tuple[Expected, ...]
    files: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_json(self) -> str:
        data = {"kind": KIND, "schema": SCHEMA, **asdict(self)}
        data["suite_args"] = list(self.suite_args)
        data["expected"] = [asdict(e) for e in self.expected]
        data["notes"] = list(self.notes)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise BundleError(
                f"{folder} has no {MANIFEST}",
                why="it is not a bundle made by `make bundle`",
                fix="pass BUNDLE=<the bundle folder or its .tar archive>",
            ) from None
        except (OSError, ValueError) as exc:
            raise BundleError(f"{path} cannot be read", why=str(exc), fix="copy the bundle again") from None
        if not isinstance(data, dict) or data.get("kind") != KIND or data.get("schema") != SCHEMA:
            raise BundleError(
                f"{path} is not a schema-{SCHEMA} bundle manifest",
                fix="make the bundle again with this version of the tool",
            )
        try:
            return cls(
                str(data["tool_version"]),
                str(data["created_at"]),
                dict(data["env"]),
                dict(data["image"]),
                tuple(data["suite_args"]),
                dict(data["commands"]),
                tuple(Expected(**e) for e in data["expected"]),
                dict(data["files"]),
                tuple(data.get("notes") or ()),
            )
        except (KeyError, TypeError) as exc:
            raise BundleError(f"{path} lacks a field ({exc})", fix="make the bundle again") from None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_hashes(
    folder: Path, skip: Sequence[str] = (MANIFEST,), known: Mapping[str, str] | None = None
) -> dict[str, str]:
    """sha256 of every regular file under `folder` by relative path; `known` avoids re-reading big ones."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel in skip:
            continue
        out[rel] = (known or {}).get(rel) or sha256_file(path)
    return out


def check_files(folder: Path, manifest: Manifest) -> None:
    """Every listed file is present with its hash, and nothing unlisted was added."""
    problems = []
    for rel, want in sorted(manifest.files.items()):
        path = folder / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif sha256_file(path) != want:
            size = manifest.image.get("bytes") if rel == manifest.image.get("file") else None
            hint = f" ({path.stat().st_size} bytes, manifest says {size})" if size else ""
            problems.append(f"{rel} differs from the manifest{hint}")
    extra = sorted(set(file_hashes(folder)) - set(manifest.files))
    problems += [f"{rel} is not in the manifest" for rel in extra]
    if problems:
        raise BundleError(
            f"the bundle in {folder} does not match its manifest",
            why="; ".join(problems),
            fix="copy the bundle again, or make a new one with `make bundle`",
        )
