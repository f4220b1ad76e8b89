"""GPU preflight against fake hosts: /dev and /sys trees in tmp_path, scripted `nvidia-smi`, `docker info`
dicts. Every bad GPU-host situation has its own exit code and a message that names the fix."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from repro.core import cmd
from repro.core.cmd import CmdResult
from repro.core.errors import (
    ContainerGpuError,
    DevicePermissionError,
    DeviceUnavailableError,
    GpuArchError,
    GpuCountError,
    GpuDriverError,
    MissingToolError,
    ReproError,
    UsageError,
)
from repro.engines import preflight
from repro.engines.gpu_host import GpuHost
from repro.engines.preflight import DockerFacts
from repro.matrix import compat
from repro.matrix.schema import load_matrix
from tests.fixtures.stand_in_engine import RefusedEngine

MATRIX = load_matrix()
ROCM56, ROCM61, CUDA, CPU = (MATRIX.get(i) for i in ("rocm56", "rocm61", "cuda", "cpu"))
ME = os.geteuid()
MY_GID = os.getegid()
STRANGER = 4242  # a uid/gid this test process does not have


# -- fake hosts ------------------------------------------------------------------------------------
def amd_host(
    tmp_path: Path,
    arches: tuple[int, ...] | list[int] = (90008, 90008),
    *,
    renders: int | None = None,
    kfd: bool = True,
    mode: int = 0o666,
    **fields: Any,
) -> GpuHost:
    """An AMD node: /dev/kfd, /dev/dri/renderD*, and KFD topology with a CPU node (version 0) first."""
    dev, sys = tmp_path / "dev", tmp_path / "sys"
    (dev / "dri").mkdir(parents=True)
    if kfd:
        (dev / "kfd").write_text("")
        (dev / "kfd").chmod(mode)
    for i in range(len(arches) if renders is None else renders):
        node = dev / "dri" / f"renderD{128 + i}"
        node.write_text("")
        node.chmod(mode)
    nodes = sys / "class/kfd/kfd/topology/nodes"
    for i, version in enumerate([0, *arches]):
        (nodes / str(i)).mkdir(parents=True)
        (nodes / str(i) / "properties").write_text(
            f"cpu_cores_count {0 if version else 64}\nsimd_count {0 if not version else 480}\n"
            f"gfx_target_version {version}\ndrm_render_minor {128 + i - 1 if version else 0}\n"
        )
    return GpuHost(dev=dev, sys=sys, root=tmp_path, environ=fields.pop("environ", {}), **fields)


def bare_host(tmp_path: Path, **fields: Any) -> GpuHost:
    (tmp_path / "dev").mkdir(parents=True)
    (tmp_path / "sys").mkdir()
    return GpuHost(
        dev=tmp_path / "dev", sys=tmp_path / "sys", root=tmp_path, environ=fields.pop("environ", {}), **fields
    )


class Smi:
    """A scripted `nvidia-smi` behind the cmd seam: GPU rows, a failure, or not installed."""

    def __init__(self, rows: list[str] | None, fail: str | None = None) -> None:
        self.rows, self.fail = rows, fail
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Any, **kw: Any) -> CmdResult:
        args = tuple(map(str, argv))
        self.calls.append(args)
        assert args[0] == "nvidia-smi", args
        if self.rows is None:
            raise MissingToolError("nvidia-smi is not installed")
        if self.fail:
            return CmdResult(args, 9, stdout=self.fail + "\n")
        return CmdResult(args, 0, stdout="".join(r + "\n" for r in self.rows))


H200 = "0, NVIDIA H200, 550.54.15"


@pytest.fixture
def smi(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(rows: list[str] | None, fail: str | None = None) -> Smi:
        fake = Smi(rows, fail)
        monkeypatch.setattr(cmd, "run", fake)
        return fake

    return install


def raised(call: Any) -> ReproError:
    with pytest.raises(ReproError) as err:
        call()
    assert err.value.what and err.value.fix  # every refusal says what to do
    return err.value


# -- compat tables ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "name"),
    [
        (90008, "gfx908"),
        (90010, "gfx90a"),
        (90402, "gfx942"),
        (100300, "gfx1030"),
        (110000, "gfx1100"),
        (0, None),
    ],
)
def test_kfd_target_versions_name_the_arch(version: int, name: str | None) -> None:
    assert compat.gfx_name(version) == name


def test_wheel_arch_table_covers_the_instinct_generations() -> None:
    assert "gfx908" in compat.rocm_wheel_arches(
        "2.1.0", ROCM56.torch_index
    ) and "gfx90a" in compat.rocm_wheel_arches("2.1.0", ROCM56.torch_index)
    assert "gfx942" not in compat.rocm_wheel_arches("2.1.0", ROCM56.torch_index)
    assert "gfx942" in compat.rocm_wheel_arches(ROCM61.torch, ROCM61.torch_index)
    assert compat.cuda_driver_floor("12.1") == "525.60.13" and compat.cuda_driver_floor("11.8") == "450.80.02"


# -- ROCm --------------------------------------------------------------------------------------------
def test_mi100_host_passes_for_rocm56(tmp_path: Path) -> None:
    host = amd_host(tmp_path, uid=ME, gids=frozenset({MY_GID}))
    preflight.check_devices(ROCM56, host)
    assert preflight.gpu_count(ROCM56, host) == 2


@pytest.mark.parametrize("missing", ["kfd", "render"])
def test_rocm_without_device_nodes_exits_11(tmp_path: Path, missing: str) -> None:
    host = amd_host(tmp_path, kfd=missing != "kfd", renders=0 if missing == "render" else None)
    err = raised(lambda: preflight.check_devices(ROCM56, host))
    assert type(err) is DeviceUnavailableError and err.exit_code == 11
    assert ("kfd" in err.what) if missing == "kfd" else ("render node" in err.what)


def test_rocm_on_a_host_without_any_gpu_exits_11(tmp_path: Path) -> None:
    err = raised(lambda: preflight.check_devices(ROCM56, bare_host(tmp_path)))
    assert err.exit_code == 11 and "ENV=cpu" in err.fix
    assert preflight.host_can_run(ROCM56, bare_host(tmp_path / "b"))[0] is False


def test_venv_user_outside_the_render_group_exits_41(tmp_path: Path) -> None:
    # The nodes are 0660 and owned by this process's uid/gid; the host says the user is someone else.
    host = amd_host(
        tmp_path, mode=0o660, uid=STRANGER, gids=frozenset({STRANGER}), group_names={MY_GID: "render"}
    )
    err = raised(lambda: preflight.check_devices(ROCM56, host))
    assert isinstance(err, DevicePermissionError) and err.exit_code == 41
    assert "usermod -aG render" in err.fix and "ENGINE=docker" in err.fix
    assert "kfd" in err.what and "renderD128" in err.what


def test_group_membership_or_root_opens_the_nodes(tmp_path: Path) -> None:
    preflight.check_devices(
        ROCM56, amd_host(tmp_path / "a", mode=0o660, uid=STRANGER, gids=frozenset({STRANGER, MY_GID}))
    )
    preflight.check_devices(ROCM56, amd_host(tmp_path / "b", mode=0o600, uid=0, gids=frozenset({0})))


def test_docker_engine_does_not_need_the_user_in_the_group(tmp_path: Path) -> None:
    host = amd_host(tmp_path, mode=0o660, uid=STRANGER, gids=frozenset({STRANGER}))
    preflight.check_devices(ROCM56, host, DockerFacts(("runc",)))  # the container gets the GIDs


def test_mi300_with_a_rocm5_wheel_exits_42(tmp_path: Path) -> None:
    host = amd_host(tmp_path, [90402] * 8)
    err = raised(lambda: preflight.check_devices(ROCM56, host, DockerFacts(("runc",))))
    assert isinstance(err, GpuArchError) and err.exit_code == 42
    assert "gfx942" in err.what and "rocm61" in err.fix
    preflight.check_devices(ROCM61, host, DockerFacts(("runc",)))  # a ROCm 6 wheel has gfx942


def test_consumer_gpu_arch_is_refused_and_the_override_is_honoured(tmp_path: Path) -> None:
    host = amd_host(tmp_path, [110001])  # gfx1101, not in the ROCm 5.6 wheel
    assert isinstance(raised(lambda: preflight.check_devices(ROCM56, host, DockerFacts(()))), GpuArchError)
    overridden = replace(host, environ={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"})  # runs as gfx1100
    preflight.check_devices(ROCM56, overridden, DockerFacts(()))


def test_mixed_host_is_accepted_once_the_user_picks_gpus(tmp_path: Path) -> None:
    host = amd_host(tmp_path, [90008, 90402])
    err = raised(lambda: preflight.check_devices(ROCM56, host, DockerFacts(())))
    assert "HIP_VISIBLE_DEVICES" in err.fix
    preflight.check_devices(ROCM56, replace(host, environ={"HIP_VISIBLE_DEVICES": "0"}), DockerFacts(()))


def test_unreadable_topology_skips_only_the_arch_check(tmp_path: Path) -> None:
    host = amd_host(tmp_path, [90402])
    for props in (tmp_path / "sys").rglob("properties"):
        props.unlink()
    preflight.check_devices(ROCM56, host, DockerFacts(()))
    assert preflight.gpu_count(ROCM56, host) == 1  # counted from the render nodes instead


@pytest.mark.parametrize(
    ("environ", "count"),
    [
        ({}, 8),
        ({"HIP_VISIBLE_DEVICES": "0,1"}, 2),
        ({"ROCR_VISIBLE_DEVICES": "3"}, 1),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 4),
        # Empty, HIP_VISIBLE_DEVICES hides nothing (ROCm/hip#3001); ROCR_VISIBLE_DEVICES hides all.
        ({"HIP_VISIBLE_DEVICES": ""}, 8),
        ({"ROCR_VISIBLE_DEVICES": ""}, 0),
        ({"ROCR_VISIBLE_DEVICES": "0,1,2", "HIP_VISIBLE_DEVICES": "0,1"}, 2),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, 0),
        ({"HIP_VISIBLE_DEVICES": "0,1,-1,2"}, 2),
    ],
)
def test_rocm_gpu_count_follows_visibility(tmp_path: Path, environ: dict[str, str], count: int) -> None:
    assert preflight.gpu_count(ROCM56, amd_host(tmp_path, [90008] * 8, environ=environ)) == count


def test_world_size_above_the_gpu_count_exits_45(tmp_path: Path) -> None:
    host = amd_host(tmp_path, [90008] * 4)
    preflight.check_world_size(ROCM56, 4, host)
    preflight.check_world_size(ROCM56, None, host)
    err = raised(lambda: preflight.check_world_size(ROCM56, 8, host))
    assert isinstance(err, GpuCountError) and err.exit_code == 45
    assert "WORLD_SIZE=8" in err.what and "4 GPU" in err.what and "WORLD_SIZE=4" in err.fix


def test_cpu_envs_have_no_gpu_count_and_no_world_size_limit(tmp_path: Path) -> None:
    host = amd_host(tmp_path, [90008])
    assert preflight.gpu_count(CPU, host) is None
    preflight.check_world_size(CPU, 16, host)
    preflight.check_devices(CPU, bare_host(tmp_path / "b"))
    assert preflight.host_can_run(CPU, bare_host(tmp_path / "c")) == (True, "")


# -- CUDA --------------------------------------------------------------------------------------------
def test_h200_host_passes_with_the_nvidia_runtime(tmp_path: Path, smi: Any) -> None:
    fake = smi([H200, "1, NVIDIA H200, 550.54.15"])
    host = bare_host(tmp_path)
    preflight.check_devices(CUDA, host, DockerFacts(("nvidia", "runc")))
    preflight.check_devices(CUDA, host)  # venv engine: the driver is enough
    assert preflight.gpu_count(CUDA, host) == 2
    assert preflight.gpu_count(CUDA, replace(host, environ={"CUDA_VISIBLE_DEVICES": "1"})) == 1
    assert fake.calls[0][:2] == ("nvidia-smi", "--query-gpu=index,name,driver_version")


def test_cuda_without_driver_or_device_exits_11(tmp_path: Path, smi: Any) -> None:
    smi(None)
    err = raised(lambda: preflight.check_devices(CUDA, bare_host(tmp_path)))
    assert type(err) is DeviceUnavailableError and err.exit_code == 11


def test_nvidia_smi_that_cannot_reach_the_driver_exits_43(tmp_path: Path, smi: Any) -> None:
    smi([], fail="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    err = raised(lambda: preflight.check_devices(CUDA, bare_host(tmp_path)))
    assert isinstance(err, GpuDriverError) and err.exit_code == 43 and "couldn't communicate" in err.why


def test_driver_older_than_the_cuda_runtime_exits_43(tmp_path: Path, smi: Any) -> None:
    smi(["0, Tesla V100-SXM2-32GB, 470.182.03"])
    err = raised(lambda: preflight.check_devices(CUDA, bare_host(tmp_path), DockerFacts(("nvidia",))))
    assert isinstance(err, GpuDriverError) and err.exit_code == 43
    assert "470.182.03" in err.what and "525.60.13" in err.why and "530.30.02" in err.fix
    smi(["0, NVIDIA A100-SXM4-80GB, 525.60.13"])  # the CUDA 12 floor itself is enough
    preflight.check_devices(CUDA, bare_host(tmp_path / "b"), DockerFacts(("nvidia",)))


def test_no_gpu_listed_exits_11(tmp_path: Path, smi: Any) -> None:
    smi([])
    assert raised(lambda: preflight.check_devices(CUDA, bare_host(tmp_path))).exit_code == 11


@pytest.mark.parametrize(
    "facts",
    [
        DockerFacts(("io.containerd.runc.v2", "runc")),
        DockerFacts(("runc",), cdi_spec_dirs=("/etc/cdi", "/var/run/cdi")),  # CDI on, but no NVIDIA spec
    ],
)
def test_docker_daemon_without_nvidia_runtime_or_cdi_exits_44(
    tmp_path: Path, smi: Any, monkeypatch: pytest.MonkeyPatch, facts: DockerFacts
) -> None:
    smi([H200])
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("nvidia-ctk", "nvidia-container-runtime-hook"):  # on the client's PATH: proves nothing
        (tools / tool).write_text("#!/bin/sh\n")
        (tools / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    err = raised(lambda: preflight.check_devices(CUDA, bare_host(tmp_path), facts))
    assert isinstance(err, ContainerGpuError) and err.exit_code == 44
    assert "nvidia-ctk runtime configure" in err.fix and "ENGINE=venv" in err.fix


def test_cdi_specs_let_docker_pass_gpus(tmp_path: Path, smi: Any) -> None:
    smi([H200])
    host = bare_host(tmp_path)
    preflight.check_devices(CUDA, host, DockerFacts(("runc",), cdi_devices=("nvidia.com/gpu=all",)))
    (tmp_path / "etc/cdi").mkdir(parents=True)
    (tmp_path / "etc/cdi/nvidia.yaml").write_text('cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\n')
    preflight.check_devices(CUDA, host, DockerFacts(("runc",), cdi_spec_dirs=("/etc/cdi", "/var/run/cdi")))
    # Which way the engine then asks for the GPUs: --gpus with the runtime hook, else the CDI name.
    assert preflight.cuda_via_cdi(DockerFacts(("runc",), cdi_spec_dirs=("/etc/cdi",)), host)
    assert not preflight.cuda_via_cdi(DockerFacts(("nvidia", "runc"), cdi_spec_dirs=("/etc/cdi",)), host)
    assert not preflight.cuda_via_cdi(DockerFacts(("runc",), cdi_spec_dirs=("/nowhere",)), host)


def test_docker_facts_from_info() -> None:
    facts = DockerFacts.from_info(
        {
            "Runtimes": {"runc": {}, "nvidia": {}},
            "CDISpecDirs": ["/etc/cdi"],
            "DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=0"}],
        }
    )
    assert facts.runtimes == ("nvidia", "runc") and facts.cdi_spec_dirs == ("/etc/cdi",)
    assert facts.cdi_devices == ("nvidia.com/gpu=0",)
    assert DockerFacts.from_info({}) == DockerFacts(())


def test_gpu_preflight_exit_codes_are_distinct() -> None:
    kinds = (
        DeviceUnavailableError,
        DevicePermissionError,
        GpuArchError,
        GpuDriverError,
        ContainerGpuError,
        GpuCountError,
    )
    assert len({k.exit_code for k in kinds}) == len(kinds)
    assert all(issubclass(k, DeviceUnavailableError) for k in kinds)


def test_orchestrator_refuses_world_size_above_the_gpus_before_preparing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from repro.run import orchestrate

    monkeypatch.setattr(preflight, "gpu_count", lambda env, host=None: 2)

    engine = RefusedEngine()  # nothing may be built after a refused preflight
    step = orchestrate.Step(ROCM56, ("--env", "rocm56", "--world-size", "4"))
    with pytest.raises(GpuCountError):
        orchestrate.execute([step], engine, invocation=Any)
    assert "prepare" not in engine.calls
    assert orchestrate._world_size(("--env", "cpu")) is None


def test_cpu_env_refuses_a_single_rank_before_any_build(tmp_path: Path) -> None:
    # The control cannot run with one rank on DeepSpeed's CPU accelerator (measured: it crashes in
    # ZeRO-3's single-rank wait), so WORLD_SIZE=1 is a GPU-host layout only.
    host = amd_host(tmp_path, [90008])
    err = raised(lambda: preflight.check_world_size(CPU, 1, host))
    assert isinstance(err, UsageError) and err.exit_code == 2 and "WORLD_SIZE=1" in err.what
    preflight.check_world_size(CPU, 2, host)
    preflight.check_world_size(ROCM56, 1, host)
