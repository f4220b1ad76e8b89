"""Default tier: the engines, the wheelhouse, preflight and the base image, against fakes.

Two seams are faked: `repro.core.cmd.run` (every subprocess) and the docker-py client object. The
Env is a local stand-in with the attributes and methods of `repro.matrix.model.Env` the engines use.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from repro.core import cmd
from repro.core.cmd import CmdResult
from repro.core.errors import (
    BuildError,
    DeviceUnavailableError,
    DockerUnavailableError,
    MissingToolError,
    PythonVersionError,
    UsageError,
)
from repro.engines import preflight, select, wheelhouse
from repro.engines.base import EngineKind, Prepared
from repro.engines.docker import build_context
from repro.engines.docker import engine as engine_docker
from repro.engines.docker.base_image import BaseImageSpec, make_base_image
from repro.engines.docker.engine import DockerEngine, ManagedContainer, RunOptions, extract_tree, run_options
from repro.engines.venv import engine as engine_venv
from repro.engines.venv.engine import MARKER, VenvEngine, VenvMarker
from repro.engines.wheelhouse import DownloadPlan, Wheelhouse
from repro.matrix.model import Env, Platform
from tests.fixtures.fake_dist import install_pins


# -- envs ------------------------------------------------------------------------------------------
def StubEnv(**overrides: Any) -> Env:  # noqa: N802 - reads like the dataclass it builds
    """A small real Env (repro.matrix.model), independent of env_matrix/envs.toml's contents."""
    base = Env(
        id="cpu",
        platform=Platform.CPU,
        base_image="python:3.11-slim-bookworm",
        python="3.11",
        torch="2.1.0",
        torch_index=None,
        deepspeed="0.13.1",
        extra_pins=("numpy==1.26.4",),
        rocm=None,
        cuda=None,
        notes="",
        derived_from=None,
        dockerfile="docker/cpu.Dockerfile",
        tooling=("pip==26.3",),
        deepspeed_deps=("hjson==3.1.0",),
    )
    return replace(base, **overrides)


class FakeCmd:
    """Scripted replacement for `repro.core.cmd.run`: records argv, answers by a handler."""

    def __init__(self, handler: Any = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.kwargs: list[dict[str, Any]] = []
        self.handler = handler or (lambda argv, kw: CmdResult(tuple(argv), 0))

    def __call__(self, argv: Any, **kw: Any) -> CmdResult:
        args = tuple(os.fspath(a) for a in argv)
        self.calls.append(args)
        self.kwargs.append(kw)
        result: CmdResult = self.handler(args, kw)
        return result


@pytest.fixture
def fake_cmd(monkeypatch: pytest.MonkeyPatch) -> FakeCmd:
    fake = FakeCmd()
    monkeypatch.setattr(cmd, "run", fake)
    return fake


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("MICS_REPRO_CACHE", str(root))
    monkeypatch.delenv("MICS_REPRO_OFFLINE", raising=False)
    monkeypatch.delenv("MICS_REPRO_PYTHON", raising=False)
    monkeypatch.delenv("MICS_REPRO_KEEP_CONTAINER", raising=False)
    monkeypatch.delenv("MICS_REPRO_BASE_IMAGE", raising=False)
    return root


# -- cmd: the one subprocess door ------------------------------------------------------------------
def test_missing_tool_is_a_typed_error(fake_cmd: FakeCmd) -> None:
    with pytest.raises(MissingToolError) as err:
        cmd.resolve("no-such-tool-mics-repro")
    assert err.value.exit_code == MissingToolError.exit_code
    assert "no-such-tool-mics-repro" in err.value.what


def test_cmd_timeout_stops_the_whole_process_group(
    real_subprocess: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cmd, "STOP_GRACE_S", 0.5)
    pid_file = tmp_path / "child.pid"
    # The shell starts a grandchild and waits: only a group-wide stop reaches both.
    script = f"sleep 300 & echo $! > {pid_file}; wait"
    result = cmd.run(["sh", "-c", script], timeout_s=1, capture=True)
    assert result.timed_out and result.returncode == cmd.TIMEOUT_EXIT_CODE and not result.ok
    grandchild = Path(f"/proc/{int(pid_file.read_text())}/stat")
    # gone, or a zombie waiting for init to reap it: either way no longer running
    assert not grandchild.exists() or grandchild.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_cmd_tee_keeps_both_streams_in_order(real_subprocess: None, tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    result = cmd.run(["sh", "-c", "echo one; echo two >&2; exit 3"], tee=log)
    assert result.returncode == 3
    assert log.read_text().split() == ["one", "two"]


# -- run options per platform ----------------------------------------------------------------------
def test_rocm_gets_devices_numeric_groups_ipc_and_seccomp() -> None:
    kw = run_options("rocm", (44, 109)).to_kwargs()
    assert kw["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert kw["group_add"] == ["44", "109"]
    assert kw["ipc_mode"] == "host"
    assert kw["security_opt"] == ["seccomp=unconfined"]
    assert "device_requests" not in kw


def test_rocm_without_readable_gids_falls_back_to_video() -> None:
    assert run_options("rocm", ()).group_add == ("video",)


def test_cuda_requests_every_gpu() -> None:
    kw = run_options("cuda").to_kwargs()
    (request,) = kw["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    assert "devices" not in kw


def test_cpu_has_no_devices_but_a_large_shm() -> None:
    kw = run_options("cpu").to_kwargs()
    assert set(kw) == {"shm_size"}


# -- a fake docker client ----------------------------------------------------------------------------
from tests.fixtures.fake_docker_engine import (  # noqa: E402
    FAKE_DOCKERFILE,
    FakeClient,
    FakeContainer,
    FakeImage,
    FakeWheelhouse,
    Script,
    _fake_repo,
    _prepared,
    _tar_of,
)


@pytest.fixture
def docker_engine(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> DockerEngine:
    monkeypatch.setenv("MICS_REPRO_CA_BUNDLE", "none")
    wh = FakeWheelhouse(tmp_path / "wheels")
    wh.path.mkdir()
    (wh.path / "torch-2.1.0-cp311-cp311-manylinux1_x86_64.whl").write_bytes(b"")
    return DockerEngine(
        FakeClient(), repo_root=_fake_repo(tmp_path), wheelhouse=wh, log_dir=tmp_path / "logs", build_args={}
    )


# -- docker: containers are always removed ---------------------------------------------------------


def test_run_suite_runs_offline_copies_results_and_removes(
    docker_engine: DockerEngine, tmp_path: Path
) -> None:
    client: FakeClient = docker_engine.client
    run = docker_engine.run_suite(_prepared(), ["--env", "cpu"], tmp_path / "out", timeout_s=60)
    (box,) = client.created
    assert box.kwargs["network_mode"] == "none" and box.kwargs["init"] is True  # offline, loopback kept
    assert "network_disabled" not in box.kwargs
    assert box.kwargs["command"] == [
        "python",
        "-m",
        "repro.workload.suite",
        "--env",
        "cpu",
        "--out",
        "/results",
    ]
    assert (tmp_path / "out" / "suite.json").read_text() == '{"runs": []}'
    assert (tmp_path / "out" / "engine.log").read_bytes() == b"hello\n"
    assert run.exit_code == 0 and not run.timed_out and run.ok
    assert client.live == {} and client.removed == [box.name]


def test_rocm_run_passes_device_flags(docker_engine: DockerEngine, tmp_path: Path) -> None:
    docker_engine.run_suite(_prepared(platform="rocm"), [], tmp_path / "out", timeout_s=None)
    (box,) = docker_engine.client.created
    assert box.kwargs["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert box.kwargs["ipc_mode"] == "host"


def test_timeout_is_a_result_and_the_container_is_stopped_and_removed(
    docker_engine: DockerEngine, tmp_path: Path
) -> None:
    client: FakeClient = docker_engine.client
    client.script = Script(hangs=True)
    run = docker_engine.run_suite(_prepared(), [], tmp_path / "out", timeout_s=5)
    (box,) = client.created
    assert run.timed_out and run.exit_code == 124
    assert box.signals[0] == "SIGINT"  # interrupted first, so the suite can write what it has
    assert (tmp_path / "out" / "suite.json").exists()  # partial results still copied out
    assert client.live == {}


def test_ctrl_c_stops_and_removes_the_container(docker_engine: DockerEngine, tmp_path: Path) -> None:
    client: FakeClient = docker_engine.client
    client.script = Script(interrupt_on_wait=True)
    with pytest.raises(KeyboardInterrupt):
        docker_engine.run_suite(_prepared(), [], tmp_path / "out", timeout_s=None)
    (box,) = client.created
    assert box.signals == ["SIGINT"] and client.live == {}


def test_error_inside_the_block_removes_the_container(tmp_path: Path) -> None:
    client = FakeClient()
    client.image_store["img"] = FakeImage("sha256:1", {})
    with pytest.raises(RuntimeError), ManagedContainer(client, "img", ["true"], "c1", RunOptions()) as box:
        box.start()
        raise RuntimeError("boom")
    assert client.live == {} and client.removed == ["c1"]


def _owner(owners: Path, name: str) -> Path:
    folder = owners / name
    folder.mkdir(parents=True)
    (folder / engine_docker.OWNER_LOCK_FILE).write_text("")
    return folder


def test_a_run_sweeps_the_containers_of_killed_runs_only(docker_engine: DockerEngine, tmp_path: Path) -> None:
    """What a SIGKILLed tool leaves (a stopped container whose owner lock nobody holds) is removed
    at the next start, with its owner folder; a live tool's container and those not ours are kept."""
    import fcntl

    client: FakeClient = docker_engine.client
    owners = engine_docker.owners_dir()
    dead, live = _owner(owners, "run-dead"), _owner(owners, "run-live")
    elsewhere = _owner(tmp_path / "other-cache", "run-x")

    def leftover(name: str, folder: Path, status: str) -> None:
        box = client.containers.create(
            "sha256:" + "a" * 64,
            ["true"],
            name=name,
            labels={"mics-repro": "1", engine_docker.LABEL_OWNER: str(folder)},
        )
        box.status = status

    leftover("killed", dead, "exited")
    leftover("running", live, "running")
    leftover("foreign", elsewhere, "exited")
    leftover("kept", owners / "run-gone", "exited")  # folder gone: MICS_REPRO_KEEP_CONTAINER kept it
    old, new = _owner(owners, "run-old"), _owner(owners, "run-new")  # no container names them
    os.utime(old, (0, 0))  # a killed tool's, its container long gone; "new" may be a starting run's
    with open(live / engine_docker.OWNER_LOCK_FILE) as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the live tool's lock
        run = docker_engine.run_suite(_prepared(), [], tmp_path / "out", timeout_s=60)
    assert run.exit_code == 0
    assert set(client.live) == {"running", "foreign", "kept"}
    assert not dead.exists() and live.exists() and elsewhere.exists()
    assert not old.exists() and new.exists()
    (box,) = [b for b in client.created if b.name.startswith("mics-repro-")]
    assert Path(box.labels[engine_docker.LABEL_OWNER]).parent == owners  # the run's own, for the next sweep


def test_an_interrupt_during_the_removal_still_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = FakeClient()
    client.image_store["img"] = FakeImage("sha256:1", {})
    tries: list[str] = []
    real_remove = FakeContainer.remove

    def remove(box: FakeContainer, force: bool = False) -> None:
        tries.append(box.name)
        if len(tries) == 1:
            raise KeyboardInterrupt  # a second Ctrl-C while the first one's clean-up removes it
        real_remove(box, force)

    monkeypatch.setattr(FakeContainer, "remove", remove)
    with (
        pytest.raises(KeyboardInterrupt),
        ManagedContainer(client, "img", ["true"], "c1", RunOptions()) as box,
    ):
        box.start()
        raise KeyboardInterrupt
    assert client.live == {} and tries == ["c1", "c1"]


def test_bad_image_leaves_no_container(docker_engine: DockerEngine, tmp_path: Path) -> None:
    client: FakeClient = docker_engine.client
    with pytest.raises(docker.errors.ImageNotFound):
        docker_engine.run("no/such:image", ["true"], tmp_path / "out", None)
    assert client.created == [] and client.live == {}


def test_keep_variable_keeps_the_container(
    docker_engine: DockerEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("MICS_REPRO_KEEP_CONTAINER", "1")
    docker_engine.run_suite(_prepared(), [], tmp_path / "out", timeout_s=None)
    (box,) = docker_engine.client.created
    assert box.name in docker_engine.client.live
    assert f"docker rm -f {box.name}" in capsys.readouterr().out


def test_missing_results_dir_is_not_fatal(docker_engine: DockerEngine, tmp_path: Path) -> None:
    docker_engine.client.script = Script(exit_code=1, results=None)
    run = docker_engine.run_suite(_prepared(), [], tmp_path / "out", timeout_s=None)
    assert run.exit_code == 1 and not run.ok and docker_engine.client.live == {}


def test_extract_tree_refuses_to_leave_the_destination(tmp_path: Path) -> None:
    data = _tar_of({"ok.txt": b"1", "sub/deep.txt": b"2", "../../escape.txt": b"3"})
    dest = tmp_path / "dest"
    dest.mkdir()
    assert extract_tree(io.BytesIO(data), dest) == 2
    assert (dest / "sub" / "deep.txt").read_bytes() == b"2"
    assert not (tmp_path / "escape.txt").exists()


# -- docker: images --------------------------------------------------------------------------------
def _context_names(build: dict[str, Any]) -> list[str]:
    with tarfile.open(fileobj=build["fileobj"], mode="r") as tar:
        return sorted(tar.getnames())


def test_build_context_args_and_labels(docker_engine: DockerEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MICS_REPRO_BASE_IMAGE", "mics-repro/base:bookworm")
    docker_engine.base_override = "mics-repro/base:bookworm"
    env = StubEnv()
    prepared = docker_engine.prepare(env)
    client: FakeClient = docker_engine.client
    (build,) = client.builds
    assert _context_names(build) == [
        "docker/certs",
        "docker/cpu.Dockerfile",
        "docker/verify_image.py",
        "repro/__init__.py",
        "repro/workload/suite.py",
    ]
    assert build["dockerfile"] == "docker/cpu.Dockerfile" and build["custom_context"] is True
    assert build["network_mode"] == "host" and build["tag"] == env.image_tag()
    assert build["buildargs"]["PIP_FIND_LINKS"].startswith("http://127.0.0.1:")
    assert build["buildargs"]["BASE_IMAGE"] == "mics-repro/base:bookworm"
    assert build["buildargs"]["STRICT"] == "0"  # a stand-in base is not the matrix's stack
    assert "torch-2.1.0-cp311-cp311-manylinux1_x86_64.whl" in client.served_listing
    assert build["labels"][engine_docker.LABEL_PINS_KEY] == env.pins_key()
    assert docker_engine.wheelhouse.ensured == ["cpu"]  # type: ignore[attr-defined]
    # a complete wheelhouse is used alone: pip would otherwise take PyPI's copy of torch
    assert build["buildargs"]["PIP_NO_INDEX"] == "1"
    assert not prepared.reused and prepared.details["platform"] == "cpu"


def test_incomplete_wheelhouse_keeps_the_indexes(docker_engine: DockerEngine) -> None:
    docker_engine.wheelhouse.complete = False  # type: ignore[attr-defined]
    docker_engine.prepare(StubEnv())
    (build,) = docker_engine.client.builds
    assert "PIP_NO_INDEX" not in build["buildargs"]


def test_image_is_reused_until_workload_changes(docker_engine: DockerEngine) -> None:
    env = StubEnv()
    docker_engine.prepare(env)
    again = docker_engine.prepare(env)
    assert again.reused and len(docker_engine.client.builds) == 1
    (docker_engine.repo_root / "repro" / "workload" / "suite.py").write_text("print('edited')\n")
    assert not docker_engine.prepare(env).reused
    assert len(docker_engine.client.builds) == 2


def test_ca_bundle_goes_into_the_context(
    docker_engine: DockerEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("MICS_REPRO_CA_BUNDLE", str(bundle))
    docker_engine.prepare(StubEnv())
    (build,) = docker_engine.client.builds
    assert "docker/certs/host-ca.crt" in _context_names(build)
    assert "STRICT" not in build["buildargs"]


def test_copy_of_a_missing_file_is_a_build_error(docker_engine: DockerEngine) -> None:
    (docker_engine.repo_root / "docker" / "verify_image.py").unlink()
    with pytest.raises(BuildError) as err:
        docker_engine.prepare(StubEnv())
    assert "docker/verify_image.py" in err.value.what and docker_engine.client.builds == []


def test_copy_sources_reads_every_form() -> None:
    assert build_context.copy_sources(FAKE_DOCKERFILE) == [
        "docker/certs/",
        "docker/verify_image.py",
        "repro/__init__.py",
        "repro/workload/",
    ]


def test_build_args_extra_and_bad_input() -> None:
    parsed = build_context.parse_build_args("OS_PACKAGES= PYTHON=python3")
    assert parsed == {"OS_PACKAGES": "", "PYTHON": "python3"}
    with pytest.raises(BuildError):
        build_context.parse_build_args("NOEQUALS")


def test_build_error_is_a_build_error_with_a_log(docker_engine: DockerEngine) -> None:
    docker_engine.client.build_chunks = [
        {"stream": "Step 1/3 : FROM python:3.11-slim-bookworm\n"},
        {"error": "pull access denied", "errorDetail": {"message": "pull access denied for python"}},
    ]
    with pytest.raises(BuildError) as err:
        docker_engine.prepare(StubEnv())
    assert "pull access denied" in err.value.why and "MICS_REPRO_BASE_IMAGE" in err.value.fix
    log = next(docker_engine.log_dir.glob("build-cpu*.log"))
    assert "pull access denied for python" in log.read_text()


def test_derived_env_dockerfile_comes_from_the_generator(
    docker_engine: DockerEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = "FROM mics-repro/base:bookworm\n# derived\n"
    monkeypatch.setattr("repro.engines.docker.dockerfiles.render", lambda env: rendered)
    env = StubEnv(id="cpu+torch2.2.2", torch="2.2.2", derived_from="cpu", dockerfile="")
    docker_engine.prepare(env)
    (build,) = docker_engine.client.builds
    with tarfile.open(fileobj=build["fileobj"], mode="r") as tar:
        member = tar.extractfile(build["dockerfile"])
        assert member is not None and member.read().decode() == rendered


# -- engine choice -----------------------------------------------------------------------------------
def test_auto_picks_docker_when_a_daemon_answers(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    sentinel = object()
    monkeypatch.setattr(DockerEngine, "connect", classmethod(lambda cls: sentinel))
    chosen = select.choose_engine("auto", docker_probe=lambda: (True, "daemon at test"))
    assert chosen is sentinel
    assert "engine: docker (ENGINE=auto; daemon at test)" in capsys.readouterr().out


def test_auto_falls_back_to_venv(cache: Path, capsys: Any) -> None:
    chosen = select.choose_engine("auto", docker_probe=lambda: (False, "no daemon"))
    assert isinstance(chosen, VenvEngine)
    assert "engine: venv (ENGINE=auto; no daemon)" in capsys.readouterr().out


def test_engine_variable_is_read(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE", "venv")
    assert select.choose_engine(None, docker_probe=lambda: (True, "up")).kind is EngineKind.VENV


def test_explicit_docker_without_daemon_fails_with_exit_10() -> None:
    # docker.from_env is refused by the conftest guard, exactly like an absent daemon would fail.
    with pytest.raises(DockerUnavailableError) as err:
        select.choose_engine("docker")
    assert err.value.exit_code == 10


def test_unknown_engine_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        select.choose_engine("podman", docker_probe=lambda: (True, ""))


def test_daemon_status_never_raises() -> None:
    up, reason = engine_docker.daemon_status()
    assert up is False and "no Docker daemon answers" in reason


# -- venv engine -------------------------------------------------------------------------------------
def _venv_handler(
    python_version: str = "3.11.7",
    fail_on: str | None = None,
    versions: str = "2.1.0 0.13.1",
    build: str = "2.1.0 - 12.1",  # torch.__version__, .hip, .cuda: PyPI's (CUDA) build
) -> Any:
    def handle(argv: tuple[str, ...], kw: dict[str, Any]) -> CmdResult:
        if fail_on and any(fail_on in a for a in argv):
            return CmdResult(argv, 1, stderr="ERROR: no matching distribution")
        if argv[1:3] == ("-m", "venv"):
            bin_dir = Path(argv[3]) / "bin"
            bin_dir.mkdir(parents=True)
            (bin_dir / "python").write_text("")
            (bin_dir / "torchrun").write_text(f"#!{argv[3]}/bin/python\nimport torch\n")
            (Path(argv[3]) / "pyvenv.cfg").write_text(f"command = python -m venv {argv[3]}\n")
            return CmdResult(argv, 0)
        if argv[1] == "-c" and "sys.version_info" in argv[2]:
            return CmdResult(argv, 0, stdout=python_version + "\n")
        if argv[1] == "-c" and "importlib.metadata" in argv[2]:
            return CmdResult(argv, 0, stdout=f"{versions}\n{build}\n")
        if argv[1:4] == ("-m", "pip", "install"):
            install_pins(Path(argv[0]).parent.parent / "lib" / "python3.11" / "site-packages", list(argv))
        return CmdResult(argv, 0)

    return handle


@pytest.fixture
def venv_engine(cache: Path, tmp_path: Path) -> VenvEngine:
    return VenvEngine(wheelhouse=FakeWheelhouse(tmp_path / "wheels"), repo_root=tmp_path / "repo")


def test_venv_is_built_atomically_with_a_marker_and_relocated(
    venv_engine: VenvEngine, fake_cmd: FakeCmd
) -> None:
    fake_cmd.handler = _venv_handler()
    env = StubEnv()
    prepared = venv_engine.prepare(env)
    final = venv_engine.venv_dir(env)
    assert prepared.handle == str(final) and not prepared.reused
    marker = VenvMarker.read(final)
    assert marker is not None and marker.pins == env.pins() and marker.python == "3.11"
    assert (final / "bin" / "torchrun").read_text().startswith(f"#!{final}/bin/python")
    assert [p.name for p in final.parent.iterdir() if p.name.startswith(".") and p.is_dir()] == []
    ds_call = next(c for c in fake_cmd.calls if any(a.startswith("deepspeed==") for a in c))
    assert "--no-build-isolation" in ds_call and "--no-deps" in ds_call
    # GPUs hidden from DeepSpeed's setup.py (nvcc / ROCM_HOME on a host with only a driver)
    assert fake_cmd.kwargs[fake_cmd.calls.index(ds_call)]["extra_env"] == {
        "DS_BUILD_OPS": "0",
        "CUDA_VISIBLE_DEVICES": "",
        "HIP_VISIBLE_DEVICES": "",
        "ROCR_VISIBLE_DEVICES": "",
    }
    torch_call = next(c for c in fake_cmd.calls if "torch===2.1.0" in c)
    assert torch_call.index("torch===2.1.0") > torch_call.index("--find-links")
    assert "--no-index" in torch_call  # the wheelhouse was completed first
    assert fake_cmd.calls.index(torch_call) < fake_cmd.calls.index(ds_call)


def test_venv_with_matching_marker_is_reused(venv_engine: VenvEngine, fake_cmd: FakeCmd) -> None:
    fake_cmd.handler = _venv_handler()
    env = StubEnv()
    venv_engine.prepare(env)
    fake_cmd.calls.clear()
    again = venv_engine.prepare(env)
    assert again.reused
    assert all("pip" not in c for c in fake_cmd.calls)  # only the interpreter probe ran


def test_venv_with_other_pins_is_rebuilt(venv_engine: VenvEngine, fake_cmd: FakeCmd) -> None:
    fake_cmd.handler = _venv_handler()
    env = StubEnv()
    final = venv_engine.venv_dir(env)
    (final / "bin").mkdir(parents=True)
    (final / "bin" / "python").write_text("")
    stale = VenvMarker(env.id, {**env.pins(), "extra": "numpy<3"}, "3.11")
    (final / MARKER).write_text(stale.to_json())
    assert not venv_engine.prepare(env).reused
    marker = VenvMarker.read(final)
    assert marker is not None and marker.matches(VenvMarker(env.id, env.pins(), "3.11"))


def test_a_damaged_venv_is_rebuilt_saying_why(
    venv_engine: VenvEngine, fake_cmd: FakeCmd, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 22, item 14: a file pip installed is gone (torch/__init__.py): rebuilt, not reused."""
    fake_cmd.handler = _venv_handler()
    env = StubEnv()
    final = Path(venv_engine.prepare(env).handle)
    init = final / "lib" / "python3.11" / "site-packages" / "torch" / "__init__.py"
    assert init.is_file()
    init.unlink()
    capsys.readouterr()
    fake_cmd.calls.clear()
    again = venv_engine.prepare(env)
    assert not again.reused
    assert any("torch===2.1.0" in c for c in fake_cmd.calls)  # reinstalled
    assert "damaged: torch/__init__.py of torch is missing" in capsys.readouterr().out
    assert init.is_file()


def _noisy_pip(fail: str | None = None) -> Any:
    """A pip that prints hundreds of lines (into the tee, as the real one does through cmd.run)."""
    base = _venv_handler()

    def handle(argv: tuple[str, ...], kw: dict[str, Any]) -> CmdResult:
        if argv[1:4] == ("-m", "pip", "install"):
            with open(kw["tee"], "a") as log:
                log.writelines(f"Collecting thing-{n}\n" for n in range(300))
                if fail and any(fail in a for a in argv):
                    log.write("ERROR: No matching distribution found for torch==2.1.0\n")
                    return CmdResult(argv, 1)
        return base(argv, kw)  # type: ignore[no-any-return]

    return handle


def test_pip_output_goes_to_a_log_and_the_terminal_gets_one_line_per_step(
    venv_engine: VenvEngine, fake_cmd: FakeCmd, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 22, item 18: the first `make repro` no longer floods the terminal with pip."""
    fake_cmd.handler = _noisy_pip()
    venv_engine.prepare(StubEnv())
    pip_kwargs = [kw for c, kw in zip(fake_cmd.calls, fake_cmd.kwargs) if c[1:4] == ("-m", "pip", "install")]
    assert pip_kwargs and all(kw.get("show") is False for kw in pip_kwargs)
    log = Path(pip_kwargs[0]["tee"])
    assert log.read_text().count("Collecting thing-") == 300 * len(pip_kwargs)
    out = capsys.readouterr().out
    assert "Collecting" not in out and len(out.splitlines()) < 30


def test_pip_output_is_shown_with_verbose(venv_engine: VenvEngine, fake_cmd: FakeCmd) -> None:
    from repro.core import console

    fake_cmd.handler = _noisy_pip()
    level = console.get_level()
    console.set_level(console.Level.VERBOSE)
    try:
        venv_engine.prepare(StubEnv())
    finally:
        console.set_level(level)
    pip_kwargs = [kw for c, kw in zip(fake_cmd.calls, fake_cmd.kwargs) if c[1:4] == ("-m", "pip", "install")]
    assert pip_kwargs and all(kw.get("show") is True for kw in pip_kwargs)


def test_a_failed_pip_step_shows_its_whole_output(
    venv_engine: VenvEngine, fake_cmd: FakeCmd, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_cmd.handler = _noisy_pip(fail="torch==")
    with pytest.raises(BuildError) as err:
        venv_engine.prepare(StubEnv())
    shown = capsys.readouterr().err
    assert shown.count("Collecting thing-") >= 300 and "No matching distribution" in shown
    assert "No matching distribution" in err.value.why


def test_docker_build_output_is_a_detail(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from repro.core import console
    from repro.engines.docker.engine import _BuildLog, _record_chunk

    log = _BuildLog(tmp_path / "b.log", "[build cpu] ")
    with open(log.path, "w") as sink:
        _record_chunk({"stream": "Step 1/9 : FROM python\n"}, log, sink)
        assert "Step 1/9" not in capsys.readouterr().out
        level = console.get_level()
        console.set_level(console.Level.VERBOSE)
        try:
            _record_chunk({"stream": "Step 2/9 : RUN pip\n"}, log, sink)
        finally:
            console.set_level(level)
    assert "Step 2/9" in capsys.readouterr().out
    assert "Step 1/9" in log.path.read_text()


def test_a_quiet_tee_writes_only_the_log(tmp_path: Path, real_subprocess: None, capfd: Any) -> None:
    log = tmp_path / "out.log"
    result = cmd.run(
        [sys.executable, "-c", "print('\\n'.join(f'line {n}' for n in range(50)))"], tee=log, show=False
    )
    assert result.ok and log.read_text().count("line ") == 50
    assert "line 7" not in capfd.readouterr().out


def test_venv_without_marker_is_never_reused(venv_engine: VenvEngine, fake_cmd: FakeCmd) -> None:
    fake_cmd.handler = _venv_handler()
    env = StubEnv()
    final = venv_engine.venv_dir(env)
    (final / "bin").mkdir(parents=True)
    (final / "bin" / "python").write_text("")  # half-built: no marker
    assert not venv_engine.prepare(env).reused


def test_failed_install_keeps_nothing(venv_engine: VenvEngine, fake_cmd: FakeCmd) -> None:
    fake_cmd.handler = _venv_handler(fail_on="torch==")
    env = StubEnv()
    with pytest.raises(BuildError) as err:
        venv_engine.prepare(env)
    assert "no matching distribution" in err.value.why
    assert not venv_engine.venv_dir(env).exists()
    assert [p for p in venv_engine.root.iterdir() if p.is_dir()] == []


def test_wrong_versions_after_install_are_a_build_error(venv_engine: VenvEngine, fake_cmd: FakeCmd) -> None:
    fake_cmd.handler = _venv_handler(versions="2.2.0 0.13.1")
    with pytest.raises(BuildError):
        venv_engine.prepare(StubEnv())


def test_python_too_new_is_refused_before_any_install(
    venv_engine: VenvEngine, fake_cmd: FakeCmd, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_cmd.handler = _venv_handler(python_version="3.12.3")
    monkeypatch.setattr(
        engine_venv.shutil, "which", lambda name: sys.executable if name == sys.executable else None
    )
    with pytest.raises(PythonVersionError) as err:
        venv_engine.prepare(StubEnv())
    assert err.value.exit_code == 12 and "too new" in err.value.what and "--python" in err.value.fix
    assert all("pip" not in c and "venv" not in c for c in fake_cmd.calls)


def test_a_supported_pythonXY_on_path_is_used_when_this_python_is_too_new(
    venv_engine: VenvEngine, fake_cmd: FakeCmd, monkeypatch: pytest.MonkeyPatch
) -> None:
    versions = {sys.executable: "3.12.3", "/opt/py311/bin/python3.11": "3.11.9"}
    fake_cmd.handler = lambda argv, kw: CmdResult(argv, 0, stdout=versions[argv[0]] + "\n")
    monkeypatch.setattr(
        engine_venv.shutil,
        "which",
        lambda name: "/opt/py311/bin/python3.11" if name == "python3.11" else name,
    )
    chosen = venv_engine.interpreter(StubEnv())
    assert (chosen.path, chosen.minor) == ("/opt/py311/bin/python3.11", "3.11")


def test_wheelhouse_is_filled_for_the_python_the_venv_is_made_from(
    venv_engine: VenvEngine, fake_cmd: FakeCmd, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    # rocm56 on an Ubuntu 22.04 host: the env's image Python is 3.9, this Python is 3.10, and torch
    # 2.1.0 has cp310 wheels: the venv is made with 3.10, so the wheelhouse must hold cp310 wheels.
    fake_cmd.handler = _venv_handler(python_version="3.10.12")
    monkeypatch.setattr(engine_venv.shutil, "which", lambda name: name if name == sys.executable else None)
    env = StubEnv(python="3.9")
    venv_engine.prepare(env)
    assert venv_engine.wheelhouse.ensured_for == ["3.10"]  # type: ignore[attr-defined]
    marker = VenvMarker.read(venv_engine.venv_dir(env))
    assert marker is not None and marker.python == "3.10"
    said = capsys.readouterr()
    assert "Python 3.10.12" in said.out + said.err  # the preamble names the Python it chose


def test_download_plan_targets_the_given_python() -> None:
    assert DownloadPlan.for_env(StubEnv(python="3.9")).python == "3.9"
    assert DownloadPlan.for_env(StubEnv(python="3.9"), "3.10").python == "3.10"


def test_offline_installs_use_no_index(venv_engine: VenvEngine, fake_cmd: FakeCmd) -> None:
    fake_cmd.handler = _venv_handler()
    venv_engine.wheelhouse.complete = False  # type: ignore[attr-defined]
    venv_engine.wheelhouse.offline = True
    venv_engine.prepare(StubEnv())
    torch_call = next(c for c in fake_cmd.calls if "torch===2.1.0" in c)
    assert "--no-index" in torch_call


def test_torch_index_is_the_primary_index(venv_engine: VenvEngine, fake_cmd: FakeCmd) -> None:
    fake_cmd.handler = _venv_handler(build="2.1.0+rocm5.6 5.6.31061 -")
    venv_engine.wheelhouse.complete = False  # type: ignore[attr-defined]
    venv_engine.prepare(
        StubEnv(platform=Platform.ROCM, torch_index="https://download.pytorch.org/whl/rocm5.6")
    )
    torch_call = next(c for c in fake_cmd.calls if "torch==2.1.0+rocm5.6" in c)
    assert torch_call[torch_call.index("--index-url") + 1] == "https://download.pytorch.org/whl/rocm5.6"
    assert "--no-index" not in torch_call


def test_venv_run_suite(
    venv_engine: VenvEngine, fake_cmd: FakeCmd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    fake_cmd.handler = lambda argv, kw: CmdResult(argv, cmd.TIMEOUT_EXIT_CODE, timed_out=True, duration_s=3.0)
    prepared = Prepared(EngineKind.VENV, "cpu", "/v", "/v", True)
    run = venv_engine.run_suite(prepared, ["--env", "cpu"], tmp_path / "out", timeout_s=3)
    (argv,) = fake_cmd.calls
    assert argv == (
        "/v/bin/python",
        "-m",
        "repro.workload.suite",
        "--env",
        "cpu",
        "--out",
        str(tmp_path / "out"),
    )
    kw = fake_cmd.kwargs[0]
    assert kw["env"]["PYTHONPATH"] == str(venv_engine.repo_root) and kw["timeout_s"] == 3
    assert run.timed_out and run.exit_code == 124 and not run.ok


# -- wheelhouse --------------------------------------------------------------------------------------
def test_files_for_matches_local_versions_and_sdists(tmp_path: Path) -> None:
    wh = Wheelhouse(tmp_path, offline=False)
    for name in (
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "deepspeed-0.13.1.tar.gz",
        "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl",
        "README",
    ):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in wh.files_for("torch==2.13.0")] == [
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    ]
    assert [p.name for p in wh.files_for("deepspeed==0.13.1")] == ["deepspeed-0.13.1.tar.gz"]
    assert wh.files_for("numpy<2") == [] and wh.files_for("torch==2.1.0") == []


def test_files_for_checks_python_tags_and_the_torch_build(tmp_path: Path) -> None:
    wh = Wheelhouse(tmp_path, offline=False)
    pypi = "torch-2.1.0-cp311-cp311-manylinux1_x86_64.whl"
    rocm = "torch-2.1.0+rocm5.6-cp39-cp39-linux_x86_64.whl"
    abi3, pure = "psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.whl", "hjson-3.1.0-py3-none-any.whl"
    for name in (pypi, rocm, abi3, pure):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in wh.files_for("torch==2.1.0", "3.11")] == [pypi]
    assert [p.name for p in wh.files_for("torch==2.1.0", "3.9", "rocm5.6")] == [rocm]
    assert wh.files_for("torch==2.1.0", "3.11", "rocm5.6") == []
    assert wh.files_for("psutil==7.2.2", "3.9") and wh.files_for("hjson==3.1.0", "3.8")
    rocm_index = "https://download.pytorch.org/whl/rocm5.6"
    plan = DownloadPlan(("torch==2.1.0", "hjson==3.1.0"), (), rocm_index, "3.11")
    assert wh.missing(plan) == ["torch==2.1.0"]
    assert wheelhouse.torch_build("https://download.pytorch.org/whl/cu121/") == "cu121"
    assert wheelhouse.torch_build("https://pypi.org/simple") is None


def test_ensure_downloads_once_then_is_a_no_op(tmp_path: Path, fake_cmd: FakeCmd) -> None:
    wh = Wheelhouse(tmp_path / "wh", offline=False)

    def download(argv: tuple[str, ...], kw: dict[str, Any]) -> CmdResult:
        dest = Path(argv[argv.index("-d") + 1])
        names = {
            "torch===2.1.0": "torch-2.1.0-cp311-cp311-manylinux1_x86_64.whl",
            "hjson==3.1.0": "hjson-3.1.0-py3-none-any.whl",
            "pip==26.3": "pip-26.3-py3-none-any.whl",
            "numpy==1.26.4": "numpy-1.26.4-cp311-cp311-manylinux1_x86_64.whl",
            "deepspeed==0.13.1": "deepspeed-0.13.1.tar.gz",
        }
        for spec, name in names.items():
            if spec in argv:
                (dest / name).write_bytes(b"")
        return CmdResult(argv, 0)

    fake_cmd.handler = download
    env = StubEnv()
    assert wh.ensure(env) is True
    assert len(fake_cmd.calls) == 2
    reqs_call, ds_call = fake_cmd.calls
    assert "torch===2.1.0" in reqs_call and "deepspeed==0.13.1" not in reqs_call
    assert "--no-deps" in ds_call and ds_call[-1] == "deepspeed==0.13.1"
    wh.ensure(env)
    assert len(fake_cmd.calls) == 2  # stamp + files present: nothing ran


def test_ensure_cross_downloads_for_another_python(tmp_path: Path, fake_cmd: FakeCmd) -> None:
    other = "3.8" if sys.version_info[:2] != (3, 8) else "3.9"
    Wheelhouse(tmp_path, offline=False).ensure(StubEnv(python=other))
    reqs_call = fake_cmd.calls[0]
    assert reqs_call[reqs_call.index("--python-version") + 1] == other
    assert "--only-binary=:all:" in reqs_call and "linux_x86_64" in reqs_call


def test_offline_ensure_with_missing_files_says_what_to_copy(tmp_path: Path, fake_cmd: FakeCmd) -> None:
    with pytest.raises(BuildError) as err:
        Wheelhouse(tmp_path, offline=True).ensure(StubEnv())
    assert "torch===2.1.0" in err.value.what and fake_cmd.calls == []


def test_download_plan_keys_differ_by_pin() -> None:
    assert DownloadPlan.for_env(StubEnv()).key() != DownloadPlan.for_env(StubEnv(deepspeed="0.14.5")).key()
    assert DownloadPlan.for_env(StubEnv()).key() == DownloadPlan.for_env(StubEnv()).key()


def test_cache_root_follows_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path))
    assert wheelhouse.cache_root() == tmp_path
    assert engine_venv.venv_root() == tmp_path / "venvs"


# -- preflight ---------------------------------------------------------------------------------------
# Device checks (fake /dev, /sys, nvidia-smi and docker info): tests/engines/test_gpu_preflight.py.


@pytest.mark.parametrize(
    ("torch", "python", "ok"),
    [
        ("2.1.0", "3.11.7", True),
        ("2.1.0", "3.12.1", False),
        ("2.1.0", "3.7.9", False),
        ("2.2.2", "3.12.1", True),
        ("2.5.1", "3.8.10", False),
        ("2.1.0+rocm5.6", "3.8.10", True),
        ("9.9.0", "3.99.0", True),  # unknown torch: left to pip
    ],
)
def test_python_support_table(torch: str, python: str, ok: bool) -> None:
    env = StubEnv(torch=torch)
    if ok:
        preflight.check_python(env, python, "/usr/bin/python3")
    else:
        with pytest.raises(PythonVersionError):
            preflight.check_python(env, python, "/usr/bin/python3")


def test_preflight_errors_have_distinct_exit_codes() -> None:
    codes = {
        DockerUnavailableError.exit_code,
        DeviceUnavailableError.exit_code,
        PythonVersionError.exit_code,
        BuildError.exit_code,
        MissingToolError.exit_code,
    }
    assert len(codes) == 5
    assert preflight.docker_unavailable("socket missing").exit_code == DockerUnavailableError.exit_code


# -- base image --------------------------------------------------------------------------------------
def test_base_image_is_skipped_when_present(fake_cmd: FakeCmd) -> None:
    client = FakeClient()
    client.image_store["mics-repro/base:bookworm"] = FakeImage("sha256:base", {})
    assert make_base_image(engine=DockerEngine(client)) == "sha256:base"
    assert fake_cmd.calls == [] and client.imports == []


def test_base_image_needs_root(fake_cmd: FakeCmd, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(BuildError) as err:
        make_base_image(engine=DockerEngine(FakeClient()))
    assert "sudo" in err.value.fix and fake_cmd.calls == []


def test_base_image_debootstraps_packs_and_imports(
    fake_cmd: FakeCmd, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)

    def fake(argv: tuple[str, ...], kw: dict[str, Any]) -> CmdResult:
        if argv[0] == "debootstrap":
            (Path(argv[-2]) / "var/cache/apt/archives").mkdir(parents=True)
            (Path(argv[-2]) / "var/cache/apt/archives/python3.deb").write_bytes(b"x")
        if argv[0] == "tar":
            Path(argv[argv.index("-cf") + 1]).write_bytes(b"tar")
        return CmdResult(argv, 0)

    fake_cmd.handler = fake
    client = FakeClient()
    spec = BaseImageSpec()
    image_id = make_base_image(force=True, engine=DockerEngine(client), spec=spec, workdir=tmp_path)
    debootstrap, tar = fake_cmd.calls
    assert debootstrap[:4] == (
        "debootstrap",
        "--variant=minbase",
        "--include=python3,python3-venv,python3-pip,ca-certificates",
        "bookworm",
    )
    assert tar[:2] == ("tar", "--numeric-owner")
    (imported,) = client.imports
    assert (imported["repository"], imported["tag"]) == ("mics-repro/base", "bookworm")
    assert any(c.startswith("ENV PATH=") for c in imported["changes"])
    assert image_id == "sha256:" + "c" * 64
    assert list(tmp_path.iterdir()) == []  # the rootfs and tarball are gone


def test_failed_debootstrap_cleans_up(
    fake_cmd: FakeCmd, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    fake_cmd.handler = lambda argv, kw: CmdResult(argv, 1)
    with pytest.raises(BuildError):
        make_base_image(force=True, engine=DockerEngine(FakeClient()), workdir=tmp_path)
    assert list(tmp_path.iterdir()) == []


# -- pass-through of the host's GPU selection and NCCL/RCCL/HSA settings ---------------------------
HOST_GPU_ENV = {
    "HIP_VISIBLE_DEVICES": "0,1",
    "ROCR_VISIBLE_DEVICES": "0,1,2,3",
    "CUDA_VISIBLE_DEVICES": "2",
    "NCCL_DEBUG": "INFO",
    "NCCL_SOCKET_IFNAME": "ib0",
    "RCCL_MSCCL_ENABLE": "0",
    "HSA_FORCE_FINE_GRAIN_PCIE": "1",
    "MIOPEN_USER_DB_PATH": "/scratch/miopen",
}
NOT_PASSED = {"AWS_SECRET_ACCESS_KEY": "x", "HOME": "/root", "NCCLX": "1", "MY_NCCL_DEBUG": "1"}


def test_passthrough_allowlist() -> None:
    from repro.engines.passthrough import PASSTHROUGH_VAR, passthrough, run_environment

    environ = {**HOST_GPU_ENV, **NOT_PASSED}
    assert passthrough(environ, "rocm") == dict(sorted(HOST_GPU_ENV.items()))
    assert passthrough(environ, "cuda") == passthrough(environ, "rocm")
    assert passthrough(environ, "cpu") == {}  # CPU runs never touch a GPU
    described = run_environment(environ, "rocm")
    assert json.loads(described.pop(PASSTHROUGH_VAR)) == HOST_GPU_ENV and described == HOST_GPU_ENV
    assert run_environment(environ, "cpu") == {PASSTHROUGH_VAR: "{}"}


@pytest.mark.parametrize("platform", ["rocm", "cuda", "cpu"])
def test_docker_run_passes_only_allowlisted_host_variables(
    docker_engine: DockerEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, platform: str
) -> None:
    for name, value in {**HOST_GPU_ENV, **NOT_PASSED}.items():
        monkeypatch.setenv(name, value)
    docker_engine.run_suite(_prepared(platform=platform), [], tmp_path / "out", timeout_s=None)
    (box,) = docker_engine.client.created
    environment = dict(box.kwargs["environment"])
    assert environment.pop("MICS_REPRO_OWNER_LOCK") == "/run/mics-repro-owner/owner.lock"  # issue 22
    described = json.loads(environment.pop("MICS_REPRO_PASSTHROUGH"))
    dropped = json.loads(environment.pop("MICS_REPRO_PASSTHROUGH_DROPPED", "{}"))
    # The suite's container has no network: the host's interface choice (ib0) is held back and said so.
    network = {"NCCL_SOCKET_IFNAME": "ib0"} if platform != "cpu" else {}
    expected = {k: v for k, v in HOST_GPU_ENV.items() if k not in network} if platform != "cpu" else {}
    assert environment == {"PYTHONUNBUFFERED": "1", **expected}
    assert described == expected and dropped == network


def test_a_container_runs_while_the_tool_holds_its_owner_lock(
    docker_engine: DockerEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22, item 6: the suite in the container follows a lock the tool holds (read-only bind)."""
    import fcntl

    held: list[bool] = []
    real_wait = ManagedContainer.wait

    def wait(box: ManagedContainer, timeout_s: float | None) -> tuple[int | None, bool]:
        (bind,) = [b for b in box.options.binds if b.endswith(":/run/mics-repro-owner:ro")]
        with open(Path(bind.split(":")[0]) / "owner.lock") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
        return real_wait(box, timeout_s)

    monkeypatch.setattr(ManagedContainer, "wait", wait)
    docker_engine.run_suite(_prepared(), [], tmp_path / "out", timeout_s=None)
    (box,) = docker_engine.client.created
    assert held == [True]
    assert box.kwargs["environment"]["MICS_REPRO_OWNER_LOCK"] == "/run/mics-repro-owner/owner.lock"


NETWORK_SETTINGS = {
    "NCCL_SOCKET_IFNAME": "ib0",
    "NCCL_SOCKET_FAMILY": "AF_INET",
    "NCCL_IB_HCA": "mlx5_0,mlx5_1",
    "NCCL_IB_GID_INDEX": "3",
    "NCCL_NET": "IB",
    "NCCL_NET_GDR_LEVEL": "PHB",
    "NCCL_CROSS_NIC": "1",
}
TUNING = {"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Ring", "RCCL_MSCCL_ENABLE": "0", "HIP_VISIBLE_DEVICES": "0,1"}


def test_networkless_runs_get_no_host_network_settings() -> None:
    from repro.engines.passthrough import DROPPED_VAR, PASSTHROUGH_VAR, run_environment, split

    environ = {**NETWORK_SETTINGS, **TUNING}
    passed, dropped = split(environ, "rocm", networkless=True)
    assert passed == TUNING and dropped == NETWORK_SETTINGS
    assert split(environ, "rocm") == (dict(sorted(environ.items())), {})  # host networking: all pass
    described = run_environment(environ, "cuda", networkless=True)
    assert json.loads(described[DROPPED_VAR]) == NETWORK_SETTINGS
    assert json.loads(described[PASSTHROUGH_VAR]) == TUNING
    assert DROPPED_VAR not in run_environment(environ, "cuda")


def test_docker_job_with_network_keeps_the_host_network_settings(
    docker_engine: DockerEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in NETWORK_SETTINGS.items():
        monkeypatch.setenv(name, value)
    docker_engine.run("sha256:" + "a" * 64, ["true"], tmp_path / "out", None, platform="rocm", network=True)
    (box,) = docker_engine.client.created
    # Docker's default network
    assert "network_mode" not in box.kwargs and "network_disabled" not in box.kwargs
    environment = dict(box.kwargs["environment"])
    assert all(environment[k] == v for k, v in NETWORK_SETTINGS.items())
    assert "MICS_REPRO_PASSTHROUGH_DROPPED" not in environment


def test_records_name_the_dropped_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.engines.passthrough import run_environment
    from repro.workload import device

    for name, value in run_environment(NETWORK_SETTINGS, "rocm", networkless=True).items():
        monkeypatch.setenv(name, value)
    assert device.ran_on("cpu", "gloo")["dropped_env"] == NETWORK_SETTINGS


def test_venv_run_names_the_passed_variables(
    venv_engine: VenvEngine, fake_cmd: FakeCmd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in HOST_GPU_ENV.items():
        monkeypatch.setenv(name, value)
    prepared = Prepared(EngineKind.VENV, "rocm56", "/v", "/v", True, {"platform": "rocm"})
    venv_engine.run_suite(prepared, ["--env", "rocm56"], tmp_path / "out", timeout_s=3)
    env = fake_cmd.kwargs[0]["env"]
    assert json.loads(env["MICS_REPRO_PASSTHROUGH"]) == HOST_GPU_ENV
    assert all(env[k] == v for k, v in HOST_GPU_ENV.items())


def test_records_carry_the_passed_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.engines.passthrough import run_environment
    from repro.workload import device

    described = run_environment(HOST_GPU_ENV, "rocm")["MICS_REPRO_PASSTHROUGH"]
    monkeypatch.setenv("MICS_REPRO_PASSTHROUGH", described)
    assert device.passed_env() == HOST_GPU_ENV
    assert device.ran_on("cpu", "gloo")["passed_env"] == HOST_GPU_ENV
    monkeypatch.setenv("MICS_REPRO_PASSTHROUGH", "not json")
    assert device.passed_env() == {}
    monkeypatch.delenv("MICS_REPRO_PASSTHROUGH")
    assert device.passed_env() == {}


@pytest.mark.parametrize(
    ("info", "flag"),
    [
        ({"Runtimes": {"nvidia": {}, "runc": {}}}, "gpus"),
        (
            {"Runtimes": {"runc": {}}, "DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=all"}]},
            "cdi",
        ),
    ],
)
def test_cuda_run_asks_for_gpus_the_way_the_daemon_serves_them(
    docker_engine: DockerEngine, tmp_path: Path, info: dict[str, Any], flag: str
) -> None:
    docker_engine.client.info_data = info
    docker_engine.run_suite(_prepared(platform="cuda"), [], tmp_path / "out", timeout_s=None)
    (box,) = docker_engine.client.created
    (request,) = box.kwargs["device_requests"]
    if flag == "gpus":
        assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    else:  # no NVIDIA runtime hook: --gpus could find no device driver; CDI names the GPUs
        assert request["Driver"] == "cdi" and request["DeviceIDs"] == ["nvidia.com/gpu=all"]
    assert box.kwargs["ipc_mode"] == "host"


def test_cdi_run_options_print_as_docker_run_flags() -> None:
    assert run_options("cuda", via_cdi=True).cli_pairs() == [
        ("--ipc", "host"),
        ("--device", "nvidia.com/gpu=all"),
    ]
    assert ("--gpus", "all") in run_options("cuda").cli_pairs()


def test_rocm_runtime_names_the_image_and_the_host_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from repro.workload import device

    (tmp_path / "opt" / "rocm" / ".info").mkdir(parents=True)
    (tmp_path / "opt" / "rocm" / ".info" / "version").write_text("5.6.0-67\n")
    monkeypatch.setenv("MICS_REPRO_HOST_ROCM", "6.2.1-112")
    assert device.rocm_runtime(str(tmp_path)) == {"container": "5.6.0-67", "host": "6.2.1-112"}
    monkeypatch.delenv("MICS_REPRO_HOST_ROCM")
    assert device.rocm_runtime(str(tmp_path / "none")) == {"container": None, "host": None}
