"""`make verify-bundle BUNDLE=`: load a bundle's image, rerun the reproduction offline, compare.

Order: open the bundle (folder or .tar archive), check every file against manifest.json (a
truncated or corrupt image fails here with BundleError, before Docker sees it), `docker load` the
image (streamed through gzip: a bad stream is a BundleError too), run the suite in it with
networking off through the Docker engine, and compare each run's outcome and signature with the
manifest. The verification run is an ordinary results folder (results/<stamp>-verify-<env>/), so
`make report RESULTS=` works on it.
"""

from __future__ import annotations

import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.core.errors import BundleError
from repro.core.results import InvocationDir, invocation_meta, new_invocation_dir
from repro.engines.base import EngineKind, Prepared
from repro.upstream import bundle_image
from repro.upstream.bundle_manifest import Expected, Manifest, check_files
from repro.workload.record import read_json


@dataclass(frozen=True)
class Comparison:
    run_name: str
    expected: Expected | None
    outcome: str | None
    signature: str | None

    @property
    def ok(self) -> bool:
        return self.expected is not None and (self.outcome, self.signature) == (
            self.expected.outcome,
            self.expected.signature,
        )

    def line(self) -> str:
        want = f"{self.expected.outcome}/{self.expected.signature}" if self.expected else "(not expected)"
        got = f"{self.outcome}/{self.signature}" if self.outcome else "(no record)"
        return f"{'ok  ' if self.ok else 'DIFF'} {self.run_name:<34} expected {want:<36} got {got}"


@dataclass(frozen=True)
class VerifyResult:
    folder: Path
    image_id: str
    comparisons: tuple[Comparison, ...]

    @property
    def ok(self) -> bool:
        return bool(self.comparisons) and all(c.ok for c in self.comparisons)


def _safe_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    members = []
    for member in tar.getmembers():
        parts = Path(member.name).parts
        if Path(member.name).is_absolute() or ".." in parts or not (member.isfile() or member.isdir()):
            raise BundleError(f"the archive holds an unsafe entry: {member.name}",
                              fix="only extract bundles made by `make bundle`")
        members.append(member)
    return members


def open_bundle(path: Path, workdir: Path) -> Path:
    """The bundle folder: `path` itself, or the single folder inside a .tar archive."""
    if path.is_dir():
        return path
    if not path.is_file():
        raise BundleError(f"{path} does not exist", fix="pass BUNDLE=<bundle folder or .tar archive>")
    try:
        with tarfile.open(path, "r:*") as tar:
            members = _safe_members(tar)
            tar.extractall(workdir, members=members)  # noqa: S202 - members checked above
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleError(f"{path.name} is not a readable bundle archive", why=f"{type(exc).__name__}: {exc}",
                          fix="copy it again (the archive is truncated or corrupt) or use the bundle folder"
                          ) from None
    tops = sorted({Path(m.name).parts[0] for m in members if Path(m.name).parts})
    if len(tops) != 1:
        raise BundleError(f"{path.name} should hold one bundle folder, found {tops or 'nothing'}")
    return workdir / tops[0]


def compare(expected: Sequence[Expected], records: Sequence[Mapping[str, Any]]) -> tuple[Comparison, ...]:
    by_name = {str(r.get("run_name")): r for r in records}
    out = []
    for exp in expected:
        rec = by_name.pop(exp.run_name, None)
        out.append(Comparison(exp.run_name, exp, rec.get("outcome") if rec else None,
                              rec.get("signature") if rec else None))
    out += [Comparison(name, None, r.get("outcome"), r.get("signature"))
            for name, r in sorted(by_name.items())]
    return tuple(out)


def suite_timeout(manifest: Manifest) -> float | None:
    for note in manifest.notes:
        if note.startswith("suite time limit "):
            return float(note.split()[3])
    return None


def verify(bundle: Path, client: Any, results_root: Path, *, argv: Sequence[str] = (),
           engine_factory: Callable[[Any], Any] | None = None,
           say: Callable[[str], None] = print) -> VerifyResult:
    with tempfile.TemporaryDirectory(prefix="mics-bundle-") as tmp:
        folder = open_bundle(bundle, Path(tmp))
        manifest = Manifest.read(folder)
        env_id = str(manifest.env["id"])
        say(f"verify: checking {len(manifest.files)} files of {folder.name} against manifest.json")
        check_files(folder, manifest)
        image_path = folder / str(manifest.image["file"])
        say(f"verify: loading {image_path.name} ({image_path.stat().st_size / 1e9:.2f} GB) into Docker")
        started = time.monotonic()
        loaded = bundle_image.load(client, image_path)
        say(f"verify: loaded in {time.monotonic() - started:.0f} s")
        image_id = str(manifest.image["id"])
        if image_id not in loaded:
            raise BundleError("the loaded image is not the one the manifest names",
                              why=f"manifest: {image_id}; loaded: {', '.join(loaded) or 'nothing'}",
                              fix="make the bundle again")
        out_root = new_invocation_dir(results_root, [f"verify-{env_id}"])
        invocation = InvocationDir(out_root, invocation_meta(list(argv), f"make verify-bundle BUNDLE={bundle}"))
        invocation.save()
        engine = engine_factory(client) if engine_factory else _docker_engine(client)
        prepared = Prepared(EngineKind.DOCKER, env_id, image_id, str(manifest.image["ref"]), True,
                            {"platform": str(manifest.env.get("platform") or "cpu"), "image_id": image_id})
        say(f"verify: running the reproduction in {manifest.image['ref']} with networking off -> {out_root}")
        suite = engine.run_suite(prepared, list(manifest.suite_args), invocation.env_dir(env_id),
                                 suite_timeout(manifest))
        suite_file = invocation.env_dir(env_id) / "suite.json"
        data = read_json(str(suite_file)) if suite_file.is_file() else {"runs": []}
        invocation.add_env(env_id, {"platform": manifest.env.get("platform"), "engine": "docker",
                                    "image_id": image_id, "pins": manifest.env.get("pins"),
                                    "derived_from": manifest.env.get("derived_from"),
                                    "artifacts": {k: f"{env_id}/{v}" for k, v in
                                                  (data.get("artifacts") or {}).items()},
                                    "suite_exit_code": suite.exit_code, "suite_timed_out": suite.timed_out})
        invocation.add_runs(env_id, list(data.get("runs") or []))
        invocation.finish()
        return VerifyResult(out_root, image_id, compare(manifest.expected, invocation.runs))


def _docker_engine(client: Any) -> Any:
    from repro.engines.docker.engine import DockerEngine

    return DockerEngine(client)


def report(result: VerifyResult) -> str:
    lines = [c.line() for c in result.comparisons]
    verdict = "every outcome matches the manifest" if result.ok else "outcomes differ from the manifest"
    return "\n".join([*lines, f"verify: {verdict} (results: {result.folder})"])


def require_match(result: VerifyResult) -> None:
    if not result.ok:
        bad = [c.line() for c in result.comparisons if not c.ok]
        raise BundleError("the bundle's image did not reproduce the outcomes in its manifest",
                          why="; ".join(bad) or "no run produced a record",
                          fix=f"read the runs in {result.folder} (the logs say why each run ended as it did)")
