"""The env matrix: the named envs, validation of envs.toml, derived envs, the compat tables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from repro.core.errors import MatrixError, PythonVersionError, UnknownEnvError, UsageError
from repro.matrix import compat
from repro.matrix.compat import Platform
from repro.matrix.model import DEFAULT_MATRIX, Env, Matrix
from repro.matrix.schema import MatrixProblemsError, Problem, load_matrix

MATRIX_TEXT = DEFAULT_MATRIX.read_text()
CPU_NOTES = 'notes = """\nThe default'  # where the [env.cpu] table takes new keys in edits
DOCKER_TAG = re.compile(r"^[a-z0-9][a-z0-9_./-]*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@pytest.fixture(scope="module")
def matrix() -> Matrix:
    return load_matrix()


def load_edited(tmp_path: Path, *edits: tuple[str, str]) -> Matrix:
    """The real envs.toml with `old -> new` text edits (each must apply exactly once)."""
    text = MATRIX_TEXT
    for old, new in edits:
        assert text.count(old) >= 1, f"edit target not in envs.toml: {old!r}"
        text = text.replace(old, new, 1)
    path = tmp_path / "envs.toml"
    path.write_text(text)
    return load_matrix(path)


def problems_of(tmp_path: Path, *edits: tuple[str, str]) -> tuple[Problem, ...]:
    with pytest.raises(MatrixProblemsError) as info:
        load_edited(tmp_path, *edits)
    return info.value.problems


def find(problems: tuple[Problem, ...], env: str | None, key: str) -> Problem:
    for problem in problems:
        if problem.env == env and problem.key == key:
            return problem
    raise AssertionError(f"no problem for env={env} key={key}: {[p.render() for p in problems]}")


# --- the named envs ---------------------------------------------------------------------------


def test_default_env_is_cpu(matrix: Matrix) -> None:
    assert matrix.default_id == "cpu"
    assert matrix.default().id == "cpu"


def test_required_envs_exist(matrix: Matrix) -> None:
    for env_id in ("rocm56", "cuda", "cpu", "cpu-latest", "cpu-ds0198", "cpu-torch20"):
        assert env_id in matrix
    newer_rocm = [e for e in matrix.ids() if e.startswith("rocm") and e != "rocm56"]
    assert len(newer_rocm) >= 3


def test_rocm56_is_the_reporters_stack(matrix: Matrix) -> None:
    env = matrix.get("rocm56")
    assert env.platform is Platform.ROCM
    assert env.base_image.startswith("rocm/dev-ubuntu-20.04:5.6")
    assert (env.torch, env.deepspeed, env.rocm) == ("2.1.0", "0.13.1", "5.6")
    assert env.torch_index == "https://download.pytorch.org/whl/rocm5.6"
    assert env.package_pins()["numpy"].startswith("1.26.")
    assert not {"pynvml", "nvidia-ml-py"} & set(env.package_pins())


def test_cpu_envs(matrix: Matrix) -> None:
    cpu = matrix.get("cpu")
    assert (cpu.torch, cpu.deepspeed, cpu.torch_index) == ("2.1.0", "0.13.1", None)
    assert cpu.base_image == "python:3.11-slim-bookworm"
    assert (matrix.get("cpu-latest").torch, matrix.get("cpu-latest").deepspeed) == ("2.13.0", "0.19.6")
    assert matrix.get("cpu-ds0198").deepspeed == "0.19.8"
    assert matrix.get("cpu-torch20").torch == "2.0.1"


def test_cuda_env_uses_cu121_and_keeps_nvml(matrix: Matrix) -> None:
    env = matrix.get("cuda")
    assert env.torch_index == "https://download.pytorch.org/whl/cu121"
    assert "pynvml" in env.package_pins()


def test_newest_rocm_pairs_with_the_last_deepspeed_with_mics(matrix: Matrix) -> None:
    rocm = [matrix.get(e) for e in matrix.ids() if e.startswith("rocm")]
    newest = max(rocm, key=lambda e: tuple(int(p) for p in (e.rocm or "0").split(".")))
    assert newest.deepspeed == "0.19.6"
    assert compat.has_mics(newest.deepspeed)


@pytest.mark.parametrize("env_id", load_matrix().ids())
def test_every_env_is_fully_pinned(matrix: Matrix, env_id: str) -> None:
    env = matrix.get(env_id)
    for step in env.install_steps():
        for spec in step.specs:
            # torch: with its build's local label, or `===` for PyPI's (repro.matrix.compat.torch_spec)
            assert re.fullmatch(r"[a-z0-9-]+===?[0-9][0-9a-z.]*(\+[0-9a-z.]+)?", spec), spec
    pins = env.pins()
    assert pins["torch"] == env.torch and pins["deepspeed"] == env.deepspeed
    assert re.fullmatch(r"[0-9a-f]{12}", env.pins_key())
    assert DOCKER_TAG.match(env.image_tag())
    assert compat.torch_supports_python(env.torch, env.python) is not False
    assert env.dockerfile == f"docker/{env_id}.Dockerfile"
    # the closure is complete: what a pinned package needs is pinned too
    for needs, deps in matrix.tables.pin_requires.items():
        if needs in env.package_pins():
            assert set(deps) <= set(env.package_pins())


def test_install_steps_order_and_flags(matrix: Matrix) -> None:
    steps = matrix.get("rocm56").install_steps()
    assert [s.name for s in steps] == ["tooling", "torch", "deepspeed-deps", "deepspeed"]
    torch_step, deps_step, ds_step = steps[1], steps[2], steps[3]
    assert torch_step.index_url == "https://download.pytorch.org/whl/rocm5.6"
    assert torch_step.pip_install_args()[:5] == (
        "install",
        "--index-url",
        "https://download.pytorch.org/whl/rocm5.6",
        "--extra-index-url",
        "https://pypi.org/simple",
    )
    assert deps_step.no_deps and deps_step.check
    assert ds_step.no_build_isolation and ("DS_BUILD_OPS", "0") in ds_step.environment
    assert ds_step.specs == ("deepspeed==0.13.1",)


def test_python_specific_pins(matrix: Matrix) -> None:
    # rocm56 runs Python 3.9, which pydantic 2.14 and packaging 26.4 have dropped.
    assert matrix.get("rocm56").package_pins()["pydantic"] == "2.13.5"
    assert matrix.get("cpu").package_pins()["pydantic"] == "2.14.4"


def test_pins_key_is_stable_and_tracks_pins(matrix: Matrix, tmp_path: Path) -> None:
    assert load_matrix().get("cpu").pins_key() == matrix.get("cpu").pins_key()
    edited = load_edited(tmp_path, ('tqdm = "4.70.1"', 'tqdm = "4.70.0"'))
    assert edited.get("cpu").pins_key() != matrix.get("cpu").pins_key()


# --- validation -------------------------------------------------------------------------------


def test_misspelt_key_names_file_env_key_and_suggests(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, ('platform = "rocm"', 'pltform = "rocm"'))
    typo = find(problems, "rocm56", "pltform")
    assert typo.suggestion == "platform"
    assert find(problems, "rocm56", "platform").message.startswith("missing")
    text = typo.render()
    assert str(tmp_path / "envs.toml") in text and "rocm56" in text and "pltform" in text


def test_error_message_names_file_env_and_key(tmp_path: Path) -> None:
    with pytest.raises(MatrixError) as info:
        load_edited(tmp_path, ('deepspeed = "0.13.1"', 'deepspeed = "0.13.x"'))
    message = str(info.value)
    assert str(tmp_path / "envs.toml") in message and "'rocm56'" in message and "'deepspeed'" in message
    assert info.value.exit_code == 3


def test_misspelt_platform_value_is_suggested(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, ('platform = "rocm"', 'platform = "rocn"'))
    assert find(problems, "rocm56", "platform").suggestion == "rocm"


def test_wrong_torch_index_for_rocm(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, ('whl/rocm5.6"', 'whl/rocm5.7"'))
    problem = find(problems, "rocm56", "torch_index")
    assert problem.suggestion == "https://download.pytorch.org/whl/rocm5.6"


def test_index_must_match_the_envs_rocm_version(tmp_path: Path) -> None:
    # torch 2.5.1 has rocm6.1 and rocm6.2 wheels; rocm62's base is 6.2
    problems = problems_of(tmp_path, ('whl/rocm6.2"', 'whl/rocm6.1"'))
    assert find(problems, "rocm62", "torch_index").suggestion == "https://download.pytorch.org/whl/rocm6.2"


def test_cpu_env_rejects_a_gpu_index(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, ('whl/cpu"', 'whl/cu121"'))
    assert find(problems, "cpu-latest", "torch_index").suggestion == compat.CPU_INDEX.url


def test_python_without_torch_wheels(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, ('python = "3.9"', 'python = "3.12"'))
    assert "3.12" in find(problems, "rocm56", "python").message


def test_latest_and_untagged_base_images(tmp_path: Path) -> None:
    latest = problems_of(tmp_path, ('"rocm/dev-ubuntu-20.04:5.6"', '"rocm/dev-ubuntu-20.04:latest"'))
    assert find(latest, "rocm56", "base_image")
    untagged = problems_of(tmp_path, ('"rocm/dev-ubuntu-20.04:5.6"', '"rocm/dev-ubuntu-20.04"'))
    assert find(untagged, "rocm56", "base_image")


def test_misspelt_default_is_suggested(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, ('default = "cpu"', 'default = "cpuu"'))
    assert find(problems, None, "default").suggestion == "cpu"


def test_missing_pin_for_a_deepspeed_dependency(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, ('einops = "0.8.2"\n', ""))
    envs = {p.env for p in problems if p.key == "pins.einops"}
    assert {"rocm62", "rocm64", "cpu-latest", "cpu-ds0198"} <= envs
    assert "cpu" not in envs  # DeepSpeed 0.13.1 does not need einops


def test_rocm_key_on_a_cpu_env(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, (CPU_NOTES, 'rocm = "5.6"\n' + CPU_NOTES))
    assert find(problems, "cpu", "rocm")


def test_extra_pins_must_be_exact_and_unmanaged(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, (CPU_NOTES, 'extra_pins = ["numpy==1.26.3", "rich>=13"]\n' + CPU_NOTES))
    messages = [p.message for p in problems if p.env == "cpu" and p.key == "extra_pins"]
    assert len(messages) == 2


def test_extra_pins_reach_the_torch_layer(tmp_path: Path) -> None:
    edited = load_edited(tmp_path, (CPU_NOTES, 'extra_pins = ["rich==13.7.1"]\n' + CPU_NOTES))
    assert "rich==13.7.1" in edited.get("cpu").torch_requirements()


def test_unknown_top_level_key_and_override_of_unpinned_package(tmp_path: Path) -> None:
    problems = problems_of(
        tmp_path,
        ("schema = 1\n", "schema = 1\npinz = 2\n"),
        ('[pins_for_python."3.10"]\n', '[pins_for_python."3.10"]\nnumpyy = "2.2.6"\n'),
    )
    assert find(problems, None, "pinz").suggestion == "pins"
    assert find(problems, None, "pins_for_python.3.10.numpyy").suggestion == "numpy"


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "envs.toml"
    bad.write_text("[env.cpu\n")
    with pytest.raises(MatrixError, match="not valid TOML"):
        load_matrix(bad)
    with pytest.raises(MatrixError, match="not found"):
        load_matrix(tmp_path / "nope.toml")


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    problems = problems_of(
        tmp_path, ('platform = "rocm"', 'platform = "rocn"'), ('default = "cpu"', 'default = "cpuu"')
    )
    assert {p.key for p in problems} >= {"platform", "default"}


# --- lookup and derived envs -------------------------------------------------------------------


def test_unknown_env_lists_valid_ids_and_suggests(matrix: Matrix) -> None:
    with pytest.raises(UnknownEnvError) as info:
        matrix.get("rocm5.6")
    assert "did you mean 'rocm56'" in str(info.value)
    assert "cpu-latest" in info.value.why
    assert info.value.exit_code == 4


def test_derive_torch_on_cpu(matrix: Matrix) -> None:
    env = matrix.derive("cpu", torch="2.2.2")
    assert (env.id, env.derived_from) == ("cpu+torch2.2.2", "cpu")
    assert (env.torch, env.deepspeed) == ("2.2.2", "0.13.1")
    assert env.torch_index is None
    assert env.package_pins()["numpy"] == "1.26.4"
    assert env.dockerfile == "build/docker/cpu-torch2.2.2.Dockerfile"
    assert env.pins_key() != matrix.get("cpu").pins_key()
    assert DOCKER_TAG.match(env.image_tag())


def test_derive_recomputes_numpy_for_new_torch(matrix: Matrix) -> None:
    assert matrix.derive("cpu", torch="2.5.1").package_pins()["numpy"] == "2.4.6"  # Python 3.11
    assert matrix.derive("rocm57", torch="2.4.1").package_pins()["numpy"] == "2.2.6"  # Python 3.10
    assert matrix.derive("cpu-latest", torch="2.3.1").package_pins()["numpy"] == "1.26.4"


def test_derive_keeps_cpu_index(matrix: Matrix) -> None:
    assert matrix.derive("cpu-latest", torch="2.5.1").torch_index == compat.CPU_INDEX.url


def test_derive_rocm_picks_the_index_of_the_new_torch(matrix: Matrix) -> None:
    env = matrix.derive("rocm56", torch="2.2.2")
    assert env.torch_index == "https://download.pytorch.org/whl/rocm5.7"
    assert "5.7" in env.notes and "5.6" in env.notes  # the wheel/base mismatch is stated
    assert env.rocm == "5.6"


def test_derive_rocm_prefers_the_base_rocm_when_torch_has_several(matrix: Matrix) -> None:
    assert matrix.derive("rocm61", torch="2.5.1").torch_index == "https://download.pytorch.org/whl/rocm6.1"
    assert (
        matrix.derive("rocm62", deepspeed="0.17.6").torch_index == "https://download.pytorch.org/whl/rocm6.2"
    )


def test_derive_cuda_prefers_the_base_cuda(matrix: Matrix) -> None:
    env = matrix.derive("cuda", torch="2.4.1")
    assert env.torch_index == "https://download.pytorch.org/whl/cu121"
    assert env.uncertain == ("wheel index",)


def test_derive_without_known_index_is_a_clear_error(matrix: Matrix) -> None:
    with pytest.raises(UsageError) as info:
        matrix.derive("rocm62", torch="2.12.0")
    assert "2.12.0" in info.value.what and "ROCm" in info.value.what


def test_derive_torch_without_wheels_for_the_python(matrix: Matrix) -> None:
    with pytest.raises(PythonVersionError):
        matrix.derive("rocm56", torch="2.9.1")  # rocm56 runs Python 3.9; torch 2.9 starts at 3.10


@pytest.mark.parametrize("value", ["abc", "2.1.0+cpu"])
def test_derive_rejects_bad_versions(matrix: Matrix, value: str) -> None:
    with pytest.raises(UsageError):
        matrix.derive("cpu", torch=value)


def test_derive_deepspeed_recomputes_deps(matrix: Matrix) -> None:
    env = matrix.derive("cpu", deepspeed="0.16.9")
    pins = env.package_pins()
    assert {"einops", "msgpack"} <= set(pins) and "pynvml" not in pins and "nvidia-ml-py" not in pins
    rocm = matrix.derive("rocm56", deepspeed="0.14.5").package_pins()
    assert "nvidia-ml-py" not in rocm and "pynvml" not in rocm


def test_derive_without_mics_says_so(matrix: Matrix) -> None:
    assert "no MiCS" in matrix.derive("cpu-latest", deepspeed="0.19.8").notes


def test_derive_identity_and_chaining(matrix: Matrix) -> None:
    cpu = matrix.get("cpu")
    assert matrix.derive("cpu") is cpu
    assert matrix.derive("cpu", torch="2.1.0", deepspeed="0.13.1") is cpu
    chained = matrix.derive("cpu+torch2.2.2", deepspeed="0.14.5")
    assert chained.id == "cpu+torch2.2.2+ds0.14.5" and chained.derived_from == "cpu"
    assert matrix.derive("cpu+torch2.2.2", torch="2.1.0") == cpu


def test_derived_ids_resolve_through_get(matrix: Matrix) -> None:
    assert matrix.get("cpu+torch2.2.2+ds0.14.5") == matrix.derive("cpu", torch="2.2.2", deepspeed="0.14.5")
    with pytest.raises(UnknownEnvError):
        matrix.get("nope+torch2.2.2")


def test_derived_env_is_an_env(matrix: Matrix) -> None:
    env = matrix.derive("cpu", torch="2.2.2")
    assert isinstance(env, Env) and env.is_derived and not matrix.get("cpu").is_derived


# --- compat tables ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("torch", "tags"),
    [
        ("2.0.1", ("rocm5.4.2",)),
        ("2.1.0", ("rocm5.6",)),
        ("2.2.0", ("rocm5.6",)),
        ("2.2.2", ("rocm5.7",)),
        ("2.3.1", ("rocm6.0",)),
        ("2.4.1", ("rocm6.1",)),
        ("2.5.1", ("rocm6.1", "rocm6.2")),
        ("2.6.0", ("rocm6.2.4",)),
        ("2.9.1", ("rocm6.4",)),
        ("2.12.0", ()),
    ],
)
def test_rocm_index_table(torch: str, tags: tuple[str, ...]) -> None:
    assert tuple(i.tag for i in compat.wheel_indexes(Platform.ROCM, torch)) == tags


def test_index_versions() -> None:
    assert compat.WheelIndex("cu121").platform_version == "12.1"
    assert compat.WheelIndex("rocm6.2.4").platform_version == "6.2.4"
    assert compat.same_minor("6.2.4", "6.2") and not compat.same_minor("6.1", "6.2")


@pytest.mark.parametrize(
    ("deepspeed", "platform", "expected_extra"),
    [
        ("0.13.1", Platform.CPU, {"pynvml"}),
        ("0.13.1", Platform.ROCM, set()),
        ("0.14.5", Platform.CPU, {"nvidia-ml-py"}),
        ("0.15.4", Platform.CPU, {"msgpack"}),
        ("0.15.4", Platform.CUDA, {"msgpack", "nvidia-ml-py"}),
        ("0.19.6", Platform.CPU, {"msgpack", "einops"}),
        ("0.19.6", Platform.ROCM, {"msgpack", "einops"}),
    ],
)
def test_deepspeed_packages(deepspeed: str, platform: Platform, expected_extra: set[str]) -> None:
    names = set(compat.deepspeed_packages(deepspeed, platform))
    assert names - set(compat.DS_COMMON) == expected_extra


def test_torch_python_table() -> None:
    assert compat.torch_supports_python("2.1.0", "3.11") is True
    assert compat.torch_supports_python("2.1.0", "3.12") is False
    assert compat.torch_supports_python("2.9.1", "3.9") is False
    assert compat.torch_supports_python("1.13.1", "3.10") is True
    assert compat.torch_supports_python("1.12.1", "3.10") is None


def test_mics_is_gone_from_0_19_7() -> None:
    # measured: 0.19.6 reproduces; 0.19.7 and 0.19.8 have no deepspeed/runtime/zero/mics.py
    assert compat.has_mics("0.19.6") and compat.has_mics("0.13.1")
    assert not compat.has_mics("0.19.7") and not compat.has_mics("0.19.8")
