"""`make verify-bundle BUNDLE=`: load a bundle's image, rerun the reproduction offline, compare.

A bundle comes from someone else, so it is untrusted input. Order: open the bundle (folder or .tar
archive: no links, no entry that climbs out), check every field of manifest.json against the
grammar the matrix uses and every file against its hash (a truncated or corrupt image fails here
with BundleError, before Docker is even asked for), refuse GPU privileges unless the user gave
consent and the host has the devices, say exactly what will run, then `docker load` the image
(streamed through gzip), run the suite in it with networking off through the Docker engine, and
compare each run's outcome and signature with the manifest. The verification run is an ordinary
results folder (results/<stamp>-verify-<env>/, nothing written outside it), so `make report
RESULTS=` works on it. A bundle of `make run CMD=` runs carries the command and its working
directory (workdir/): each patch of the command is rerun in the image like `make run ENGINE=docker`
(a fresh copy of workdir/ mounted read-write at its own path, network off) and judged by
repro.run.job; its records are compared like the suite's.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.core import console, records
from repro.core.errors import BundleError, UsageError
from repro.core.make_options import reproduce_pairs
from repro.core.makeline import make_line
from repro.core.paths import confined
from repro.core.printable import printable
from repro.core.results import EnvInfo, InvocationDir, invocation_meta, new_invocation_dir
from repro.engines.base import Engine, EngineKind, Prepared, SuiteRun
from repro.engines.gpu_host import GpuHost
from repro.engines.preflight import DockerFacts, check_cuda, check_rocm
from repro.run.job import JobRequest, build_records, job_args, read_raw, workdir_digest
from repro.upstream.bundle import image as bundle_image
from repro.upstream.bundle.archive import Loaded, load_archive
from repro.upstream.bundle.manifest import (
    Expected,
    JobBlock,
    Manifest,
    check_files,
    refuse_links,
    safe_relpath,
    suite_time_limit,
)
from repro.upstream.cluster import scripts as cluster
from repro.workload.record import Outcome, RunRecord, Signature, Transport

CONSENT_FLAG = "--allow-gpu-privileges"
CONSENT_MAKE = "ALLOW_PRIVILEGES=1"
SUITE_MODULE = "repro.workload.suite"
CONTAINER_RESULTS = "/results"


# Where collectives really complete in the background (the gloo adapter's async mode; NCCL/RCCL on
# GPUs), whether a rank reads the unwaited gather's buffers before or after they fill is a race: one
# run of the same stock job keeps its losses (illegal-work-warnings), the next parts them
# (illegal-work-divergence; measured on a user's job, torch 2.13 + DeepSpeed 0.19.6). Both are the
# bug's IllegalWork evidence, so there, and only there, either matches the other, marked "ok~".
# The strict and sync transports are deterministic and keep the exact match.
RACY_TRANSPORTS = frozenset({Transport.ASYNC.value, Transport.NATIVE.value})
SAME_EVIDENCE = frozenset({Signature.ILLEGAL_WORK_WARNINGS.value, Signature.ILLEGAL_WORK_DIVERGENCE.value})


@dataclass(frozen=True)
class Comparison:
    run_name: str
    expected: Expected | None
    outcome: str | None
    signature: str | None
    transport: str | None = None  # what the rerun's record says it ran on (None: not recorded)

    @property
    def other_transport(self) -> bool:
        """The rerun ran on another transport than the manifest's run: not the same run, whatever
        its outcome (a job's transport comes from the manifest's job, its expectation from its
        records; the two can disagree in a bundle made by hand or damaged)."""
        return (
            self.expected is not None
            and self.transport is not None
            and self.transport != self.expected.transport
        )

    @property
    def exact(self) -> bool:
        return (
            self.expected is not None
            and not self.other_transport
            and (self.outcome, self.signature) == (self.expected.outcome, self.expected.signature)
        )

    @property
    def timing_only(self) -> bool:
        """Reproduced both times with the same IllegalWork evidence, both on a racy transport; only
        whether the losses parted differs. The rerun's own record must say so: on the strict
        transport the two signatures are different results, not a race."""
        exp = self.expected
        return (
            exp is not None
            and not self.exact
            and not self.other_transport
            and exp.transport in RACY_TRANSPORTS
            and self.transport in RACY_TRANSPORTS
            and exp.outcome == self.outcome == Outcome.REPRODUCED.value
            and {exp.signature, str(self.signature)} <= SAME_EVIDENCE
        )

    @property
    def ok(self) -> bool:
        return self.exact or self.timing_only

    def line(self) -> str:
        want = f"{self.expected.outcome}/{self.expected.signature}" if self.expected else "(not expected)"
        got = f"{self.outcome}/{self.signature}" if self.outcome else "(no record)"
        tag = "ok  " if self.exact else "ok~ " if self.timing_only else "DIFF"
        note = ""
        if self.timing_only and self.expected is not None:
            note = f" (same IllegalWork evidence; whether losses part is a race on {self.expected.transport})"
        elif self.other_transport and self.expected is not None:
            note = (
                f" (ran on the {self.transport} transport, the manifest's run on {self.expected.transport})"
            )
        # outcome/signature come from records written inside the bundle's image: shown escaped.
        return printable(f"{tag} {self.run_name:<34} expected {want:<36} got {got}{note}")


@dataclass(frozen=True)
class VerifyResult:
    folder: Path
    image_id: str
    comparisons: tuple[Comparison, ...]

    @property
    def ok(self) -> bool:
        return bool(self.comparisons) and all(c.ok for c in self.comparisons)


def load_bundle(path: Path, workdir: Path) -> Loaded:
    """The bundle folder with its checked manifest: `path` itself, or the single folder inside a
    .tar archive (manifest read and checked before anything is extracted, see bundle_archive)."""
    if path.is_dir():
        refuse_links(path)
        return Loaded(path, Manifest.read(path), {})
    if not path.is_file():
        raise BundleError(f"{path} does not exist", fix="pass BUNDLE=<bundle folder or .tar archive>")
    return load_archive(path, workdir)


def compare(expected: Sequence[Expected], records: Sequence[Mapping[str, Any]]) -> tuple[Comparison, ...]:
    by_name = {str(r.get("run_name")): r for r in records}

    def seen(name: str, exp: Expected | None) -> Comparison:
        rec = by_name.pop(name, None) or {}
        transport = rec.get("transport")
        ran = str(transport) if transport is not None else None
        return Comparison(name, exp, rec.get("outcome"), rec.get("signature"), ran)

    found = [seen(exp.run_name, exp) for exp in expected]
    return tuple(found + [seen(name, None) for name in sorted(by_name)])


def check_privileges(platform: str, allow: bool, host: GpuHost, docker_info: Callable[[], Any]) -> None:
    """A GPU bundle gets device access and weaker isolation only with the user's consent, on a host
    that has the devices: the manifest must not choose privileges on its own."""
    if platform == "cpu":
        return
    flags = " ".join(cluster.docker_cli_flags(platform))
    if not allow:
        raise UsageError(
            f"this bundle is for {platform} and its container would run with extra privileges",
            why=f"`docker run {flags}`: device access and weaker isolation than a CPU bundle gets",
            fix=f"if you trust who made the bundle, pass {CONSENT_MAKE} (make) or {CONSENT_FLAG}",
        )
    if platform == "rocm":
        check_rocm(host)
    else:
        check_cuda(host, DockerFacts.from_info(docker_info()))


def plan_lines(manifest: Manifest, results_root: Path) -> list[str]:
    """What will run, said before anything runs."""
    env_id, platform = manifest.env["id"], str(manifest.env["platform"])
    flags = ["--network", "none", *cluster.docker_cli_flags(platform)]
    command = ["python", "-m", SUITE_MODULE, *manifest.suite_args, "--out", CONTAINER_RESULTS]
    lines = [f"verify: env {env_id} ({platform}), image {manifest.image['ref']} ({manifest.image['id']})"]
    if manifest.suite_args:
        lines.append(f"verify: will run: docker run {shlex.join(flags)} <image> {shlex.join(command)}")
    if manifest.job is not None:
        patches = ",".join(manifest.job["patches"])
        lines.append(
            f"verify: will run the bundle's own command ({patches}), its working directory mounted "
            f"at the same path, network off: {manifest.job['command']}"
        )
    lines.append(
        f"verify: results go to {results_root}/<stamp>-verify-{env_id}/ (nothing is written outside it)"
    )
    return lines


def job_workdir(folder: Path, manifest: Manifest, supplied: Path | None, scratch: Path) -> Path | None:
    """A fresh copy of the folder the custom command runs in (the job may write to it, and a bundle
    folder is never changed): the bundle's workdir/, or the one the user supplied when it was left out."""
    job = manifest.job
    if job is None:
        return None
    if job["workdir"] is not None:
        source = confined(folder, str(job["workdir"]))
        if source is None or not source.is_dir():
            raise BundleError(
                f"the bundle's working directory {job['workdir']}/ is missing",
                fix="copy the bundle again, or make a new one with `make bundle`",
            )
    elif supplied is not None and supplied.is_dir():
        source = supplied
    else:
        raise BundleError(
            "this bundle's custom command needs its working directory, which was too large to bundle",
            why="; ".join(n for n in manifest.notes if "workdir" in n)
            or "the manifest's job.workdir is null",
            fix="pass WORKDIR= (make) or --workdir <folder> with the folder the command ran in",
        )
    target = scratch / "job-workdir"
    shutil.copytree(source, target, symlinks=True)
    return target.resolve()


def run_job(
    engine: Engine,
    prepared: Prepared,
    job: JobBlock,
    workdir: Path,
    invocation: InvocationDir,
    platform: str,
    say: Callable[[str], None],
) -> list[RunRecord]:
    """Each patch of the custom command in the image, network off, judged as `make run` judges it."""
    env_id = prepared.env_id
    request = JobRequest(
        env_id=env_id,
        command=str(job["command"]),
        patches=tuple(job["patches"]),
        workdir=workdir,
        transport=str(job["transport"]),
        loss_regex=job["loss_regex"],
        timeout_s=float(job["timeout_s"]),
        stall_s=float(job["stall_s"]),
        network=False,
    )
    device = "cpu" if platform == "cpu" else "gpu"
    raws = []
    for patch in request.patches:
        out = invocation.env_dir(env_id) / f"custom-{patch}"
        say(f"verify: {patch}: {request.command}")
        ran = engine.run_job(
            prepared,
            job_args(request, patch, device),
            out,
            workdir,
            request.timeout_s + 120,
            network=False,
        )
        raws.append(read_raw(patch, out, invocation.folder, ran))
    records = build_records(env_id, raws, request.loss_regex, workdir_digest(workdir), request.timeout_s)
    return [r.copy() for r in records]


def _suite_output(suite_file: Path, env_id: str) -> tuple[list[Any], dict[str, str]]:
    """Runs and artifacts from the container's suite.json; it was written inside the bundle's image,
    so only well-formed records and artifact paths inside the env's folder are taken."""
    try:
        data = records.read(suite_file, "suite file") if suite_file.is_file() else {}
    except UsageError:  # not readable, too large, not UTF-8, not JSON, nested too deeply
        data = {}
    data = data if isinstance(data, dict) else {}
    runs = [r for r in data.get("runs") or [] if isinstance(r, dict)]
    raw = data.get("artifacts")
    artifacts = {
        str(k): f"{env_id}/{v}"
        for k, v in (raw if isinstance(raw, dict) else {}).items()
        if isinstance(v, str) and safe_relpath(v)
    }
    return runs, artifacts


def verify(
    bundle: Path,
    client: Any,
    results_root: Path,
    *,
    argv: Sequence[str] = (),
    engine_factory: Callable[[Any], Engine] | None = None,
    say: Callable[[str], None] = console.result,
    connect: Callable[[], Any] | None = None,
    allow_privileges: bool = False,
    workdir: Path | None = None,
    reuse_image: bool = False,
) -> VerifyResult:
    """`client`: a docker-py client, or None with `connect` making one once the bundle has passed
    every check that needs no Docker (so a missing or crafted bundle is named first). `workdir`:
    the custom command's working directory when the bundle could not carry it."""
    shown = say
    say = lambda line: shown(printable(line))  # noqa: E731 - the manifest's text is someone else's
    with tempfile.TemporaryDirectory(prefix="mics-bundle-") as tmp:
        opened = load_bundle(bundle, Path(tmp))
        folder, manifest = opened.folder, opened.manifest
        env_id, platform = str(manifest.env["id"]), str(manifest.env["platform"])
        say(f"verify: checking {len(manifest.files)} files of {folder.name} against manifest.json")
        check_files(folder, manifest, opened.hashes)
        job_dir = job_workdir(folder, manifest, workdir, Path(tmp))
        docker: list[Any] = [client] if client is not None else []

        def docker_client() -> Any:
            if not docker:
                if connect is None:
                    raise BundleError("no Docker client to load the bundle's image into")
                docker.append(connect())
            return docker[0]

        check_privileges(platform, allow_privileges, GpuHost(), lambda: docker_client().info())
        for line in plan_lines(manifest, results_root):
            say(line)
        image_id = str(manifest.image["id"])
        _load_image(docker_client, folder / str(manifest.image["file"]), image_id, reuse_image, say)
        invocation = _new_invocation(results_root, env_id, argv, bundle)
        out_root = invocation.folder
        client_now = docker_client()
        engine = engine_factory(client_now) if engine_factory else _docker_engine(client_now)
        prepared = Prepared(
            EngineKind.DOCKER,
            env_id,
            image_id,
            str(manifest.image["ref"]),
            True,
            {"platform": platform, "image_id": image_id},
        )
        say(f"verify: running the reproduction in {manifest.image['ref']} with networking off -> {out_root}")
        runs, artifacts, suite = _rerun(engine, prepared, manifest, job_dir, invocation, platform, say)
        invocation.add_env(env_id, _env_info(manifest, platform, image_id, artifacts, suite))
        invocation.add_runs(env_id, runs)
        invocation.finish()
        return VerifyResult(out_root, image_id, compare(manifest.expected, invocation.runs))


def _load_image(
    docker_client: Callable[[], Any], image_path: Path, image_id: str, reuse: bool, say: Callable[[str], None]
) -> None:
    """The bundle's image into Docker (or Docker's copy, REUSE_IMAGE=1); refused if not the manifest's."""
    if reuse and _has_image(docker_client(), image_id):
        # An image id is the digest of its config, which names every layer's digest: the same
        # id is the same image. The tarball's own hash was checked before, with every file.
        say(f"verify: Docker already has {image_id[:19]} (REUSE_IMAGE=1): {image_path.name} not loaded")
        loaded = [image_id]
    else:
        say(f"verify: loading {image_path.name} ({image_path.stat().st_size / 1e9:.2f} GB) into Docker")
        started = time.monotonic()
        loaded = bundle_image.load(docker_client(), image_path)
        say(f"verify: loaded in {time.monotonic() - started:.0f} s")
    if image_id not in loaded:
        raise BundleError(
            "the loaded image is not the one the manifest names",
            why=f"manifest: {image_id}; loaded: {', '.join(loaded) or 'nothing'}",
            fix="make the bundle again",
        )


def _new_invocation(results_root: Path, env_id: str, argv: Sequence[str], bundle: Path) -> InvocationDir:
    """The verification's own results folder, its invocation saved before anything runs."""
    out_root = new_invocation_dir(results_root, [f"verify-{env_id}"])
    if confined(out_root, env_id) is None:  # the manifest check refuses such ids; never trust one
        raise BundleError(f"env id {env_id!r} would leave the results folder {out_root}")
    meta = invocation_meta(list(argv), make_line("verify-bundle", reproduce_pairs({"BUNDLE": bundle})))
    invocation = InvocationDir(out_root, meta)
    invocation.save()
    return invocation


def _rerun(
    engine: Engine,
    prepared: Prepared,
    manifest: Manifest,
    job_dir: Path | None,
    invocation: InvocationDir,
    platform: str,
    say: Callable[[str], None],
) -> tuple[list[Any], dict[str, str], SuiteRun | None]:
    """The bundle's suite and its custom command in the image: (records, artifacts, the suite's run)."""
    env_id = prepared.env_id
    runs: list[Any] = []
    artifacts: dict[str, str] = {}
    suite = None
    if manifest.suite_args:
        suite = engine.run_suite(
            prepared, list(manifest.suite_args), invocation.env_dir(env_id), suite_time_limit(manifest.notes)
        )
        runs, artifacts = _suite_output(invocation.env_dir(env_id) / "suite.json", env_id)
    if manifest.job is not None and job_dir is not None:
        runs += run_job(engine, prepared, manifest.job, job_dir, invocation, platform, say)
    return runs, artifacts, suite


def _env_info(
    manifest: Manifest, platform: str, image_id: str, artifacts: Mapping[str, str], suite: SuiteRun | None
) -> EnvInfo:
    """The verification's entry for the env in results.json: the bundle's image and how the suite ended."""
    return {
        "platform": platform,
        "engine": "docker",
        "image_id": image_id,
        "pins": manifest.env.get("pins"),
        "derived_from": manifest.env.get("derived_from"),
        "artifacts": dict(artifacts),
        "suite_exit_code": suite.exit_code if suite else None,
        "suite_timed_out": suite.timed_out if suite else False,
    }


def _has_image(client: Any, image_id: str) -> bool:
    try:
        return str(client.images.get(image_id).id) == image_id
    except Exception:  # noqa: BLE001 - docker-py's ImageNotFound, or any answer that is not the image
        return False


def _docker_engine(client: Any) -> Engine:
    from repro.engines.docker.engine import DockerEngine

    return DockerEngine(client)


def report(result: VerifyResult) -> str:
    lines = [c.line() for c in result.comparisons]
    verdict = "every outcome matches the manifest" if result.ok else "outcomes differ from the manifest"
    raced = sum(c.timing_only for c in result.comparisons)
    if result.ok and raced:
        verdict += f" ({raced} with the other IllegalWork signature, marked ok~: see its line)"
    return "\n".join([*lines, f"verify: {verdict} (results: {result.folder})"])


def require_match(result: VerifyResult) -> None:
    if not result.ok:
        bad = [c.line() for c in result.comparisons if not c.ok]
        raise BundleError(
            "the bundle's image did not reproduce the outcomes in its manifest",
            why="; ".join(bad) or "no run produced a record",
            fix=f"read the runs in {result.folder} (the logs say why each run ended as it did)",
        )
