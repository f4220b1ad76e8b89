"""The use cases behind `make repro`, `make check-fix` and `make matrix` (and the bundle's own
run): plan, preflight, run, summarize, and for check-fix the exit code of the one verdict.
Below the CLI, so other commands and tests call them without argparse (STYLE 13); the CLI
modules only parse options into a Request and a RunTarget and call these.

Call path of `make repro`: cli/run_commands.cmd_repro -> run_request (here) -> run/orchestrate
(execute) -> run/summary (render) -> core/verdict (the env verdict, decided and worded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from repro.core import console
from repro.core.errors import Interrupted, SuiteFailedError
from repro.core.results import InvocationDir, OpenedResults, discard_unused, open_results, resumable
from repro.core.verdict import FixCheck, check_fix
from repro.engines.base import Engine, as_built
from repro.engines.preflight import check_world_size
from repro.run.orchestrate import (
    Request,
    Step,
    describe,
    execute,
    plan,
    resume_step,
    suite_failures,
    unfinished_envs,
)
from repro.run.summary import render
from repro.workload.record import RunRecord

if TYPE_CHECKING:
    from repro.matrix.model import Matrix


@dataclass(frozen=True)
class RunTarget:
    """Where and how a run goes, besides what it runs (the Request)."""

    engine: str | None
    results_root: Path
    out: Path | None = None
    matrix: str | None = None
    dry_run: bool = False
    argv: tuple[str, ...] = ()  # recorded in results.json for `python -m repro` users
    make_command: str = ""  # the make line that reproduces this run
    # RESUME=1: finish the invocation in OUT= (default results/latest): rerun the runs it did not
    # finish, keep the finished runs' records and files, all in the same results.json.
    resume: bool = False


def load_matrix(path: str | None) -> Matrix:
    from repro.matrix.schema import load_matrix as load

    return load(path) if path else load()


def choose_engine(choice: str | None) -> Engine:
    from repro.engines.select import choose_engine as choose

    return choose(choice or None)  # None (or ""): the ENGINE variable, else auto


def run_request(
    request: Request,
    target: RunTarget,
    matrix: Matrix | None = None,
    engine_for: Callable[[str | None], Engine] = choose_engine,
) -> list[RunRecord]:
    """Plan, preflight, run and summarize one request; raises SuiteFailedError when a suite did
    not run its plan (its exit code, a timeout, a planned run without a record), so the verdict
    printed is incomplete. `engine_for(ENGINE choice)` gives the engine (the CLI passes its own,
    which tests replace)."""
    steps = plan(matrix or load_matrix(target.matrix), request)
    if target.dry_run:
        _print_dry_run(steps)
        return []
    engine = engine_for(target.engine)
    steps = _preflight(engine, steps, request.world_size)
    all_steps = steps
    resumed = resumable(target.results_root, target.out, target.resume)
    opened = open_results(
        target.results_root,
        target.out,
        [s.env.id for s in steps],
        list(target.argv),
        target.make_command,
        resumed,
    )
    folder, invocation = opened.folder, opened.invocation
    if resumed is not None:
        steps = _resumed_steps(invocation, folder, steps)
    console.info(describe(steps, engine.describe()))
    console.info(f"results: {folder}")
    runs = _execute(steps, engine, opened, target.results_root)
    _print_summary(runs, folder)
    _check_plan(invocation, all_steps, folder)
    return runs


def _print_dry_run(steps: list[Step]) -> None:
    """DRY_RUN=1: print the plan and what each env would be built and run with; no engine chosen."""
    from repro.engines.docker.buildplan import dry_run_text
    from repro.engines.venv.engine import dry_run_text as venv_dry_run_text

    console.result(describe(steps, "(dry run: no engine chosen)"))
    for step in steps:
        # README promises the build args and run flags too (ENGINE=docker's), and what a venv
        # here would hold instead: its Python is the host's, and its pins are chosen for it.
        console.result(dry_run_text(step.env))
        console.result(venv_dry_run_text(step.env))
        console.result(f"  {step.env.id}: python -m repro.workload.suite {' '.join(step.suite_args)}")


def _preflight(engine: Engine, steps: list[Step], world_size: int | None) -> list[Step]:
    """Refuse what this host cannot run before any folder exists; the steps' envs as `engine` builds them."""
    for step in steps:  # missing devices / daemon / Python / too many ranks: before any folder exists
        engine.preflight(step.env)
        check_world_size(step.env, world_size)
    # The venv engine's Python picks the pins (Env.for_python): the preamble and results.json say
    # what the venv holds, not what the image would.
    return [replace(step, env=as_built(engine, step.env)) for step in steps]


def _resumed_steps(invocation: InvocationDir, folder: Path, steps: list[Step]) -> list[Step]:
    """RESUME=1: forget the reopened folder's unfinished envs and keep only their steps, resumed."""
    todo = unfinished_envs(invocation, steps)
    for env_id in todo:  # the suite clears its unfinished runs there: never through a link
        invocation.check_env_paths(env_id, "runs")
    for env_id in todo:
        invocation.forget_env(env_id)
    # Only the unfinished envs are prepared again, and their suites rerun only the runs that
    # did not finish; the env's records come back whole (kept + new) from its suite.
    resumed = [resume_step(s) for s in steps if s.env.id in todo]
    kept = sorted({str(r.get("env")) for r in invocation.runs})
    console.info(
        f"resume: {folder}: finishing the unfinished runs of {', '.join(todo) or 'no env'}; "
        f"{', '.join(kept) or 'no env'} finished before"
    )
    return resumed


def _execute(steps: list[Step], engine: Engine, opened: OpenedResults, results_root: Path) -> list[RunRecord]:
    """Run the steps; Ctrl-C shows what was recorded, a failure that recorded nothing removes the folder."""
    invocation, folder = opened.invocation, opened.folder
    try:
        return execute(steps, engine, invocation)
    except Interrupted:
        console.result(render(invocation.runs, str(folder)))
        raise
    except BaseException:
        # Nothing ran (e.g. the build failed): no results folder, and latest stays where it was.
        if not invocation.data["envs"] and discard_unused(
            folder, opened.made, results_root, opened.previous_latest
        ):
            console.result(f"nothing was recorded; removed {folder}")
        raise


def _print_summary(runs: list[RunRecord], folder: Path) -> None:
    """Print the summary of the finished runs; Ctrl-C here is an Interrupted with nothing to redo."""
    try:
        console.result("")
        console.result(render(runs, str(folder)))
    except KeyboardInterrupt as stop:
        # Every run had finished and is saved (results.json says finished, not interrupted):
        # only the summary was cut short, so there is nothing to redo.
        raise Interrupted(
            "interrupted while printing the summary",
            why=str(stop) or "Ctrl-C",
            fix=f"nothing to redo: every run finished and is saved in {folder}; "
            f"`make report RESULTS={folder}` shows the verdict",
        ) from None


def _check_plan(invocation: InvocationDir, all_steps: list[Step], folder: Path) -> None:
    """SuiteFailedError when a suite did not run its whole plan (the verdict printed is incomplete)."""
    problems = suite_failures(invocation, all_steps)
    if problems:
        raise SuiteFailedError(
            f"the suite did not run its whole plan in {len(problems)} env(s)",
            why="; ".join(problems),
            fix=f"read the suite output in {folder}/<env>/ (the records that exist are kept)",
        )


def check_fix_outcome(runs: list[RunRecord]) -> FixCheck:
    """check-fix's answer from the runs it made: THE env verdict, the same one the summary and the
    report give; raises its error (and so its exit code) when the fix is not verified everywhere."""
    result = check_fix(runs)
    error = result.error()
    if error is not None:
        raise error
    console.result(f"check-fix: {result.verified} fixed MiCS run(s) ran clean and matched the ZeRO-3 control")
    return result
