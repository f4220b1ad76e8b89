"""What gpu-check does to the machine, behind one small interface (`Device`), so the whole command
runs in the default test tier with a fake device.

`HostDevice` is the real one: host facts from /dev, /sys and `nvidia-smi` (repro.engines.gpu_host),
the venv through the venv engine, and every process through repro.core.cmd: the probes and the
MiCS smoke run start the env's own Python, `repro`/`check-fix` start this tool again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict

from repro.core import cmd
from repro.core.errors import MissingToolError
from repro.engines.gpu_host import CUDA_VISIBILITY, ROCM_VISIBILITY, GpuHost, visible_count
from repro.engines.venv.engine import VenvEngine
from repro.workload.device import hide_gpus_env

if TYPE_CHECKING:
    from repro.engines.base import Prepared
    from repro.matrix.model import Env

PROBE_MODULE = "repro.workload.gpucheck"
TRAIN_MODULE = "repro.workload.train"
HIDE_ALL = hide_gpus_env()
ROCM_VERSION_FILE = "opt/rocm/.info/version"


# What the host's GPUs are (gpu-check.json's `host`).
class HostFacts(TypedDict):
    platform: str | None  # cuda | rocm, None: no GPU found
    gpus: list[dict[str, str]]  # {"index", "name", "driver", "arch"}, as far as the host tells
    driver: str | None
    visible: int  # the GPUs *_VISIBLE_DEVICES leave
    host_rocm: str | None  # /opt/rocm/.info/version
    visibility: dict[str, str]  # the ROCm *_VISIBLE_DEVICES variables set


class Device(Protocol):
    def host_facts(self) -> HostFacts: ...

    def prepare(self, env: Env) -> Prepared: ...

    def probe(self, prepared: Prepared, probe: str, out: Path, timeout_s: float) -> int: ...

    def smoke(self, prepared: Prepared, argv: Sequence[str], run_dir: Path, timeout_s: float) -> int: ...

    def cli(self, args: Sequence[str], hide_gpus: bool, timeout_s: float) -> int: ...


def _read_first_line(path: Path) -> str | None:
    try:
        return path.read_text().splitlines()[0].strip() or None
    except (OSError, IndexError):
        return None


class HostDevice:
    def __init__(self, host: GpuHost | None = None, engine: VenvEngine | None = None) -> None:
        self.host = host or GpuHost()
        self.engine = engine or VenvEngine()

    # -- facts -----------------------------------------------------------------------------------
    def host_facts(self) -> HostFacts:
        """GPUs (name, arch / compute capability), driver, runtime and what *_VISIBLE_DEVICES leave."""
        environ = self.host.env()
        facts: HostFacts = {
            "platform": None,
            "gpus": [],
            "driver": None,
            "visible": 0,
            "host_rocm": _read_first_line(self.host.root / ROCM_VERSION_FILE),
            "visibility": {k: environ[k] for k in ROCM_VISIBILITY if k in environ},
        }
        nvidia = self._nvidia()
        if nvidia:
            facts.update({"platform": "cuda", "gpus": nvidia, "driver": nvidia[0].get("driver")})
            facts["visible"] = visible_count(len(nvidia), environ, CUDA_VISIBILITY)
            return facts
        arches = self.host.gfx_arches()
        if arches:
            facts.update(
                {
                    "platform": "rocm",
                    "gpus": [{"index": str(i), "arch": a} for i, a in enumerate(arches)],
                    "driver": _read_first_line(self.host.sys / "module" / "amdgpu" / "version"),
                }
            )
            facts["visible"] = visible_count(len(arches), environ, ROCM_VISIBILITY)
        return facts

    def _nvidia(self) -> list[dict[str, str]]:
        argv = ["nvidia-smi", "--query-gpu=index,name,driver_version,compute_cap", "--format=csv,noheader"]
        try:
            done = cmd.run(argv, capture=True, timeout_s=60, echo=False)
        except MissingToolError:
            return []
        if not done.ok:  # drivers before compute_cap existed: the plain query
            smi = self.host.nvidia_smi()
            return [{"index": g.index, "name": g.name, "driver": g.driver} for g in smi.gpus]
        gpus = []
        for line in (done.stdout or "").splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 4 and parts[0].isdigit():
                gpus.append(
                    {
                        "index": parts[0],
                        "name": ", ".join(parts[1:-2]),
                        "driver": parts[-2],
                        "arch": f"sm_{parts[-1].replace('.', '')}",
                    }
                )
        return gpus

    # -- the env -----------------------------------------------------------------------------------
    def prepare(self, env: Env) -> Prepared:
        self.engine.preflight(env)
        return self.engine.prepare(env)

    def _in_env(self, prepared: Prepared) -> tuple[str, dict[str, str]]:
        python = str(Path(prepared.handle) / "bin" / "python")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = str(self.engine.repo_root)  # the repo's workload, not the host's packages
        return python, env

    def probe(self, prepared: Prepared, probe: str, out: Path, timeout_s: float) -> int:
        python, env = self._in_env(prepared)
        argv = [python, "-m", PROBE_MODULE, probe, "--device", "gpu", "--out", str(out)]
        return cmd.run(argv, env=env, timeout_s=timeout_s, tee=out.with_suffix(".log")).returncode

    def smoke(self, prepared: Prepared, argv: Sequence[str], run_dir: Path, timeout_s: float) -> int:
        """One rank of the training workload under torchrun, as the cluster scripts start it."""
        python, env = self._in_env(prepared)
        env.update(NDEV_PER_NODE="1", PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
        launch = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
        launch += ["-m", TRAIN_MODULE, *argv]
        return cmd.run(launch, env=env, timeout_s=timeout_s, tee=run_dir / "train.log").returncode

    def cli(self, args: Sequence[str], hide_gpus: bool, timeout_s: float) -> int:
        """This tool again (`python -m repro ...`), with the GPUs hidden when asked."""
        argv = [sys.executable, "-m", "repro", *args]
        return cmd.run(argv, extra_env=HIDE_ALL if hide_gpus else None, timeout_s=timeout_s).returncode
