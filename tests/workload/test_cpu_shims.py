"""The placeholder modules DeepSpeed < 0.14.1 needs on CPU (stdlib only; no torch/DeepSpeed)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator

import pytest

from repro.workload.cpu import shims as cpu_shims


@pytest.fixture
def clean_import_state() -> Iterator[None]:
    meta_path = list(sys.meta_path)
    yield
    sys.meta_path[:] = meta_path
    for name in cpu_shims.PLACEHOLDER_MODULES:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("version", ["0.13.1", "0.14.0", "0.12.6+abc123"])
def test_old_deepspeed_gets_importable_placeholders(version: str, clean_import_state: None) -> None:
    missing = [n for n in cpu_shims.PLACEHOLDER_MODULES if importlib.util.find_spec(n) is None]
    if not missing:
        pytest.skip("the real IPEX/oneCCL are installed here; nothing to stand in for")
    assert cpu_shims.install_placeholders(version) == missing
    for name in missing:
        module = importlib.import_module(name)
        assert module.__dict__["__repro_placeholder__"] is True
        assert "placeholder" in (module.__doc__ or "")


@pytest.mark.parametrize("version", ["0.14.1", "0.19.6", "1.0.0", None])
def test_new_or_absent_deepspeed_gets_nothing(version: str | None, clean_import_state: None) -> None:
    before = list(sys.meta_path)
    assert cpu_shims.install_placeholders(version) == []
    assert sys.meta_path == before


def test_placeholders_are_installed_once(clean_import_state: None) -> None:
    cpu_shims.install_placeholders("0.13.1")
    cpu_shims.install_placeholders("0.13.1")
    finders = [f for f in sys.meta_path if type(f).__name__ == "_PlaceholderFinder"]
    assert len(finders) <= 1


def test_placeholder_finder_comes_last_so_real_modules_win(clean_import_state: None) -> None:
    if cpu_shims.install_placeholders("0.13.1"):
        assert type(sys.meta_path[-1]).__name__ == "_PlaceholderFinder"
    # an unrelated name is never answered by the placeholder finder
    assert importlib.util.find_spec("surely_not_a_module_xyz") is None


def test_a_second_call_reports_the_same_placeholders(clean_import_state: None) -> None:
    # A rank forked from the pre-imported launcher calls it again after the server did: its
    # record must name the same placeholders as a torchrun rank's.
    first = cpu_shims.install_placeholders("0.13.1")
    assert cpu_shims.install_placeholders("0.13.1") == first


def test_an_unused_module_is_hidden_so_its_import_fails_like_an_absent_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # triton on CPU: `import deepspeed` tries it in a try/except ImportError (HAS_TRITON)
    monkeypatch.delitem(sys.modules, "json_stand_in_xyz", raising=False)  # absent again afterwards
    assert cpu_shims.hide_unused_modules(("json_stand_in_xyz",)) == ["json_stand_in_xyz"]
    with pytest.raises(ImportError):
        importlib.import_module("json_stand_in_xyz")
    # a second call (a forked rank after the server) reports the same; the module stays hidden
    assert cpu_shims.hide_unused_modules(("json_stand_in_xyz",)) == ["json_stand_in_xyz"]
    # a module already imported was wanted by someone: left alone, not reported
    assert cpu_shims.hide_unused_modules(("json",)) == []
    assert importlib.import_module("json") is sys.modules["json"]


def test_triton_is_what_cpu_runs_hide() -> None:
    assert cpu_shims.UNUSED_ON_CPU == ("triton",)
