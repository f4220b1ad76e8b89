"""`make bundle ENV=`: everything a maintainer needs to see the bug, in one folder and one archive.

    bundles/<env>/image.tar.gz      the image, flattened without build-only files, gzipped
                  manifest.json     image id, pins, sha256 of every file, commands, expected outcomes
                  SHA256SUMS        the same hashes for `sha256sum -c`
                  README.md         docker load / docker run --network none / what to expect
                  ISSUE_COMMENT.md  ready to paste into deepspeedai/DeepSpeed#5080
                  report/           the verdict report of the env's runs
                  results/          the records and per-run logs they rest on
                  deepspeed-<v>.patch, cluster/ (Slurm + Apptainer, torchrun)
                  workdir/          a custom command's working directory (`make run CMD=` runs), when
                                    it fits (bundle_files.WORKDIR_MAX_BYTES); else a note says so
    bundles/<env>.tar               the folder as one archive

Plan as data (`BundleRequest` -> `make_bundle`), Docker behind `repro.upstream.bundle.image`. Every text
goes through `repro.core.scrub` on its way in (the records before anything is rendered from them, each
written text through `hand_out`), and the finished folder is scanned again: a bundle that still contains
a host value or a secret's shape is refused (LeakError), not shipped, and what it wrote is removed. A
secret of the recorded command line is replaced by value wherever it appears; one that cannot be (a
file named after it) is refused with CommandSecretError (exit 24).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from repro import __version__
from repro.core import console, paths, templating
from repro.core.errors import BundleError, LeakError, ReproError
from repro.core.evidence import platform_mismatch
from repro.core.make_options import reproduce_pairs
from repro.core.makeline import make_line
from repro.core.results import EnvInfo, ResultsData
from repro.core.results import load as load_results
from repro.core.scrub import Scrubber, hand_out
from repro.upstream import patchgen
from repro.upstream.bundle import comment as issue_comment
from repro.upstream.bundle import image as bundle_image
from repro.upstream.bundle import source_refs
from repro.upstream.bundle.files import (
    IMAGE_FILE,
    WORKDIR_DIR,
    archive,
    artifact,
    check_archive_free,
    copy_results,
    copy_workdir,
    scan,
    write_sums,
)
from repro.upstream.bundle.manifest import MANIFEST, BundleImage, Expected, JobBlock, Manifest, file_hashes
from repro.upstream.cluster import scripts as cluster
from repro.workload.record import CPU_TRANSPORTS, CUSTOM_SCENARIO, PATCHES, SCENARIOS, RunRecord

REPO_ROOT = paths.REPO_ROOT
CONTAINER_OUT = "/out"
_SUITE_MODULE = "repro.workload.suite"
_JOB_MODULE = "repro.workload.job"
DEFAULT_STALL_S = 300.0  # the records do not keep STALL_TIMEOUT; the default of `make run`


@dataclass(frozen=True)
class BundleRequest:
    env_id: str
    out: Path
    results: Path
    gzip_level: int = 1
    archive: bool = True
    keep_image: bool = False


@dataclass(frozen=True)
class BundleResult:
    folder: Path
    archive: Path | None
    manifest: Manifest


def default_out(env_id: str) -> Path:
    return REPO_ROOT / "bundles" / re.sub(r"[^A-Za-z0-9_.+-]", "_", env_id)


# -- what the bundle says, computed from the results -------------------------------------------
def refuse_other_platform(env_id: str, platform: str | None, records: Sequence[Mapping[str, Any]]) -> None:
    """A bundle presents its runs as evidence for the env: never runs that ran elsewhere (a rocm
    env's runs that fell back to CPU, the cpu env's runs on a GPU)."""
    wrong = [(r.get("run_name"), why) for r in records if (why := platform_mismatch(r, platform))]
    if wrong:
        raise BundleError(
            f"{len(wrong)} run(s) of {env_id} did not run on its platform ({platform}): no evidence for it",
            why="; ".join(f"{name}: {why}" for name, why in wrong[:3]),
            fix=f"rerun `make repro ENV={env_id}` on a host where the env's devices are visible, then bundle",
        )


def suite_args_from_records(env_id: str, records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The suite command line that plans the same runs as `records` (see repro.workload.suite.plan)."""
    controls = [r for r in records if r["scenario"] == "zero3" and r["patch"] == "stock"]
    transports = sorted({str(r["transport"]) for r in controls or records})
    sync_proof = "sync" not in transports and any(
        (r["scenario"], r["patch"], r["transport"]) == ("mics", "stock", "sync") for r in records
    )
    # The suite always runs the zero3 stock control; "zero3" among the scenarios adds zero3 fixed.
    scenarios = [
        s
        for s in SCENARIOS
        if any(r["scenario"] == s and (s != "zero3" or r["patch"] != "stock") for r in records)
    ] or ["zero3"]
    patches = [p for p in PATCHES if any(r["patch"] == p for r in records)]
    first = records[0]
    options = {
        "--env": env_id,
        "--scenarios": ",".join(scenarios),
        "--patches": ",".join(patches),
        "--dtype": str(first["dtype"]),
        "--world-size": str(max(int(r["world_size"]) for r in records)),
        "--steps": str(first["steps"]),
        "--seed": str(first["seed"]),
    }
    args = [word for option in options.items() for word in option]
    if transports != ["native"]:
        args += ["--transports", ",".join(transports)]
    if not sync_proof:
        args.append("--no-sync-proof")
    if any(r.get("config_adaptations") for r in records):
        # A user config was adapted per scenario; the control's adapted config is the closest single one.
        control = controls[0] if controls else first
        args += ["--config-json", json.dumps(control["config"], separators=(",", ":"))]
    return args


def suite_timeout(records: Sequence[Mapping[str, Any]]) -> float:
    per_run = max(float(r.get("timeout_s") or 600.0) for r in records)
    return per_run * (len(records) + 1) + 600.0


def _docker_line(
    platform: str, mounts: Sequence[str], image_ref: str, module: str, args: Sequence[str]
) -> str:
    """`docker run` of `module` in the image, network off; the "$PWD/..." words stay for the shell."""
    argv = ["docker", "run", "--rm", "--network", "none", *cluster.docker_cli_flags(platform)]
    argv += [word for mount in mounts for word in ("-v", mount)]
    argv += [image_ref, "python", "-m", module, *args, "--out", CONTAINER_OUT]
    return " ".join(a if a.startswith('"$PWD') else shlex.quote(a) for a in argv)


def job_block(env_id: str, custom: Sequence[RunRecord]) -> tuple[JobBlock, Path]:
    """The manifest's "job" entry (workdir still unset) and the host folder the command ran in."""
    jobs = [r.get("job") or {} for r in custom]
    commands = {str(j.get("command")) for j in jobs}
    workdirs = {str(j.get("workdir")) for j in jobs}
    if len(commands) != 1 or len(workdirs) != 1 or not next(iter(commands)).strip():
        raise BundleError(
            f"the custom runs of {env_id} are not the runs of one command in one folder",
            why=f"commands: {len(commands)}, working directories: {len(workdirs)}",
            fix="bundle a results folder of one `make run CMD=...` invocation",
        )
    if re.search(r"[\x00-\x1f\x7f]", next(iter(commands))):
        raise BundleError(
            f"the custom command of {env_id} spans lines or holds control characters",
            why="a bundle's manifest takes a one-line command (it is checked as untrusted input)",
            fix="put the steps in a script in the working directory and run that with CMD=",
        )
    patterns = jobs[0].get("patterns")
    loss = (patterns.get("loss") if patterns else None) or {}
    transport = str(custom[0].get("transport"))
    block: JobBlock = {
        "command": next(iter(commands)),
        "workdir": None,
        "patches": [p for p in PATCHES if any(r.get("patch") == p for r in custom)],
        "transport": transport if transport in CPU_TRANSPORTS else "async",  # GPU: "native", unused
        "loss_regex": loss.get("regex") if loss.get("name") == "custom" else None,
        "timeout_s": float(custom[0].get("timeout_s") or 1800.0),
        "stall_s": DEFAULT_STALL_S,
    }
    return block, Path(next(iter(workdirs)))


def docker_job_command(platform: str, image_ref: str, job: Mapping[str, Any], patch: str) -> str:
    """One patch's run of the custom command, by hand: the bundle's workdir/ mounted at its own path."""
    mounts = [f'"$PWD/{WORKDIR_DIR}:$PWD/{WORKDIR_DIR}"', f'"$PWD/out:{CONTAINER_OUT}"']
    args = ["--cmd", str(job["command"]), "--workdir", f'"$PWD/{WORKDIR_DIR}"', "--patch", patch]
    args += ["--device", "cpu" if platform == "cpu" else "gpu", "--transport", str(job["transport"])]
    args += ["--timeout", f"{job['timeout_s']:g}", "--stall-timeout", f"{job['stall_s']:g}"]
    return _docker_line(platform, mounts, image_ref, _JOB_MODULE, args)


PLATFORM_NOTES = {
    "cpu": "Runs on any x86-64 machine with Docker; no GPU needed.",
    "rocm": "Needs an AMD GPU host with the ROCm kernel driver; the flags pass /dev/kfd and /dev/dri in.",
    "cuda": "Needs an NVIDIA GPU host with the NVIDIA container toolkit (`--gpus all`).",
}


# -- sources for the root-cause links ---------------------------------------------------------------
def release_sources(version: str, client: Any, image_id: str, python: str) -> dict[str, str]:
    """The two files of the release: from its sdist in the wheelhouse, else read out of the image."""
    try:
        return patchgen.read_members(
            # offline: a bundle reads what is here; the image holds the same files
            patchgen.sdist_path(version, patchgen.default_wheelhouse(), offline=True),
            version,
            source_refs.PATHS,
        )
    except (ReproError, KeyError, OSError):
        return bundle_image.read_files(
            client,
            image_id,
            [f"/opt/venv/lib/python{python}/site-packages/{p}" for p in source_refs.PATHS],
            source_refs.PATHS,
        )


@dataclass(frozen=True)
class _Patch:
    """The patch the bundle ships: its file name and text, or no name and a note why there is none."""

    name: str
    text: str
    note: str


def patch_text(version: str) -> _Patch:
    """The shipped patch, else one generated from the sdist, else a note why not."""
    shipped = patchgen.patch_file(version)
    if shipped.is_file():
        return _Patch(shipped.name, shipped.read_text(), "")
    try:
        text, _ = patchgen.generate(version, patchgen.default_wheelhouse(), offline=True)
        return _Patch(shipped.name, text, "")
    except ReproError as exc:
        return _Patch("", "", exc.what)


def make_bundle(
    request: BundleRequest, client: Any, scrubber: Scrubber, say: Callable[[str], None] = console.result
) -> BundleResult:
    """The bundle folder (and archive) of `request`. Refused by the leak check (a secret or a host
    value left in a file): nothing of it stays on disk, so no half-scrubbed folder is shipped."""
    out = paths.check_output_folder(request.out)
    existed = out.exists()
    try:
        return _make_bundle(request, client, scrubber, say)
    except LeakError:
        _remove_written(out, existed)
        say(f"bundle: refused by the leak check; removed what it wrote in {out}")
        raise


def _remove_written(out: Path, existed: bool) -> None:
    """What make_bundle wrote: the folder it made, or the contents of the empty one it was given.
    Links inside are removed, never followed (shutil.rmtree)."""
    if not out.is_dir() or out.is_symlink():
        return
    if not existed:
        shutil.rmtree(out)
        return
    for child in out.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _make_bundle(
    request: BundleRequest, client: Any, scrubber: Scrubber, say: Callable[[str], None]
) -> BundleResult:
    """The bundle's jobs in order: check the runs, scrub them, write every file, seal, archive."""
    out = paths.check_output_folder(request.out)
    _refuse_filled(out)
    if request.archive:
        check_archive_free(out)  # before the image is flattened and saved: that takes minutes
    data = load_results(request.results)
    env, records = _docker_records(request, data)
    custom_records = [r for r in records if r.get("scenario") == CUSTOM_SCENARIO]
    job, job_dir = job_block(request.env_id, custom_records) if custom_records else (None, None)
    pins = dict(env.get("pins") or {})
    version = str(pins.get("deepspeed") or records[0]["versions"]["deepspeed"])
    python = str(pins.get("python") or "3")
    out.mkdir(parents=True, exist_ok=True)
    say(f"bundle: {request.env_id} from {request.results} -> {out}")
    scrubber = _bundle_scrubber(scrubber, out, request.results, job_dir, data)

    # From here on only scrubbed values: whatever is rendered from them (commands, the comment,
    # the README) is clean before it is quoted, shell-quoted or escaped, where a scrub of the
    # finished text could no longer see a value whole. Where the command ran (job_dir) stays raw.
    raw_env = env  # image id and artifact paths: what this host must find, as recorded
    env, records = scrubber.data(env), scrubber.data(records)
    suite_records = [r for r in records if r.get("scenario") != CUSTOM_SCENARIO]
    custom_records = [r for r in records if r.get("scenario") == CUSTOM_SCENARIO]
    job = scrubber.data(job)
    invocation_command = scrubber.text(str(data["invocation"].get("command") or ""))

    writer = _BundleWriter(request, out, scrubber, say)
    writer.copy_runs(data)
    patch = writer.write_patch(version)
    job_notes = (
        writer.copy_job_workdir(job, job_dir, custom_records)
        if job is not None and job_dir is not None
        else ()
    )
    image = _write_image(request, client, str(raw_env["image_id"]), say)
    platform = str(raw_env.get("platform") or "cpu")  # decides device flags: as recorded
    writer.write_cluster(platform, image["ref"])
    suite_args, commands = _commands(
        request.env_id, out, platform, image["ref"], suite_records, job, invocation_command
    )
    expected = tuple(Expected.from_record(r) for r in records)
    refs = source_refs.find_refs(version, release_sources(version, client, str(raw_env["image_id"]), python))
    writer.write_comment(env, raw_env, records, refs, patch, image, commands)
    writer.write_readme(platform, pins, image, expected, records, commands, patch)
    manifest = Manifest(
        tool_version=__version__,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        env={
            "id": request.env_id,
            "platform": platform,
            "pins": pins,
            "derived_from": env.get("derived_from"),
        },
        image=image,
        suite_args=tuple(suite_args),
        commands=commands,
        expected=expected,
        notes=(f"suite time limit {suite_timeout(records):.0f} s",)
        + ((f"no patch: {patch.note}",) if patch.note else ())
        + job_notes,
        job=job,
    )
    return writer.finish(manifest)


def _refuse_filled(out: Path) -> None:
    """Bundles are never overwritten: OUT= must be new or empty."""
    if out.exists() and any(out.iterdir()):
        raise BundleError(
            f"{out} already exists and is not empty",
            why="bundles are never overwritten",
            fix="remove it, or pass another OUT=",
        )


def _docker_records(request: BundleRequest, data: ResultsData) -> tuple[EnvInfo, list[RunRecord]]:
    """The env and its runs from the results: refused unless they ran in a Docker image, on its platform."""
    envs = data.get("envs") or {}
    if request.env_id not in envs:
        raise BundleError(
            f"the results hold no env {request.env_id!r}",
            why=f"envs there: {', '.join(envs) or 'none'}",
            fix="pass RESULTS= of a run of that env, or leave RESULTS unset to run it first",
        )
    env = envs[request.env_id].copy()
    records = [r for r in data.get("runs") or [] if r.get("env") == request.env_id]
    if not records:
        raise BundleError(
            f"the results hold no run of env {request.env_id!r}", fix="run `make repro ENV=...` first"
        )
    if env.get("engine") != "docker" or not env.get("image_id"):
        raise BundleError(
            f"the runs of {request.env_id} in {request.results} did not run in a Docker image",
            why=f"engine: {env.get('engine')}",
            fix="rerun with ENGINE=docker, or leave RESULTS unset",
        )
    refuse_other_platform(request.env_id, str(env.get("platform") or "") or None, records)
    return env, records


def _bundle_scrubber(
    scrubber: Scrubber, out: Path, results: Path, job_dir: Path | None, data: ResultsData
) -> Scrubber:
    """`scrubber` that also replaces this host's paths of the bundle and the secrets of its command lines."""
    # Where the bundle and its results live on this host says something about the host too.
    # So do the paths the user passed on the command line (--results-root, --config, --out).
    argv_paths = [a for a in data["invocation"].get("argv") or [] if isinstance(a, str) and a.startswith("/")]
    # Each secret value of the recorded command lines (`--password 'a b'`, `-u user:pass`) is
    # replaced in every file, wherever it appears and however it is quoted there.
    return scrubber.with_paths(
        {
            "<bundle>": out.resolve(),
            "<results>": Path(results).resolve(),
            **({"<workdir>": job_dir} if job_dir is not None else {}),
            **{f"<path{i}>": p for i, p in enumerate(argv_paths, 1)},
        }
    ).with_command_secrets(data)


def _commands(
    env_id: str,
    out: Path,
    platform: str,
    image_ref: str,
    suite_records: Sequence[RunRecord],
    job: Mapping[str, Any] | None,
    invocation_command: str,
) -> tuple[list[str], dict[str, str]]:
    """The suite's arguments and the manifest's commands (load, run, verify, reproduce, each job patch)."""
    # The env's platform decides the device in the bundle's run too: no silent CPU fallback.
    suite_args = (
        [*suite_args_from_records(env_id, suite_records), "--device", platform] if suite_records else []
    )
    job_commands = (
        {f"run_job_{p}": docker_job_command(platform, image_ref, job, p) for p in job["patches"]}
        if job is not None
        else {}
    )
    run_command = (
        _docker_line(platform, [f'"$PWD/out:{CONTAINER_OUT}"'], image_ref, _SUITE_MODULE, suite_args)
        if suite_args
        else next(iter(job_commands.values()))
    )
    commands = {
        **job_commands,
        "load": f"docker load -i {IMAGE_FILE}",
        "run": run_command,
        # Run from a mics-repro checkout; BUNDLE= takes this folder or its .tar archive.
        # A GPU bundle's container gets device access: the verifier must consent (docs/security.md).
        "verify": make_line(
            "verify-bundle",
            reproduce_pairs(
                {"BUNDLE": f"path/to/{out.name}.tar", "ALLOW_PRIVILEGES": "1" if platform != "cpu" else None}
            ),
        ),
        "reproduce_from_source": invocation_command or make_line("repro", reproduce_pairs({"ENV": env_id})),
    }
    return suite_args, commands


@dataclass(frozen=True)
class _BundleWriter:
    """Writes a bundle's files into `out`, each text through `scrubber`'s hand-out gate."""

    request: BundleRequest
    out: Path
    scrubber: Scrubber
    say: Callable[[str], None]

    def put(self, name: str, text: str) -> None:
        """One text file of the bundle, refused (LeakError) when a secret or host value survives."""
        (self.out / name).write_text(hand_out(text, self.scrubber, name))

    def copy_runs(self, data: ResultsData) -> None:
        """The env's records and logs (scrubbed) into results/, and the report built from them."""
        request, out = self.request, self.out
        for skipped in copy_results(request.results, request.env_id, out / "results", self.scrubber, data):
            self.say(f"bundle: not copied: {skipped} (it leads outside the results folder)")
        from repro.report import build_report

        # The report names the folder it was built from: the bundle's scrubber replaces it too.
        build_report([out / "results"], out / "report", scrubber=self.scrubber)

    def write_patch(self, version: str) -> _Patch:
        """The release's patch file, when there is one (else the note why not)."""
        patch = patch_text(version)
        if patch.name:
            self.put(patch.name, patch.text)
        return patch

    def copy_job_workdir(
        self, job: JobBlock, job_dir: Path, custom_records: Sequence[RunRecord]
    ) -> tuple[str, ...]:
        """The custom command's folder into workdir/ (job's "workdir" set), else the notes on why not."""
        left_out = copy_workdir(job_dir, self.out / WORKDIR_DIR, self.scrubber)
        if left_out is None:
            job["workdir"] = WORKDIR_DIR
            return ()
        self.say(f"bundle: {left_out}")
        digest = str((custom_records[0].get("job") or {}).get("workdir_digest"))
        return (
            f"{left_out}; the maintainer must supply it: verify-bundle --workdir <folder> "
            f"(the runs had workdir digest {digest})",
        )

    def write_cluster(self, platform: str, image_ref: str) -> None:
        """cluster/: the Slurm + Apptainer and torchrun launchers of the env's layout."""
        layout = replace(cluster.REPORTER if platform != "cpu" else cluster.CPU_TWIN, platform=platform)
        scripts = cluster.render(
            layout, env_id=self.request.env_id, image_ref=image_ref, image_file=IMAGE_FILE
        )
        cluster.write(
            [replace(s, text=hand_out(s.text, self.scrubber, f"cluster/{s.path}")) for s in scripts],
            self.out / "cluster",
        )

    def write_comment(
        self,
        env: Mapping[str, Any],
        raw_env: Mapping[str, Any],
        records: Sequence[RunRecord],
        refs: source_refs.Refs,
        patch: _Patch,
        image: Mapping[str, Any],
        commands: Mapping[str, str],
    ) -> None:
        """ISSUE_COMMENT.md, ready to paste into the upstream issue."""
        results = self.request.results
        comment = issue_comment.render_fitting(
            issue_comment.IssueInput(
                env_id=self.request.env_id,
                env=self.scrubber.data({**env, "built_on": image.get("base")}),
                records=records,
                refs=refs,
                patch_name=patch.name,
                patch_text=patch.text,
                ds_report=self.scrubber.text(artifact(results, raw_env, "ds_report")),
                collect_env=self.scrubber.text(artifact(results, raw_env, "collect_env")),
                reproduce=[commands["load"], "mkdir -p out", commands["run"]],
                results_command=commands["reproduce_from_source"],
            )
        )
        self.put("ISSUE_COMMENT.md", comment)

    def write_readme(
        self,
        platform: str,
        pins: Mapping[str, Any],
        image: Mapping[str, Any],
        expected: Sequence[Expected],
        records: Sequence[RunRecord],
        commands: Mapping[str, str],
        patch: _Patch,
    ) -> None:
        """README.md: how to load and run the image, and what to expect."""
        heads = issue_comment.headlines([issue_comment.RunRow.from_record(r) for r in records])
        versions: dict[str, str | None] = next((r["versions"] for r in records if r.get("versions")), {})
        readme = (
            templating.environment(issue_comment.TEMPLATES, target=templating.Target.MARKDOWN)
            .get_template("README.md.j2")
            .render(
                env_id=self.request.env_id,
                platform=platform,
                pins=pins,
                image=image,
                run_command=commands["run"],
                platform_note=PLATFORM_NOTES.get(platform, ""),
                expected=expected,
                has_control=any(r.get("scenario") == "zero3" for r in records),
                commands=commands,
                answer=issue_comment.answer(heads, versions, records),
                issue_url=issue_comment.ISSUE_URL,
                patch_name=patch.name,
                patch_note=patch.note,
                tool_version=__version__,
                results_command=commands["reproduce_from_source"],
            )
        )
        self.put("README.md", readme)

    def finish(self, manifest: Manifest) -> BundleResult:
        """Seal the folder (leak scan, hashes, manifest.json), then archive it when asked."""
        manifest = _seal(self.out, manifest, self.scrubber)
        self.say(f"bundle: wrote {self.out} ({len(manifest.files) + 1} files)")
        tar = archive(self.out) if self.request.archive else None
        if tar is not None:
            self.say(f"bundle: wrote {tar} ({tar.stat().st_size / 1e9:.2f} GB)")
        return BundleResult(self.out, tar, manifest)


def _write_image(request: BundleRequest, client: Any, source: str, say: Callable[[str], None]) -> BundleImage:
    """Flatten, save and gzip the image into the bundle; the manifest's "image" entry."""
    safe_env = re.sub(r"[^a-z0-9_.-]+", "-", request.env_id.lower())
    ref = f"mics-repro-bundle:{safe_env}-{source.split(':')[-1][:12]}"
    flat = bundle_image.flatten(client, source, ref, say)
    workers = bundle_image.gzip_workers()
    say(f"bundle: saving {ref} (gzip level {request.gzip_level}, {workers} threads) ...")
    saved = bundle_image.save_gzip(client, ref, request.out / IMAGE_FILE, request.gzip_level, workers)
    say(
        f"bundle: {IMAGE_FILE}: {saved.bytes / 1e9:.2f} GB ({saved.uncompressed_bytes / 1e9:.2f} GB "
        f"uncompressed), flatten {flat.seconds:.0f} s, save+gzip {saved.seconds:.0f} s"
    )
    if not request.keep_image:
        client.images.remove(ref)  # the tarball holds it; a second 5 GB copy helps nobody
    return {
        "file": IMAGE_FILE,
        "ref": ref,
        "id": flat.image_id,
        "source_id": flat.source_id,
        "flattened": True,
        "removed": list(flat.removed),
        "bytes": saved.bytes,
        "uncompressed_bytes": saved.uncompressed_bytes,
        "gzip_level": saved.gzip_level,
        "sha256": saved.sha256,
        "seconds": {"flatten": round(flat.seconds, 1), "save_gzip": round(saved.seconds, 1)},
        "base": flat.base,
    }


def _seal(out: Path, manifest: Manifest, scrubber: Scrubber) -> Manifest:
    """Scan for leaks, then write SHA256SUMS and manifest.json with the hash of every file."""
    scan(out, scrubber)
    known = {IMAGE_FILE: str(manifest.image["sha256"])}
    write_sums(out, file_hashes(out, known=known))
    sealed = replace(manifest, files=file_hashes(out, known=known))
    (out / MANIFEST).write_text(hand_out(sealed.to_json(), scrubber, MANIFEST))
    scan(out, scrubber)
    return sealed


def summary(result: BundleResult) -> str:
    m = result.manifest
    lines = [
        f"bundle {result.folder}" + (f" (+ {result.archive.name})" if result.archive else ""),
        f"  image {m.image['ref']} {m.image['id'][:19]}: {m.image['bytes'] / 1e9:.2f} GB gzipped",
        f"  expected outcomes ({len(m.expected)} runs):",
    ]
    lines += [f"    {e.run_name:<34} {e.outcome:<12} {e.signature}" for e in m.expected]
    lines.append(f"  verify: {m.commands['verify']}")
    return "\n".join(lines)
