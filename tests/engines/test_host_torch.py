"""torch_from = "host": an env whose torch is the host Python's own (an air-gapped or HPC GPU host),
and gpu-check running such an env from a custom matrix (MATRIX=). Unit tier: no process starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from repro.cli import main as cli
from repro.core.errors import MatrixError, UsageError
from repro.engines.docker.engine import refuse_host_torch
from repro.engines.venv import host_torch
from repro.engines.wheelhouse import DownloadPlan
from repro.matrix.schema import load_matrix
from tests.fixtures.fake_gpu_device import (
    H200,
    FakeDevice,
    fake,  # noqa: F401 - a fixture
    run_check,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "env_matrix" / "examples" / "host-torch.toml"


def _with_env(tmp_path: Path, body: str) -> Path:
    text = EXAMPLE.read_text()
    cut = text.index("[env.cuda-host-t211]")
    path = tmp_path / "m.toml"
    path.write_text(text[:cut] + body)
    return path


def test_the_example_env_takes_torch_from_the_host_and_installs_the_rest() -> None:
    env = load_matrix(EXAMPLE).get("cuda-host-t211")
    assert env.host_torch and env.python == "3.12"
    steps = {s.name: s.specs for s in env.install_steps()}
    assert steps["torch"] == ()  # the host's torch is checked, never installed
    assert "deepspeed==0.19.6" in steps["deepspeed"] and "nvidia-ml-py==13.615.71" in steps["deepspeed-deps"]
    pins = env.pins()
    assert (
        pins["torch_from"] == "host" and pins["torch_build"] == "2.11.0+cu130" and pins["torch"] == "2.11.0"
    )
    wanted = DownloadPlan.for_env(env, "3.12").pinned()
    assert not any(s.startswith(("torch", "numpy")) for s in wanted)  # the wheelhouse needs neither


def test_envs_from_an_index_keep_their_pins() -> None:
    for env_id in load_matrix().ids():
        env = load_matrix().get(env_id)
        assert not env.host_torch and "torch_from" not in env.pins()
        assert any(
            s.startswith("torch") for s in next(s for s in env.install_steps() if s.name == "torch").specs
        )


def test_torch_from_is_checked(tmp_path: Path) -> None:
    body = (
        '[env.x]\nplatform = "cuda"\nbase_image = "ubuntu:24.04"\npython = "3.12"\ntorch = "2.11.0"\n'
        'torch_index = "https://download.pytorch.org/whl/cu130"\ndeepspeed = "0.19.6"\ncuda = "13.0"\n'
        'notes = "n"\n'
    )
    with pytest.raises(MatrixError) as bad:
        load_matrix(_with_env(tmp_path, body + 'torch_from = "hots"\n'))
    assert "torch_from" in bad.value.why and "host" in bad.value.why
    with pytest.raises(MatrixError) as extra:
        load_matrix(_with_env(tmp_path, body + 'torch_from = "host"\nextra_pins = ["einops==0.8.2"]\n'))
    assert "extra_pins" in extra.value.why


def test_docker_refuses_a_host_torch_env() -> None:
    with pytest.raises(UsageError, match="ENGINE=venv"):
        refuse_host_torch(load_matrix(EXAMPLE).get("cuda-host-t211"))
    refuse_host_torch(load_matrix().get("cuda"))  # an index env builds an image as before


def test_pip_check_fails_on_our_pins_and_notes_the_hosts_own() -> None:
    text = (
        "transformers 5.0.0 has requirement huggingface-hub<2.0,>=1.0, but you have huggingface-hub 0.3.\n"
        "accelerate 1.2.0 has requirement packaging>=27, but you have packaging 26.4.\n"
        "deepspeed 0.19.6 requires hjson, which is not installed.\n"
    )
    fatal, noted = host_torch.foreign_complaints(text, ["packaging", "hjson", "deepspeed"])
    assert [line.split()[0] for line in fatal] == ["accelerate", "deepspeed"]
    assert [line.split()[0] for line in noted] == ["transformers"]


def test_the_venv_links_the_host_sites_after_its_own(tmp_path: Path) -> None:
    purelib = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    host_torch.link_host(purelib, ["/opt/torch/.venv/lib/python3.12/site-packages"])
    assert host_torch.linked_sites(tmp_path / "venv") == ["/opt/torch/.venv/lib/python3.12/site-packages"]


class _Recording(FakeDevice):
    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.argv: list[list[str]] = []

    def cli(self, args: Any, hide_gpus: bool, timeout_s: float) -> int:
        self.argv.append(list(args))
        return super().cli(args, hide_gpus, timeout_s)


def test_gpu_check_hands_its_matrix_to_repro_and_check_fix(fake: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    device = _Recording(H200)
    code, data = run_check(fake, device, tmp_path, "--matrix", str(EXAMPLE), "--env", "cuda-host-t211")
    assert data["env"] == "cuda-host-t211" and code == 0
    assert len(device.argv) == 2  # repro, then check-fix with the GPUs hidden
    for argv in device.argv:
        assert argv[argv.index("--matrix") + 1] == str(EXAMPLE), argv
        assert argv[argv.index("--env") + 1] == "cuda-host-t211"


def test_list_reads_the_example_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--matrix", str(EXAMPLE)]) == 0
    assert "cuda-host-t211" in capsys.readouterr().out


def _dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text("")
    info.mkdir()
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/RECORD,,\n")


def test_a_host_torch_venv_is_whole_with_the_hosts_torch(tmp_path: Path) -> None:
    from repro.engines.venv import intact
    from repro.engines.venv.engine import VenvEngine, VenvMarker

    host = tmp_path / "host" / "lib" / "python3.12" / "site-packages"
    _dist(host, "torch", "2.11.0+cu130")
    venv = tmp_path / "venv"
    own = venv / "lib" / "python3.12" / "site-packages"
    _dist(own, "deepspeed", "0.19.6")
    host_torch.link_host(own, [str(host)])
    marker = VenvMarker("cuda-host-t211", {"torch_from": "host"}, "3.12")
    # Reused, not rebuilt on every command (the rehearsal rebuilt it: "torch is not installed in it").
    assert intact.damage(VenvEngine._sites(venv, marker)) is None
    (host / "torch" / "__init__.py").unlink()
    assert "torch/__init__.py" in (intact.damage(VenvEngine._sites(venv, marker)) or "")
