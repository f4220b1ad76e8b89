"""The commit layer (repro/bisect/worktree_layer.py) for real, over a real (tiny) base venv and the
test's git repository: the work tree's `deepspeed` shadows the base's release, importlib.metadata
sees the commit's version, the layer is reused across commits, a file deleted in a later commit is
gone, and a probe of a commit that does not import is unknown, not a crash."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from repro.bisect.commits import DsRepo
from repro.bisect.probe import Observation, ProbeSpec
from repro.bisect.worktree_layer import GENERATED, ImportChecked, WorktreeLayer, installed_info
from repro.engines.base import EngineKind, Prepared
from tests.fixtures.ds_git import FakeDeepSpeed, make_fake_deepspeed
from tests.fixtures.stand_in_engine import StandInEngine

pytestmark = pytest.mark.usefixtures("real_subprocess")
RELEASE_INFO = "version='0.0.1'\naccelerator_name='cpu'\ntorch_info={'version': '2.13'}\n"


class BaseVenv(StandInEngine):
    """The env's cached venv: a real venv whose site-packages holds a 'release' deepspeed."""

    name = "base"

    def __init__(self, root: Path) -> None:
        self.dir = root / "venvs" / "cpu-latest-abc"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.dir)], check=True)
        site = Path(
            subprocess.run(
                [
                    str(self.dir / "bin" / "python"),
                    "-c",
                    "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        (site / "deepspeed").mkdir()
        (site / "deepspeed" / "__init__.py").write_text("__version__ = '0.0.1'\nGUARDED = 'release'\n")
        (site / "deepspeed" / "git_version_info_installed.py").write_text(RELEASE_INFO)
        (site / "deepspeed-0.0.1.dist-info").mkdir()
        (site / "deepspeed-0.0.1.dist-info" / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.0.1\n"
        )
        self.prepares = 0

    def prepare(self, env: Any) -> Prepared:
        self.prepares += 1
        return Prepared(EngineKind.VENV, env.id, str(self.dir), "base", True, {"platform": "cpu"})


ENV = type("Env", (), {"id": "cpu-latest"})()
SHOW = (
    "import deepspeed, importlib.metadata as m; "
    "print(deepspeed.GUARDED, m.version('deepspeed'), deepspeed.__file__)"
)


def show(prepared: Prepared) -> list[str]:
    out = subprocess.run([prepared.details["python"], "-c", SHOW], capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FakeDeepSpeed, DsRepo, BaseVenv]:
    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path / "cache"))
    ds = make_fake_deepspeed(tmp_path)
    repo = DsRepo(str(ds.path))
    repo.sync()
    return ds, repo, BaseVenv(tmp_path)


def test_the_layer_shows_exactly_the_checked_out_commit(
    setup: tuple[FakeDeepSpeed, DsRepo, BaseVenv],
) -> None:
    ds, repo, base = setup
    tree = repo.checkout(ds.shas["v0.2.0"])
    first = WorktreeLayer(base, tree).prepare(ENV)
    guarded, version, where = show(first)
    assert guarded == "True" and version == f"0.2.0+{ds.shas['v0.2.0'][:7]}"
    assert where.startswith(str(first.handle))  # the layer's link, ahead of the base's release
    assert Path(where).resolve().is_relative_to(tree.resolve())
    assert first.details["layered_on"] == str(base.dir)
    generated = (tree / GENERATED).read_text()
    assert "accelerator_name='cpu'" in generated and "torch_info={'version': '2.13'}" in generated
    # The next commit reuses the layer; the file it deleted is gone, so the behaviour changes.
    repo.checkout(ds.bad)
    second = WorktreeLayer(base, tree).prepare(ENV)
    assert second.handle == first.handle
    guarded, version, _ = show(second)
    assert guarded == "False" and version == f"0.2.0+{ds.bad[:7]}"
    assert len(list(Path(second.handle).glob("lib/python*/site-packages/deepspeed-*.dist-info"))) == 1


def test_a_commit_that_does_not_import_is_unknown_not_a_crash(
    setup: tuple[FakeDeepSpeed, DsRepo, BaseVenv],
) -> None:
    ds, repo, base = setup
    layer = WorktreeLayer(base, repo.checkout(ds.shas["broken"]))
    layer.prepare(ENV)  # no import up front: it would cost every probe a torch import
    assert "half of a refactor" in (layer.import_error() or "")

    def crashed(spec: ProbeSpec) -> Observation:
        return Observation(spec.label, "crashed", "crash", "ImportError in rank 0", 3.0)

    obs = ImportChecked(crashed, layer)(ProbeSpec("cpu-latest", label="broken"))
    assert (obs.outcome, obs.signature) == ("env-error", "none")
    assert obs.reason.startswith("the commit does not import: ImportError: half of a refactor")
    # A commit that imports keeps its crash: that is an answer (bad under BAD_IF=failed).
    fine = WorktreeLayer(base, repo.checkout(ds.bad))
    fine.prepare(ENV)
    assert ImportChecked(crashed, fine)(ProbeSpec("cpu-latest", label="bad")).outcome == "crashed"


def test_installed_info_without_a_base_file(tmp_path: Path) -> None:
    (tmp_path / "version.txt").write_text("0.19.3\n")
    version, text = installed_info(tmp_path, "02663d6", None)
    assert version == "0.19.3+02663d6"
    assert "git_hash='02663d6'" in text and "accelerator_name=''" in text
    compile(text, "git_version_info_installed.py", "exec")
