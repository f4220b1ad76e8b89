"""Docker tier: the Docker engine against a real daemon.

Needs a running Docker engine (.ci/start-docker.sh) and the local base image (`make base-image`);
skips with the reason otherwise. Images here are tiny (FROM the local base, no pip), so the tier
takes seconds once the base exists. The full torch image is built only with
MICS_REPRO_TEST_FULL_IMAGE=1 (minutes, gigabytes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repro.engines.base import Prepared
from repro.engines.docker.base_image import BASE_IMAGE_REF
from repro.engines.docker.engine import LABEL_OWNER, DockerEngine, ManagedContainer, daemon_status
from repro.engines.wheelhouse import Wheelhouse
from repro.matrix.model import Env, Platform

pytestmark = pytest.mark.docker

TINY_DOCKERFILE = """ARG BASE_IMAGE=mics-repro/base:bookworm
FROM ${BASE_IMAGE}
ARG PIP_FIND_LINKS=
# Proves the build reached the wheelhouse served on the host's loopback (host networking).
RUN python3 -c "import sys, urllib.request; \\
open('/opt/listing.html', 'wb').write(urllib.request.urlopen(sys.argv[1]).read())" "$PIP_FIND_LINKS"
COPY repro/__init__.py /opt/src/repro/__init__.py
COPY repro/workload/ /opt/src/repro/workload/
ENV PYTHONPATH=/opt/src
RUN ln -s /usr/bin/python3 /usr/local/bin/python && mkdir -p /results
WORKDIR /results
"""

# A stand-in suite: writes a result, reports whether the network is reachable, can fail or hang.
TINY_SUITE = """import json, os, socket, sys, time
args = sys.argv[1:]
out = args[args.index("--out") + 1]
mode = args[args.index("--mode") + 1] if "--mode" in args else "ok"
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3).close()
    network = True
except OSError:
    network = False
try:  # what accelerate's port check and a rendezvous on "localhost" need, network or not
    server = socket.socket()
    server.bind(("localhost", 0))
    server.listen(1)
    socket.create_connection(("localhost", server.getsockname()[1]), timeout=3).close()
    localhost = True
except OSError as exc:  # socket.gaierror is one
    localhost = f"{type(exc).__name__}: {exc}"
os.makedirs(os.path.join(out, "runs", "r1"), exist_ok=True)
with open(os.path.join(out, "runs", "r1", "rank0.log"), "w") as f:
    f.write("rank 0\\n")
with open(os.path.join(out, "suite.json"), "w") as f:
    listing = open("/opt/listing.html").read()
    json.dump({"runs": [], "network": network, "localhost": localhost, "listing": listing}, f)
print("suite done", flush=True)
if mode == "hang":
    time.sleep(3600)
sys.exit(3 if mode == "fail" else 0)
"""


@pytest.fixture(scope="module")
def client() -> Any:
    up, reason = daemon_status()
    if not up:
        pytest.skip(f"needs a Docker daemon: {reason} (start one with .ci/start-docker.sh)")
    engine = DockerEngine.connect()
    if engine.image_labels(BASE_IMAGE_REF) is None:
        pytest.skip(f"needs the local base image {BASE_IMAGE_REF}: run `make base-image`")
    return engine.client


class NoDownloadWheelhouse(Wheelhouse):
    """Served as it is, without filling it first (so the indexes stay on)."""

    def ensure(self, env: Any) -> bool:
        return False


@pytest.fixture(scope="module")
def tiny(
    client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[DockerEngine, Env, Prepared]]:
    root = tmp_path_factory.mktemp("repo")
    (root / "docker").mkdir()
    (root / "docker" / "tiny.Dockerfile").write_text(TINY_DOCKERFILE)
    (root / "repro" / "workload").mkdir(parents=True)
    (root / "repro" / "__init__.py").write_text("")
    (root / "repro" / "workload" / "__init__.py").write_text("")
    (root / "repro" / "workload" / "suite.py").write_text(TINY_SUITE)
    wheels = tmp_path_factory.mktemp("wheels")
    (wheels / "tiny-1.0-py3-none-any.whl").write_bytes(b"")
    env = Env(
        id=f"dockertest-{uuid.uuid4().hex[:6]}",
        platform=Platform.CPU,
        base_image=BASE_IMAGE_REF,
        python="3.11",
        torch="2.1.0",
        torch_index=None,
        deepspeed="0.13.1",
        extra_pins=(),
        rocm=None,
        cuda=None,
        notes="",
        derived_from=None,
        dockerfile="docker/tiny.Dockerfile",
    )
    engine = DockerEngine(
        client,
        repo_root=root,
        wheelhouse=NoDownloadWheelhouse(wheels, offline=False),
        log_dir=tmp_path_factory.mktemp("logs"),
        build_args={},
    )
    # Nothing in this image talks TLS, so its build gets no CA bundle. Only for this build: the
    # fixture lives for the whole module, and the stand-in build later in it needs the host's bundle
    # to reach PyPI through an intercepting proxy (a module-long override broke it once its layers
    # were no longer cached).
    saved_ca = os.environ.get("MICS_REPRO_CA_BUNDLE")
    os.environ["MICS_REPRO_CA_BUNDLE"] = "none"
    try:
        prepared = engine.prepare(env)
    finally:
        if saved_ca is None:
            os.environ.pop("MICS_REPRO_CA_BUNDLE", None)
        else:
            os.environ["MICS_REPRO_CA_BUNDLE"] = saved_ca
    try:
        yield engine, env, prepared
    finally:
        client.images.remove(env.image_tag(), force=True)


def _leftovers(client: Any, env: Env) -> list[str]:
    names = [c.name for c in _containers(client, label="mics-repro")]
    return [n for n in names if n.startswith(f"mics-repro-{env.id}-")]


def test_build_reached_the_wheelhouse_and_is_reused(
    tiny: tuple[DockerEngine, Env, Prepared], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, env, prepared = tiny
    assert not prepared.reused and prepared.handle.startswith("sha256:")
    monkeypatch.setenv("MICS_REPRO_CA_BUNDLE", "none")  # the same context as the fixture's build
    assert engine.prepare(env).reused


def test_suite_runs_offline_and_results_are_copied_out(
    tiny: tuple[DockerEngine, Env, Prepared], tmp_path: Path
) -> None:
    import json

    engine, env, prepared = tiny
    run = engine.run_suite(prepared, ["--env", env.id], tmp_path / "out", timeout_s=300)
    assert run.exit_code == 0 and not run.timed_out
    suite = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert suite["network"] is False
    assert suite["localhost"] is True  # offline, yet the loopback and /etc/hosts are there
    assert "tiny-1.0-py3-none-any.whl" in suite["listing"]
    assert (tmp_path / "out" / "runs" / "r1" / "rank0.log").read_text() == "rank 0\n"
    assert "suite done" in (tmp_path / "out" / "engine.log").read_text()
    assert _leftovers(engine.client, env) == []


def test_failing_suite_reports_its_exit_code(
    tiny: tuple[DockerEngine, Env, Prepared], tmp_path: Path
) -> None:
    engine, env, prepared = tiny
    run = engine.run_suite(prepared, ["--mode", "fail"], tmp_path / "out", timeout_s=300)
    assert run.exit_code == 3 and not run.ok
    assert _leftovers(engine.client, env) == []


def test_hung_suite_times_out_as_a_result(tiny: tuple[DockerEngine, Env, Prepared], tmp_path: Path) -> None:
    engine, env, prepared = tiny
    run = engine.run_suite(prepared, ["--mode", "hang"], tmp_path / "out", timeout_s=8)
    assert run.timed_out and run.exit_code == 124
    assert (tmp_path / "out" / "suite.json").exists()  # what it wrote before hanging came out
    assert _leftovers(engine.client, env) == []


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_running_container_is_removed_when_the_run_raises(
    tiny: tuple[DockerEngine, Env, Prepared],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    error: type[BaseException],
) -> None:
    engine, env, prepared = tiny

    def interrupted(self: ManagedContainer, timeout_s: float | None) -> tuple[int | None, bool]:
        self.container.reload()
        assert self.container.status == "running"  # the container is live when the error hits
        raise error("raised while waiting for the suite")

    monkeypatch.setattr(ManagedContainer, "wait", interrupted)
    with pytest.raises(error):
        engine.run_suite(prepared, ["--mode", "hang"], tmp_path / "out", timeout_s=300)
    assert _leftovers(engine.client, env) == []


# A run's tool, in a process of its own so that a test can signal it: runs a stand-in suite that,
# like the real one (repro/workload/parentwatch.py), waits on the owner lock and ends when it is free.
_TOOL = """
import signal, sys
from pathlib import Path
from repro.core.signals import install_stop_handlers
from repro.engines.docker.engine import DockerEngine
signal.signal(signal.SIGINT, signal.default_int_handler)
install_stop_handlers()
watch = ("import fcntl, os, sys; print('ready', flush=True); "
         "fcntl.flock(open(os.environ['MICS_REPRO_OWNER_LOCK']), fcntl.LOCK_EX); sys.exit(143)")
try:
    DockerEngine.connect().run(BASE, ["python3", "-c", watch], Path(sys.argv[1]), None, name_hint=sys.argv[2])
except KeyboardInterrupt:
    sys.exit(130)
"""


def _containers(client: Any, **filters: str) -> list[Any]:
    """`docker ps -a --filter ...`. docker-py lists, then inspects each container: one removed in
    between (a run's own clean-up) is gone, not an error."""
    return list(client.containers.list(all=True, filters=filters, ignore_removed=True))


def _poll(check: Any, bound_s: float = 120) -> Any:
    deadline = time.monotonic() + bound_s  # bounds a failure only
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    return check()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_no_container_of_a_run_outlives_its_tool(
    client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    """Interrupted, the tool removes its container itself; SIGKILLed, it cannot, and the next
    start removes the stopped container its run left (issue 22, item 6)."""
    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MICS_REPRO_KEEP_CONTAINER", raising=False)
    hint = f"outlive-{uuid.uuid4().hex[:6]}"
    code = _TOOL.replace("BASE", repr(BASE_IMAGE_REF))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    tool = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "out"), hint], env=env)
    try:
        (box,) = _poll(
            lambda: [c for c in _containers(client, name=f"mics-repro-{hint}-") if c.status == "running"]
        )
        owner = box.labels[LABEL_OWNER]
        log = tmp_path / "out" / "engine.log"
        assert _poll(lambda: log.exists() and "ready" in log.read_text(errors="replace"))
        tool.send_signal(sig)
        rc = tool.wait()
        if sig is signal.SIGKILL:
            # The stand-in suite saw its owner go and ended; the container stays, stopped ...
            assert _poll(
                lambda: [
                    c for c in _containers(client, label=f"{LABEL_OWNER}={owner}") if c.status == "exited"
                ]
            )
            # ... until the next start of a run.
            next_run = DockerEngine(client).run(
                BASE_IMAGE_REF, ["true"], tmp_path / "next", 120, name_hint=hint
            )
            assert next_run.exit_code == 0
        else:
            assert rc == 130
        assert _containers(client, label=f"{LABEL_OWNER}={owner}") == []
        assert _containers(client, name=f"mics-repro-{hint}-") == []
        assert not Path(owner).exists()  # nor its owner folder
    finally:
        if tool.poll() is None:
            tool.kill()
            tool.wait()
        for leftover in _containers(client, name=f"mics-repro-{hint}-"):
            leftover.remove(force=True)


def test_bad_inputs_leave_no_container(tiny: tuple[DockerEngine, Env, Prepared], tmp_path: Path) -> None:
    import docker.errors

    engine, env, prepared = tiny
    with pytest.raises(docker.errors.ImageNotFound):
        engine.run("mics-repro/no-such-image:never", ["true"], tmp_path / "a", 60, name_hint=env.id)
    # The init process reports a missing executable as exit status 127, like a shell would.
    run = engine.run(prepared.handle, ["/no/such/binary"], tmp_path / "b", 60, name_hint=env.id)
    assert run.exit_code == 127 and not run.ok
    assert _leftovers(engine.client, env) == []


@pytest.mark.optional
@pytest.mark.skipif(
    os.environ.get("MICS_REPRO_TEST_FULL_IMAGE") != "1",
    reason="builds the full torch image (minutes, ~5 GB): set MICS_REPRO_TEST_FULL_IMAGE=1",
)
def test_full_cpu_image_imports_torch_and_deepspeed_offline(client: Any, tmp_path: Path) -> None:
    from repro.matrix.schema import load_matrix

    env = load_matrix().get("cpu")
    engine = DockerEngine(client, base_image=os.environ.get("MICS_REPRO_BASE_IMAGE") or BASE_IMAGE_REF)
    prepared = engine.prepare(env)
    probe = (
        "import socket, torch, deepspeed\n"
        "print('versions', torch.__version__, deepspeed.__version__)\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=3); print('network on')\n"
        "except OSError:\n    print('network off')\n"
    )
    run = engine.run(prepared.handle, ["python", "-c", probe], tmp_path, 600, name_hint="fullimage")
    log = (tmp_path / "engine.log").read_text()
    assert run.exit_code == 0, log
    assert f"versions {env.torch}" in log and env.deepspeed in log
    assert "network off" in log


# Build args that turn a GPU env's Dockerfile into a stand-in build on the local Debian base: no
# distro Python to install, the base's python3, torch from PyPI (the GPU wheel indexes are not
# reachable here). MICS_REPRO_BUILD_ARGS overrides them.
STAND_IN_ARGS = {"OS_PACKAGES": "", "PYTHON": "python3", "TORCH_INDEX_URL": "https://pypi.org/simple"}


def keep_as_stand_in(client: Any, env_id: str, tag: str) -> None:
    """Move `tag` to `mics-repro/standin:<env>` (replacing the older stand-in of that env)."""
    from repro.engines.docker.standin import STAND_IN_REPOSITORY

    image = client.images.get(tag)
    name = f"{STAND_IN_REPOSITORY}:{env_id}"
    try:
        old = client.images.get(name)
    except Exception:  # docker.errors.ImageNotFound: the first stand-in build of this env
        old = None
    image.tag(STAND_IN_REPOSITORY, tag=env_id)
    client.images.remove(tag)  # an untag: the image lives on under the stand-in name
    if old is not None and old.id != image.id:
        client.images.remove(old.id, force=True)


@pytest.mark.optional
@pytest.mark.skipif(
    not os.environ.get("MICS_REPRO_TEST_STANDIN"),
    reason="stand-in build of a GPU env's Dockerfile (minutes, ~5 GB): set "
    "MICS_REPRO_TEST_STANDIN to an env id, e.g. rocm56",
)
def test_gpu_dockerfile_builds_on_a_stand_in_base(client: Any, tmp_path: Path) -> None:
    from repro.engines.docker.build_context import parse_build_args
    from repro.matrix.schema import load_matrix

    env = load_matrix().get(os.environ["MICS_REPRO_TEST_STANDIN"])
    # PyPI has no labelled torch builds: the stand-in names PyPI's own build of the env's release.
    standin = {**STAND_IN_ARGS, "TORCH_SPEC": f"torch=={env.torch}"}
    args = {**standin, **parse_build_args(os.environ.get("MICS_REPRO_BUILD_ARGS", ""))}
    # The GPU wheel index is unreachable, so nothing is pre-fetched for it; the build still gets
    # every wheel the wheelhouse has over 127.0.0.1.
    engine = DockerEngine(
        client, base_image=BASE_IMAGE_REF, build_args=args, wheelhouse=NoDownloadWheelhouse(offline=False)
    )
    prepared = engine.prepare(env)
    # The GPU Dockerfiles' first RUN parks vendor apt sources; on the Debian base it must run and
    # find nothing (the build would have stopped otherwise), leaving the script in the image.
    probe = (
        "import os, torch, deepspeed; print('versions', torch.__version__, deepspeed.__version__); "
        "print('vendor-apt', os.path.isfile('/opt/mics-repro/disable-vendor-apt.sh'), "
        "os.path.exists('/etc/apt/vendor-sources.disabled'))"
    )
    try:
        run = engine.run(prepared.handle, ["python", "-c", probe], tmp_path, 600, name_hint="standin")
    finally:
        # It carries the real env's tag but not its stack: that tag must not outlive the test. Its
        # layers stay under a stand-in tag (make clean removes those), so the next run of this
        # test rebuilds the same Dockerfile from Docker's layer cache in seconds, not 5 minutes;
        # a changed Dockerfile or build argument misses the cache and builds for real.
        keep_as_stand_in(client, env.id, env.image_tag())
    log = (tmp_path / "engine.log").read_text()
    assert run.exit_code == 0, log
    assert f"versions {env.torch}" in log and env.deepspeed in log
    if env.platform is not Platform.CPU:
        assert "vendor-apt True False" in log, log
