"""`python -m repro probe` as a `git bisect run` script: exit codes, and a real `git bisect run`
over a small repository whose commits change behaviour (the evaluation step is injected, the
option parsing and exit-code mapping are the command's own). Also the DeepSpeed-checkout overlay
with its subprocesses faked."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from repro.bisect.probe import Observation, ProbeSpec
from repro.bisect.source_overlay import SourceOverlay
from repro.cli.bisect_commands import EXIT_ABORT, probe_main
from repro.core.cmd import CmdResult
from repro.core.errors import BuildError, UsageError
from repro.engines.base import EngineKind, Prepared
from repro.engines.venv.layer import base_pth_line
from tests.fixtures.stand_in_engine import StandInEngine

REPO_ROOT = Path(__file__).resolve().parents[2]


def fixed(outcome: str, signature: str = "none") -> Any:
    def evaluate(spec: ProbeSpec) -> Observation:
        return Observation(spec.label, outcome, signature, "scripted", 0.5)

    return evaluate


@pytest.mark.parametrize(
    "outcome,code",
    [
        ("clean", 0),
        ("reproduced", 1),
        ("crashed", 125),
        ("hung", 125),
        ("env-error", 125),
        ("unsupported", 125),
        ("interrupted", 125),
    ],
)
def test_exit_codes_follow_the_verdict_table(outcome: str, code: int) -> None:
    assert probe_main(["--env", "cpu", "--torch", "2.1.0"], fixed(outcome)) == code


def test_probe_label_names_both_pins_when_both_are_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert probe_main(["--env", "cpu", "--torch", "2.4.0", "--deepspeed", "0.13.1"], fixed("clean")) == 0
    assert "probe: torch2.4.0+ds0.13.1 clean" in capsys.readouterr().out
    assert probe_main(["--env", "cpu", "--deepspeed", "0.13.1"], fixed("clean")) == 0
    assert "probe: 0.13.1 clean" in capsys.readouterr().out


def test_bad_if_failed_makes_a_crash_bad() -> None:
    assert probe_main(["--env", "cpu", "--bad-if", "failed"], fixed("crashed", "crash")) == 1


def test_bad_if_differs_compares_with_the_reference() -> None:
    argv = ["--env", "cpu", "--bad-if", "differs", "--reference", "reproduced/illegal-work-crash"]
    assert probe_main(argv, fixed("reproduced", "illegal-work-crash")) == 0
    assert probe_main(argv, fixed("reproduced", "illegal-work-divergence")) == 1


def test_errors_abort_git_bisect_instead_of_marking_bad(capsys: pytest.CaptureFixture[str]) -> None:
    assert probe_main(["--env", "cpu", "--bad-if", "differs"], fixed("clean")) == EXIT_ABORT
    assert "--reference" in capsys.readouterr().err

    def broken(spec: ProbeSpec) -> Observation:
        raise UsageError("no engine")

    assert probe_main(["--env", "cpu"], broken) == EXIT_ABORT
    assert EXIT_ABORT > 127  # git bisect run stops on codes above 127


def test_ctrl_c_stops_git_bisect() -> None:
    def interrupted(spec: ProbeSpec) -> Observation:
        raise KeyboardInterrupt

    assert probe_main(["--env", "cpu"], interrupted) == 130


def test_source_and_release_are_exclusive() -> None:
    assert (
        probe_main(["--env", "cpu", "--deepspeed", "0.13.1", "--deepspeed-src", "."], fixed("clean"))
        == EXIT_ABORT
    )


# -- a real `git bisect run` -----------------------------------------------------------------------
PROBE_SCRIPT = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from repro.cli.bisect_commands import probe_main
    from repro.bisect.probe import Observation

    def evaluate(spec):
        # Stands in for "install the checkout and run MiCS": reads the checkout itself.
        text = (Path(spec.deepspeed_src) / "fakeds" / "comm.py").read_text()
        if "def all_gather(" not in text:
            outcome, signature = "env-error", "none"
        elif "return reqs[-1]" in text:
            outcome, signature = "reproduced", "illegal-work-divergence"
        else:
            outcome, signature = "clean", "none"
        with open(os.environ["PROBE_LOG"], "a") as fh:
            fh.write(outcome + "\\n")
        return Observation(spec.label, outcome, signature, "fake evaluation of the checkout", 0.0)

    sys.exit(probe_main(sys.argv[1:], evaluate))
""")

GOOD_CODE = "def all_gather(reqs, cm):\n    return cm  # version {n}\n"
BAD_CODE = "def all_gather(reqs, cm):\n    return reqs[-1]  # version {n}\n"
BROKEN_CODE = "all_gather = (  # version {n}: does not build\n"


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 1) or args[:2] == ("bisect", "run"), done.stderr
    return done.stdout + done.stderr


def make_history(repo: Path, first_bad: int, broken: Sequence[int], count: int) -> list[str]:
    (repo / "fakeds").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    shas = []
    for n in range(count):
        code = BROKEN_CODE if n in broken else BAD_CODE if n >= first_bad else GOOD_CODE
        (repo / "fakeds" / "comm.py").write_text(code.format(n=n))
        (repo / "setup.py").write_text("# fake package\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {n}")
        shas.append(git(repo, "rev-parse", "HEAD").strip())
    return shas


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_bisect_run_names_the_first_bad_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_subprocess: None
) -> None:
    repo = tmp_path / "fake-deepspeed"
    shas = make_history(repo, first_bad=11, broken=(6, 7, 8), count=16)
    script = tmp_path / "probe_script.py"
    script.write_text(PROBE_SCRIPT)
    log = tmp_path / "probe.log"
    monkeypatch.setenv("PROBE_LOG", str(log))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    )
    git(repo, "bisect", "start", shas[-1], shas[0])
    out = git(repo, "bisect", "run", sys.executable, str(script), "--env", "cpu", "--deepspeed-src", ".")
    found = re.search(r"^([0-9a-f]{40}) is the first bad commit", out, re.MULTILINE)
    assert found, out
    assert found.group(1) == shas[11]
    outcomes = log.read_text().split()
    assert "env-error" in outcomes  # a commit that does not build was skipped (exit 125) ...
    assert "skip" in git(repo, "bisect", "log")  # ... and git recorded it as such
    assert {"clean", "reproduced"} <= set(outcomes)


# -- the DeepSpeed checkout overlay (subprocesses faked) -------------------------------------------
class FakeVenvEngine(StandInEngine):
    name = "fake venv engine"

    def __init__(self, root: Path) -> None:
        self.root = root

    def prepare(self, env: Any) -> Prepared:
        base = self.root / "cpu-abc"
        (base / "bin").mkdir(parents=True, exist_ok=True)
        if not (base / "bin" / "python").is_symlink():  # a venv's python: a link to its interpreter
            (base / "bin" / "python").symlink_to(sys.executable)
        return Prepared(EngineKind.VENV, env.id, str(base), str(base), True)

    def run_suite(self, *args: Any) -> Any:
        raise AssertionError("not used here")


class FakeRunner:
    def __init__(self, root: Path, pip_ok: bool = True) -> None:
        self.root, self.pip_ok = root, pip_ok
        self.calls: list[tuple[list[str], dict[str, str]]] = []
        self.staged: list[str] = []

    def __call__(self, argv: Sequence[str], **kw: Any) -> CmdResult:
        argv = [str(a) for a in argv]
        self.calls.append((argv, dict(kw.get("extra_env") or {})))
        out, code = "", 0
        if argv[1:3] == ["-m", "venv"]:
            Path(argv[3], "bin").mkdir(parents=True)
            Path(argv[3], "bin", "python").symlink_to(sys.executable)
        elif argv[:2] == ["git", "-C"]:
            out = "abc1234\n"
        elif "sysconfig" in argv[-1]:
            site = Path(argv[0]).parent.parent / "site"
            site.mkdir(exist_ok=True)
            out = f"{site}\n"
        elif argv[1:4] == ["-m", "pip", "install"]:
            staged = Path(argv[-1])
            self.staged = sorted(p.name for p in staged.iterdir())
            code = 0 if self.pip_ok else 1
        elif "importlib.metadata" in argv[-1]:
            # DeepSpeed logs its accelerator while it imports, before the version is printed
            out = "[INFO] [real_accelerator.py:191] Setting ds_accelerator to cuda\n0.14.1+abc1234\n"
        return CmdResult(tuple(argv), code, out, "" if code == 0 else "error: build failed")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    src = tmp_path / "DeepSpeed"
    (src / "deepspeed").mkdir(parents=True)
    (src / "setup.py").write_text("# fake\n")
    (src / "build").mkdir()  # a stale in-tree build that must not reach the wheel
    (src / ".git").mkdir()
    return src


def test_overlay_layers_the_checkout_over_the_cached_venv(tmp_path: Path, checkout: Path) -> None:
    runner = FakeRunner(tmp_path)
    engine = SourceOverlay(FakeVenvEngine(tmp_path / "venvs"), checkout, runner=runner)
    prepared = engine.prepare(type("Env", (), {"id": "cpu"})())
    overlay = Path(prepared.handle)
    assert overlay.name.startswith("cpu-abc+dssrc-") and prepared.reused
    pip = next((argv, env) for argv, env in runner.calls if argv[1:4] == ["-m", "pip", "install"])
    assert pip[0][0] == str(overlay / "bin" / "python")
    assert {"--no-build-isolation", "--no-deps"} <= set(pip[0])
    # GPUs hidden from DeepSpeed's setup.py (it runs nvcc / reads ROCM_HOME when torch sees one)
    assert pip[1] == {
        "DS_BUILD_OPS": "0",
        "DS_BUILD_STRING": "+abc1234",
        "CUDA_VISIBLE_DEVICES": "",
        "HIP_VISIBLE_DEVICES": "",
        "ROCR_VISIBLE_DEVICES": "",
    }
    assert runner.staged == ["deepspeed", "setup.py"]  # no .git, no stale build/
    pth = overlay / "site" / "_mics_repro_base.pth"
    assert pth.read_text() == base_pth_line(str(tmp_path / "venvs" / "cpu-abc" / "site"))
    assert prepared.details["deepspeed"] == "0.14.1+abc1234" and prepared.details["commit"] == "abc1234"


def test_overlay_builds_the_same_files_once(tmp_path: Path, checkout: Path) -> None:
    """pr-verify runs a side's tree twice over one layer (plain gloo, the adapter): the second
    prepare imports what the first installed; a changed file or a failed install builds again."""
    env = type("Env", (), {"id": "cpu"})()

    def installs(runner: FakeRunner) -> int:
        return sum(argv[1:4] == ["-m", "pip", "install"] for argv, _ in runner.calls)

    runner = FakeRunner(tmp_path)
    engine = SourceOverlay(FakeVenvEngine(tmp_path / "venvs"), checkout, runner=runner)
    first = engine.prepare(env)
    again = engine.prepare(env)
    assert installs(runner) == 1 and again.details == first.details
    # what a pytest session leaves in the tree it ran in (pytest-randomly writes its seed there)
    (checkout / "tests" / ".pytest_cache" / "v").mkdir(parents=True)
    (checkout / "tests" / ".pytest_cache" / "v" / "randomly_seed").write_text("1234")
    engine.prepare(env)
    assert installs(runner) == 1
    (checkout / "deepspeed" / "__init__.py").write_text("changed = True\n")
    engine.prepare(env)
    assert installs(runner) == 2
    (checkout / "deepspeed" / "__init__.py").write_text("changed = 2\n")
    engine.runner = failing = FakeRunner(tmp_path, pip_ok=False)
    with pytest.raises(BuildError):
        engine.prepare(env)
    engine.runner = runner
    engine.prepare(env)  # the failed install left no claim that these files were installed
    assert installs(failing) == 1 and installs(runner) == 3


def test_a_layer_whose_checkout_is_gone_is_removed(tmp_path: Path, checkout: Path) -> None:
    """Layers are named by their checkout's path: pr-verify's exported trees and a test's tmp go,
    and their layers (38 MB each, with the job layers over them) would pile up in the cache."""
    import shutil

    env, venvs = type("Env", (), {"id": "cpu"})(), tmp_path / "venvs"

    def layer(src: Path) -> Path:
        return Path(
            SourceOverlay(FakeVenvEngine(venvs), src, runner=FakeRunner(tmp_path)).prepare(env).handle
        )

    gone = layer(checkout)
    (job := gone.with_name(gone.name + "+job-0123")).mkdir()
    (unknown := venvs / "cpu-abc+dssrc-0000000000").mkdir()  # no record of its checkout: kept
    other = shutil.copytree(checkout, tmp_path / "Other")
    shutil.rmtree(checkout)
    kept = layer(other)
    assert not gone.exists() and not job.exists()
    assert kept.is_dir() and unknown.is_dir() and (venvs / "cpu-abc").is_dir()


def test_overlay_build_failure_is_a_candidate_error(tmp_path: Path, checkout: Path) -> None:
    engine = SourceOverlay(
        FakeVenvEngine(tmp_path / "venvs"), checkout, runner=FakeRunner(tmp_path, pip_ok=False)
    )
    with pytest.raises(BuildError) as info:
        engine.prepare(type("Env", (), {"id": "cpu"})())
    assert "125" in info.value.fix


def test_overlay_needs_the_venv_engine(tmp_path: Path, checkout: Path) -> None:
    docker = FakeVenvEngine(tmp_path)
    docker.kind = EngineKind.DOCKER
    with pytest.raises(UsageError):
        SourceOverlay(docker, checkout)
    with pytest.raises(UsageError):
        SourceOverlay(FakeVenvEngine(tmp_path), tmp_path / "empty")


def test_overlay_passes_a_job_and_its_packages_to_the_venv_engine(tmp_path: Path, checkout: Path) -> None:
    """The layer is the engine a job runs on too: its run_job is the inner engine's (network
    included), and a job's packages become the venv engine's job layer over the checkout's layer
    (`make run DEEPSPEED_SRC= PACKAGES=`, pr-verify's sessions of DeepSpeed's own tests)."""
    from repro.engines import jobdeps

    seen: list[tuple[Any, ...]] = []

    def run_job(*args: Any, **kw: Any) -> str:
        seen.append((*args, kw))
        return "ran"

    def prepare_job(*args: Any) -> str:
        seen.append(args)
        return "layered"

    inner = FakeVenvEngine(tmp_path / "venvs")
    inner.run_job = run_job
    inner.prepare_job = prepare_job
    engine = SourceOverlay(inner, checkout, runner=FakeRunner(tmp_path))
    prepared = Prepared(EngineKind.VENV, "cpu", str(tmp_path), "cpu", True)
    assert engine.run_job(prepared, ["a"], tmp_path, tmp_path, 5.0, network=True) == "ran"
    assert seen == [(prepared, ["a"], tmp_path, tmp_path, 5.0, {"network": True})]
    env, deps = type("Env", (), {"id": "cpu"})(), jobdeps.parse(None, "six==1.16.0")
    assert engine.prepare_job(env, prepared, deps) == "layered"  # type: ignore[arg-type,comparison-overlap]
    assert seen[-1] == (env, prepared, deps)


def test_a_commits_work_tree_layer_refuses_a_jobs_packages(tmp_path: Path, checkout: Path) -> None:
    """The work tree changes under the layer at each commit: a job layer over it is refused, by name."""
    from repro.bisect.worktree_layer import WorktreeLayer
    from repro.engines import jobdeps

    (checkout / "deepspeed" / "__init__.py").write_text("")
    engine = WorktreeLayer(FakeVenvEngine(tmp_path / "venvs"), checkout, runner=FakeRunner(tmp_path))
    prepared = Prepared(EngineKind.VENV, "cpu", str(tmp_path), "cpu", True)
    with pytest.raises(UsageError, match="REQUIREMENTS=/PACKAGES=") as refused:
        engine.prepare_job(type("Env", (), {"id": "cpu"})(), prepared, jobdeps.parse(None, "six==1.16.0"))
    assert "DEEPSPEED_COMMIT=" in refused.value.fix


def test_a_bad_checkout_path_aborts_before_any_results_folder(tmp_path: Path) -> None:
    from repro.cli import bisect_commands as bisect_cli
    from repro.cli import main as cli

    argv = ["--env", "cpu", "--deepspeed-src", str(tmp_path / "nope")]
    argv += ["--results-root", str(tmp_path / "results")]
    matrix = type("Matrix", (), {"default_id": "cpu"})()
    services = bisect_cli.Services(
        matrix=matrix, engine=FakeVenvEngine(tmp_path / "venvs"), say=lambda _: None
    )
    # Through the front door, which turns the probe's error into EXIT_ABORT.
    code = cli.main(["probe", *argv], handler=lambda args: bisect_cli.run_probe(args, services))
    assert code == EXIT_ABORT
    assert not (tmp_path / "results").exists()
