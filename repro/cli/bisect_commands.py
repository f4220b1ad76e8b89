"""`bisect`, `survey` and `probe`: find where a release changes MiCS's behaviour.

bisect   the adjacent pair of releases where the verdict flips (GOOD/BAD or FROM/TO, BAD_IF=...)
survey   every change of outcome or signature across a range, with as few probes as it can
probe    one candidate, with `git bisect run` exit codes (0 good, 1 bad, 125 skip, 128 the probe
         itself failed); with --deepspeed-src it builds a DeepSpeed checkout into the probe env

Thin handlers: options are parsed here into typed requests; bisect and survey share one driver
(repro/bisect/driver.py), the decisions live in repro/bisect/search.py (pure) and
repro/bisect/probe.py (outcome -> verdict). OUT/bisect.json or OUT/survey.json go next to
results.json, so `make report RESULTS=OUT` shows the probes' runs and the timeline.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

from repro.bisect.driver import (
    AXES,
    Folder,
    Services,
    WalkRequest,
    engine_for,
    load_matrix,
    run_bisect,
    run_survey,
)
from repro.bisect.probe import BadIf, Evaluate, Judge, Observation, OrchestratedProbe, ProbeSpec
from repro.bisect.rounds import RUNNERS, SlurmOptions
from repro.bisect.search import ProbeVerdict
from repro.bisect.worktree_layer import ImportChecked, WorktreeLayer
from repro.cli.options import DEFAULT_RESULTS_ROOT, add_matrix_option
from repro.cli.registry import command
from repro.core.errors import UsageError
from repro.core.jobname import walk_subject
from repro.engines import jobdeps
from repro.workload.record import CPU_TRANSPORTS, PATCHES, SCENARIOS, write_json_atomic

__all__ = ["EXIT_ABORT", "Services", "probe_main", "run_bisect", "run_survey", "walk_request"]

# `git bisect run`: 0 good, 1 bad, 125 skip; anything above 127 stops the bisection, which is
# what a broken probe (bad options, no engine) must do instead of marking commits bad.
EXIT_FOR = {ProbeVerdict.GOOD: 0, ProbeVerdict.BAD: 1, ProbeVerdict.UNKNOWN: 125}
EXIT_ABORT = 128


# -- options -------------------------------------------------------------------------------------
def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, help="base env id (default: the matrix default, cpu)")
    p.add_argument("--scenario", default="mics", choices=SCENARIOS, help="scenario to probe (default mics)")
    p.add_argument("--patch", default="stock", choices=PATCHES, help="stock or fixed (default stock)")
    p.add_argument("--engine", default=None, help="docker|venv|auto (default: $ENGINE or auto)")
    p.add_argument("--dtype", default=None, help="fp32|bf16|fp16 (default fp32)")
    p.add_argument(
        "--transport",
        default="async",
        choices=CPU_TRANSPORTS,
        help="CPU transport: the adapter's async,sync,strict, or plain (gloo as torch ships it)",
    )
    p.add_argument("--timeout", type=float, default=None, help="per-run time limit in seconds")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--out", default=None, help="results folder (default: a new one under results/)")
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))
    add_matrix_option(p)
    p.add_argument("--cmd", default=None, help="probe YOUR command (docs/own-job.md), not --scenario")
    p.add_argument("--workdir", default=None, help="folder --cmd runs in (default .)")
    p.add_argument("--loss-regex", default=None, help="loss pattern of --cmd's output (group `loss`)")
    p.add_argument("--requirements", default=None, help="--cmd's own packages (a requirements file)")
    p.add_argument("--packages", default=None, help='--cmd\'s own packages as a list, e.g. "a==1 b"')


def _range_options(p: argparse.ArgumentParser, *, bisecting: bool) -> None:
    _common(p)
    p.add_argument("--axis", required=True, choices=AXES, help="the package whose releases are walked")
    p.add_argument("--torch", default=None, help="pin torch while walking the deepspeed axis")
    p.add_argument("--deepspeed", default=None, help="pin DeepSpeed while walking the torch axis")
    p.add_argument("--from", dest="start", default=None, help="first release of the range")
    p.add_argument("--to", dest="end", default=None, help="last release (default: the newest on the index)")
    if bisecting:
        p.add_argument("--good", default=None, help="a release expected good (same as --from)")
        p.add_argument("--bad", default=None, help="a release expected bad (same as --to)")
        p.add_argument(
            "--bad-if",
            default="reproduced",
            choices=[b.value for b in BadIf],
            help="what counts as bad (see repro/bisect/probe.py for the outcome -> verdict table)",
        )
    else:
        p.add_argument("--every", action="store_true", help="probe every release, not only where ends differ")
    p.add_argument("--versions", default=None, help="comma-separated candidates instead of the index's list")
    p.add_argument("--prereleases", action="store_true", help="include pre-releases from the index")
    p.add_argument("--refresh-versions", action="store_true", help="ignore the cached release list")
    p.add_argument("--dry-run", action="store_true", help="print the candidates and exit")
    p.add_argument(
        "--ds-repo", default=None, help="DeepSpeed checkout or git URL (AXIS=deepspeed-commit, COMMITS)"
    )
    p.add_argument(
        "--commits", action="store_true", help="go on into the commits between the boundary releases"
    )
    p.add_argument(
        "--parallel",
        type=_parallel,
        default=1,
        help="candidates probed side by side per round, or auto (GPUs / ranks; cores / ranks on CPU)",
    )
    p.add_argument("--runner", default="local", choices=RUNNERS, help="where parallel probes run")
    p.add_argument("--devices", default=None, help="GPU ids split between the parallel probes (0,1,2,3)")
    p.add_argument("--slurm-partition", default=None)
    p.add_argument("--slurm-time", default="1:00:00", help="time limit of each array task")
    p.add_argument("--slurm-gpus-per-task", type=int, default=None)
    p.add_argument("--image", default=None, help="Apptainer image each Slurm probe runs in")


def _probe_options(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--torch", default=None, help="torch release for the probe env (derived env)")
    p.add_argument("--deepspeed", default=None, help="DeepSpeed release for the probe env (derived env)")
    p.add_argument(
        "--deepspeed-src",
        default=None,
        help="a DeepSpeed checkout to build into the probe env instead of a release (venv engine)",
    )
    p.add_argument("--bad-if", default="reproduced", choices=[b.value for b in BadIf])
    p.add_argument(
        "--reference", default=None, help="OUTCOME/SIGNATURE of the good state, needed by --bad-if differs"
    )
    p.add_argument(
        "--deepspeed-commit", default=None, help="a commit (ref) of --ds-repo to build into the env"
    )
    p.add_argument("--ds-repo", default=None, help="DeepSpeed checkout or git URL for --deepspeed-commit")
    p.add_argument("--slot", type=int, default=0, help="work tree of the cached clone (parallel probes)")
    p.add_argument("--label", default=None, help="name of the probe in its record (parallel bisects)")


def _parallel(text: str) -> int:
    """PARALLEL=k, or `auto` (0): the driver works out how many probes fit on this host."""
    if text.strip().lower() == "auto":
        return 0
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number nor auto") from None


# -- typed requests ------------------------------------------------------------------------------
def probe_options(args: argparse.Namespace) -> ProbeSpec:
    if (args.requirements or args.packages) and not args.cmd:
        raise UsageError(
            "REQUIREMENTS=/PACKAGES= are the packages of your own command",
            fix='give CMD="..." too, or drop them (our scenarios need nothing beyond the env)',
        )
    # Read once here, so a bad file stops the command instead of making every probe unknown.
    jobdeps.parse(args.requirements, args.packages)
    return ProbeSpec(
        env_id=args.env or "",
        scenario=args.scenario,
        patch=args.patch,
        engine=args.engine,
        dtype=args.dtype,
        transport=args.transport,
        timeout_s=args.timeout,
        steps=args.steps,
        world_size=args.world_size,
        command=args.cmd,
        workdir=str(Path(args.workdir).resolve()) if args.workdir else None,
        loss_regex=args.loss_regex,
        # absolute, but not resolved: REQUIREMENTS= that is a link is judged as a link (jobdeps)
        requirements=os.path.abspath(os.path.expanduser(args.requirements)) if args.requirements else None,
        packages=args.packages,
    )


def _folder(args: argparse.Namespace) -> Folder:
    return Folder(Path(args.results_root), Path(args.out) if args.out else None, tuple(args.argv))


def walk_request(args: argparse.Namespace) -> WalkRequest:
    """The options of `bisect`/`survey` as the driver's typed request."""
    return WalkRequest(
        axis=args.axis,
        probe=probe_options(args),
        folder=_folder(args),
        torch=args.torch,
        deepspeed=args.deepspeed,
        start=args.start,
        end=args.end,
        good=getattr(args, "good", None),
        bad=getattr(args, "bad", None),
        bad_if=getattr(args, "bad_if", BadIf.REPRODUCED.value),
        every=bool(getattr(args, "every", False)),
        versions=args.versions,
        prereleases=args.prereleases,
        refresh_versions=args.refresh_versions,
        dry_run=args.dry_run,
        matrix=args.matrix,
        ds_repo=args.ds_repo,
        commits=bool(getattr(args, "commits", False)),
        parallel=args.parallel,
        runner=args.runner,
        devices=tuple(d.strip() for d in (args.devices or "").split(",") if d.strip()),
        # Checked here, before anything is built: each value becomes an #SBATCH line.
        slurm=SlurmOptions(
            partition=args.slurm_partition or None,
            time_limit=args.slurm_time,
            gpus_per_task=args.slurm_gpus_per_task,
            image=args.image,
        ).check(),
    )


# -- bisect and survey ---------------------------------------------------------------------------
@command(
    "bisect",
    "find the adjacent releases where MiCS turns bad (AXIS, GOOD/BAD or FROM/TO, BAD_IF)",
    partial(_range_options, bisecting=True),
)
def cmd_bisect(args: argparse.Namespace) -> int:
    return run_bisect(walk_request(args), Services())


@command(
    "survey",
    "every change of outcome/signature across a range of releases (AXIS, FROM, TO, EVERY)",
    partial(_range_options, bisecting=False),
)
def cmd_survey(args: argparse.Namespace) -> int:
    return run_survey(walk_request(args), Services())


# -- probe ---------------------------------------------------------------------------------------
@command(
    "probe",
    "probe one candidate; exit 0 good, 1 bad, 125 unknown, 128 the probe failed (for `git bisect run`)",
    _probe_options,
    error_exit=EXIT_ABORT,
)
def cmd_probe(args: argparse.Namespace) -> int:
    return run_probe(args, Services())


def probe_main(argv: Sequence[str], evaluate: Evaluate) -> int:
    """`python -m repro probe` with the evaluation step replaced (tests drive `git bisect run`):
    the same front door, so option errors and failures exit EXIT_ABORT there too."""
    from repro.cli.main import main

    return main(["probe", *argv], handler=lambda args: run_probe(args, Services(), evaluate=evaluate))


def _reference(args: argparse.Namespace) -> tuple[str, str] | None:
    if args.bad_if != BadIf.DIFFERS.value:
        return None
    if not args.reference or "/" not in args.reference:
        raise UsageError(
            "--bad-if differs needs --reference OUTCOME/SIGNATURE",
            fix="use the good state's outcome and signature, e.g. clean/none",
        )
    outcome, signature = args.reference.split("/", 1)
    return outcome, signature


def _probe_label(torch: str | None, deepspeed: str | None, src: str | None) -> str:
    """What the probe line names: the release given, or both when torch and DeepSpeed are."""
    if torch and (deepspeed or src):
        return f"torch{torch}+" + (f"ds{deepspeed}" if deepspeed else f"src:{src}")
    return deepspeed or torch or (f"src:{src}" if src else "")


def run_probe(args: argparse.Namespace, services: Services, evaluate: Evaluate | None = None) -> int:
    """One probe. Errors are not caught here: the front door turns them into EXIT_ABORT (the
    command is registered with error_exit) and Ctrl-C into 130, both of which stop git."""
    say = services.say
    if sum(1 for given in (args.deepspeed_src, args.deepspeed, args.deepspeed_commit) if given) > 1:
        raise UsageError(
            "--deepspeed, --deepspeed-src and --deepspeed-commit each choose DeepSpeed",
            fix="give one of them",
        )
    judge = Judge(BadIf(args.bad_if), _reference(args))
    src, commit = _deepspeed_source(args, services)
    options = probe_options(args)
    spec = _probe_spec(args, options, src, commit)
    folder: Path | None = None
    if evaluate is None:
        spec, evaluate, folder = _orchestrated(args, services, spec, src, commit)
    elif args.out:  # a stand-in evaluation (tests) still leaves the probe.json a parallel bisect reads
        folder, _ = _folder(args).open(f"probe-{spec.env_id}", "probe.json")
    obs = evaluate(spec)
    verdict = judge(obs)
    what = options.subject()
    say(
        f"probe: {obs.label}{' ' + walk_subject(what) if options.command else ''} {obs.outcome} "
        f"({obs.signature}) -> {verdict.value} "
        f"[BAD_IF={args.bad_if}] in {obs.seconds:.0f} s: {obs.reason}"
    )
    if folder is not None:
        _write_probe(folder, what, args.bad_if, verdict, obs)
    return EXIT_FOR[verdict]


def _deepspeed_source(args: argparse.Namespace, services: Services) -> tuple[str | None, str | None]:
    """The DeepSpeed checkout to build into the env and the commit it holds, if any: --deepspeed-src,
    or --deepspeed-commit checked out of the cached clone of --ds-repo."""
    src = str(Path(args.deepspeed_src).resolve()) if args.deepspeed_src else None
    commit: str | None = None
    if args.deepspeed_commit:
        if not args.ds_repo:
            raise UsageError("--deepspeed-commit needs --ds-repo", fix="give a DeepSpeed checkout or git URL")
        repo = services.repo(args.ds_repo)
        repo.sync(fetch=False)  # parallel probes share the clone the bisect already fetched
        commit = repo.resolve(args.deepspeed_commit)
        src = str(repo.checkout(commit, args.slot))
    return src, commit


def _probe_spec(
    args: argparse.Namespace, options: ProbeSpec, src: str | None, commit: str | None
) -> ProbeSpec:
    """The candidate as the evaluation sees it; env and label may still be filled in from the matrix."""
    return replace(
        options,
        torch=args.torch,
        deepspeed=args.deepspeed,
        deepspeed_src=src,
        deepspeed_commit=commit,
        deepspeed_repo=args.ds_repo,
        label=args.label or (commit[:12] if commit else _probe_label(args.torch, args.deepspeed, src)),
    )


def _orchestrated(
    args: argparse.Namespace, services: Services, spec: ProbeSpec, src: str | None, commit: str | None
) -> tuple[ProbeSpec, Evaluate, Path]:
    """The real evaluation: the matrix's defaults filled into `spec`, the engine, and the results
    folder it records into (results/latest pointed at it when new)."""
    matrix = load_matrix(args.matrix, services)
    spec = replace(
        spec,
        env_id=spec.env_id or matrix.default_id,
        label=spec.label or spec.env_id or matrix.default_id,
    )
    if commit:  # a commit of the cached clone: layered from its work tree, no wheel built
        engine = (services.overlay or WorktreeLayer)(engine_for(args.engine, services), Path(src or "."))
    else:
        engine = engine_for(args.engine, services, src)
    # `make repro` cannot build a checkout: a source probe is reproduced by its own command.
    again = spec.repro_command() if not src or commit else shlex.join(["python", "-m", "repro", *args.argv])
    inv = _folder(args).start(f"probe-{spec.env_id}", "probe.json", again)
    evaluate: Evaluate = OrchestratedProbe(matrix, engine, inv, say=services.say)
    if isinstance(engine, WorktreeLayer):  # a crash of a commit that does not import: unknown
        evaluate = ImportChecked(evaluate, engine)
    return spec, evaluate, inv.folder


def _write_probe(
    folder: Path, what: Mapping[str, object], bad_if: str, verdict: ProbeVerdict, obs: Observation
) -> None:
    """OUT/probe.json: the probe's record, read by a parallel bisect and by `make report`."""
    write_json_atomic(
        str(folder / "probe.json"),
        {
            "kind": "probe",
            **what,
            "bad_if": bad_if,
            "exit_code": EXIT_FOR[verdict],
            "probes": [obs.as_dict(verdict)],
        },
    )
