"""Reads env_matrix/envs.toml and checks it; every problem names the file, the env and the key.

All problems are collected before raising, so one run shows everything wrong with the file.
Misspelt keys and values get a "did you mean" from difflib.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from repro.core.errors import MatrixError
from repro.core.smallfile import FileTooLarge, NotRegularFile, read_regular
from repro.matrix import compat
from repro.matrix.compat import Platform
from repro.matrix.model import (
    DEFAULT_MATRIX,
    TOOLING,
    TORCH_FROM,
    TORCH_FROM_HOST,
    TORCH_FROM_INDEX,
    Env,
    Matrix,
    PinTables,
    compute_pins,
    named_dockerfile,
    parse_derived_id,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 only
    import tomli as tomllib

TOP_KEYS = ("schema", "default", "pins", "pins_for_python", "pin_requires", "numpy", "env")
SCHEMA = 1
MAX_MATRIX_BYTES = 1 << 20
ENV_KEYS = (
    "platform",
    "base_image",
    "python",
    "torch",
    "torch_index",
    "deepspeed",
    "extra_pins",
    "rocm",
    "cuda",
    "notes",
    "torch_from",
)
REQUIRED_ENV_KEYS = ("platform", "base_image", "python", "torch", "deepspeed", "notes")
NUMPY_KEYS = ("numpy1_below_torch", "numpy1")
_ENV_ID = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
ENV_ID_RULE = "use lower-case letters, digits, '.' and '-' ('+' marks derived envs)"
_PYTHON = re.compile(r"^3\.\d+$")
_PLATFORM_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^=<>!~,; ]+)$")


@dataclass(frozen=True)
class Problem:
    path: Path
    env: str | None  # None: a file-level table
    key: str
    message: str
    suggestion: str | None = None

    def render(self) -> str:
        where = f"env '{self.env}'" if self.env else "file"
        hint = f" (did you mean '{self.suggestion}'?)" if self.suggestion else ""
        return f"{self.path}: {where}: key '{self.key}': {self.message}{hint}"


class MatrixProblemsError(MatrixError):
    """MatrixError carrying the structured problems (tests and tools read these, not the text)."""

    def __init__(self, path: Path, problems: list[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__(
            f"{path} has {len(problems)} problem(s)",
            why="\n".join(p.render() for p in problems),
            fix="correct the file; env_matrix/README.md documents every key and rule",
        )


def closest(word: str, choices: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


class _Checker:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[Problem] = []

    def add(self, env: str | None, key: str, message: str, suggestion: str | None = None) -> None:
        self.problems.append(Problem(self.path, env, key, message, suggestion))

    def unknown_keys(self, env: str | None, table: Mapping[str, Any], allowed: Iterable[str]) -> None:
        allowed = tuple(allowed)
        for key in table:
            if key not in allowed:
                self.add(env, key, f"unknown key (allowed: {', '.join(allowed)})", closest(key, allowed))

    def string(self, env: str | None, table: Mapping[str, Any], key: str) -> str | None:
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            self.add(env, key, f"must be a non-empty string, got {value!r}")
            return None
        return value.strip()

    def version(self, env: str | None, key: str, value: str | None) -> str | None:
        if value is None:
            return None
        problem = version_problem(value)
        if problem is not None:
            local = "local label" in problem
            self.add(env, key, problem, Version(value).public if local else None)
            return None
        return value


def version_problem(value: str) -> str | None:
    """Why `value` cannot be an env's torch/DeepSpeed version; None when it can."""
    try:
        parsed = Version(value)
    except InvalidVersion:
        return f"'{value}' is not a version number"
    if parsed.local is not None:
        return f"'{value}' has a local label; the index decides it"
    return None


def env_id_problem(env_id: str) -> str | None:
    """Why `env_id` is not an id this tool could have written (named, or derived "BASE+torchX+dsY");
    None when it is. Ids become folder and image names: checked wherever one is read from a file
    (a bundle's manifest), not only in envs.toml."""
    base, torch, deepspeed = parse_derived_id(env_id)
    if not _ENV_ID.match(base):
        return f"'{env_id}' is not an env id: {ENV_ID_RULE}"
    for value in (torch, deepspeed):
        problem = version_problem(value) if value is not None else None
        if problem is not None:
            return f"'{env_id}' is not a derived env id: {problem}"
    return None


# A table of the matrix file as TOML gives it: the callers check its keys and values one by one.
def _table(checker: _Checker, data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        checker.add(None, key, "must be a table")
        return {}
    return value


def _string_map(checker: _Checker, table: Mapping[str, Any], key: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, version in table.items():
        if not isinstance(version, str) or checker.version(None, f"{key}.{name}", version) is None:
            if not isinstance(version, str):
                checker.add(None, f"{key}.{name}", f"must be a version string, got {version!r}")
            continue
        out[name] = version
    return out


def read_tables(checker: _Checker, data: Mapping[str, Any]) -> PinTables:
    pins = _string_map(checker, _table(checker, data, "pins"), "pins")
    for name in (*TOOLING, "numpy"):
        if name not in pins:
            checker.add(None, f"pins.{name}", "missing: every env installs it")
    by_python: dict[str, dict[str, str]] = {}
    for python, table in _table(checker, data, "pins_for_python").items():
        if not _PYTHON.match(python) or not isinstance(table, dict):
            checker.add(None, f"pins_for_python.{python}", 'must be a table named like "3.9"')
            continue
        by_python[python] = _string_map(checker, table, f"pins_for_python.{python}")
        for name in by_python[python]:
            if name not in pins:
                checker.add(
                    None, f"pins_for_python.{python}.{name}", "overrides no [pins] entry", closest(name, pins)
                )
    requires: dict[str, tuple[str, ...]] = {}
    for name, deps in _table(checker, data, "pin_requires").items():
        if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
            checker.add(None, f"pin_requires.{name}", "must be a list of package names")
            continue
        for dep in (name, *deps):
            if dep not in pins:
                checker.add(None, f"pin_requires.{name}", f"'{dep}' has no [pins] entry", closest(dep, pins))
        requires[name] = tuple(deps)
    numpy = _table(checker, data, "numpy")
    checker.unknown_keys(None, numpy, NUMPY_KEYS)
    numpy1_below = checker.version(
        None, "numpy.numpy1_below_torch", checker.string(None, numpy, "numpy1_below_torch")
    )
    numpy1 = checker.version(None, "numpy.numpy1", checker.string(None, numpy, "numpy1"))
    for key, value in zip(NUMPY_KEYS, (numpy1_below, numpy1)):
        if value is None and key not in numpy:
            checker.add(None, f"numpy.{key}", "missing")
    return PinTables(pins, by_python, requires, numpy1_below or "0", numpy1 or "0")


def check_env(checker: _Checker, env_id: str, raw: Any, tables: PinTables) -> Env | None:
    if not _ENV_ID.match(env_id):
        checker.add(env_id, "(id)", ENV_ID_RULE)
    if not isinstance(raw, dict):
        checker.add(env_id, "(table)", "must be a table [env.ID]")
        return None
    before = len(checker.problems)
    checker.unknown_keys(env_id, raw, ENV_KEYS)
    for key in REQUIRED_ENV_KEYS:
        if key not in raw:
            checker.add(env_id, key, "missing (required)")
    text = {key: checker.string(env_id, raw, key) for key in ENV_KEYS if key != "extra_pins"}
    platform = None
    if text["platform"] is not None:
        values = [p.value for p in Platform]
        if text["platform"] in values:
            platform = Platform(text["platform"])
        else:
            checker.add(
                env_id,
                "platform",
                f"'{text['platform']}' is not one of {', '.join(values)}",
                closest(text["platform"], values),
            )
    python = text["python"]
    if python is not None and not _PYTHON.match(python):
        checker.add(env_id, "python", f"'{python}' is not a CPython major.minor like \"3.11\"")
        python = None
    torch = checker.version(env_id, "torch", text["torch"])
    deepspeed = checker.version(env_id, "deepspeed", text["deepspeed"])
    _check_base_image(checker, env_id, text["base_image"])
    if python and not tables.serves(python):
        checker.add(
            env_id,
            "python",
            f"the pins have no versions for Python {python}: [pins_for_python] starts at "
            f"{tables.oldest_python()} (add a table for {python} with the releases that support it)",
        )
    if torch and python and compat.torch_supports_python(torch, python) is False:
        low, high = compat.torch_pythons(torch) or ("?", "?")
        checker.add(env_id, "python", f"torch {torch} has no wheels for Python {python} ({low} to {high})")
    if platform is not None:
        _check_platform_keys(checker, env_id, platform, text, torch)
    own = _check_extra_pins(checker, env_id, raw.get("extra_pins", []), tables)
    torch_from = _check_torch_from(checker, env_id, text["torch_from"], own)
    if len(checker.problems) > before or platform is None or not (python and torch and deepspeed):
        return None
    needed = tables.closure(compat.deepspeed_packages(deepspeed, platform))
    missing = [n for n in needed if n not in tables.pins]
    for name in missing:
        checker.add(env_id, f"pins.{name}", f"DeepSpeed {deepspeed} needs '{name}' but [pins] has no version")
    if missing:
        return None
    tooling, extra, deps = compute_pins(tables, platform, python, torch, deepspeed, own)
    return Env(
        id=env_id,
        platform=platform,
        base_image=text["base_image"] or "",
        python=python,
        torch=torch,
        torch_index=text["torch_index"],
        deepspeed=deepspeed,
        extra_pins=extra,
        rocm=text["rocm"],
        cuda=text["cuda"],
        notes=" ".join((text["notes"] or "").split()),
        derived_from=None,
        dockerfile=named_dockerfile(env_id),
        tooling=tooling,
        deepspeed_deps=deps,
        tables=tables,
        torch_from=torch_from,
    )


def _check_torch_from(checker: _Checker, env_id: str, value: str | None, own: tuple[str, ...]) -> str:
    """`torch_from`: "index" (the default) or "host" (the venv's Python brings torch; checked
    against the pin, never installed, so the env's own extra_pins would have nowhere to go)."""
    if value is None:
        return TORCH_FROM_INDEX
    if value not in TORCH_FROM:
        checker.add(
            env_id,
            "torch_from",
            f"'{value}' is not one of {', '.join(TORCH_FROM)}",
            closest(value, TORCH_FROM),
        )
        return TORCH_FROM_INDEX
    if value == TORCH_FROM_HOST and own:
        checker.add(
            env_id,
            "extra_pins",
            'with torch_from = "host" the torch layer is the host\'s: these would not be installed',
        )
    return value


def _check_base_image(checker: _Checker, env_id: str, image: str | None) -> None:
    if image is None:
        return
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag or not tag:
        checker.add(env_id, "base_image", f"'{image}' has no tag: pin one (e.g. {image}:X.Y)")
    elif tag == "latest":
        checker.add(env_id, "base_image", "'latest' moves: pin a versioned tag")


def _check_platform_keys(
    checker: _Checker,
    env_id: str,
    platform: Platform,
    text: Mapping[str, str | None],
    torch: str | None,
) -> None:
    for key, owner in (("rocm", Platform.ROCM), ("cuda", Platform.CUDA)):
        value = text[key]
        if platform is owner and value is None:
            checker.add(env_id, key, f"missing: a {owner.value} env names its {key.upper()} version")
        elif platform is not owner and value is not None:
            checker.add(env_id, key, f"only {owner.value} envs have this key")
        elif value is not None and not _PLATFORM_VERSION.match(value):
            checker.add(env_id, key, f"'{value}' is not a version like \"5.6\"")
    url = text["torch_index"]
    if torch is None:
        return
    if platform is Platform.CPU:
        if url is not None and url.rstrip("/") != compat.CPU_INDEX.url:
            checker.add(
                env_id,
                "torch_index",
                "a cpu env uses PyPI (omit the key) or the cpu index",
                compat.CPU_INDEX.url,
            )
        return
    have = text["rocm"] if platform is Platform.ROCM else text["cuda"]
    expected = compat.pick_index(platform, torch, have)
    if url is None:
        checker.add(
            env_id,
            "torch_index",
            f"missing: {platform.value} torch comes from PyTorch's index",
            expected.url if expected else None,
        )
        return
    index = compat.index_for_url(platform, torch, url)
    if index is None:
        known = ", ".join(i.url for i in compat.wheel_indexes(platform, torch)) or "none known"
        checker.add(
            env_id,
            "torch_index",
            f"'{url}' does not carry torch {torch} (known: {known})",
            expected.url if expected else None,
        )
    elif have is not None and index.platform_version and not compat.same_minor(index.platform_version, have):
        checker.add(
            env_id,
            "torch_index",
            f"'{url}' is built for {platform.value} {index.platform_version}, the env says {have}",
            expected.url if expected else None,
        )


def _check_extra_pins(checker: _Checker, env_id: str, raw: Any, tables: PinTables) -> tuple[str, ...]:
    if not isinstance(raw, list):
        checker.add(env_id, "extra_pins", 'must be a list of "name==version" strings')
        return ()
    managed = {"torch", "deepspeed", "numpy", *tables.pins}
    out = []
    for item in raw:
        match = _PIN.match(item) if isinstance(item, str) else None
        if match is None:
            checker.add(env_id, "extra_pins", f'{item!r} is not an exact pin "name==version"')
        elif match["name"].lower() in managed:
            checker.add(env_id, "extra_pins", f"'{match['name']}' is pinned by the matrix rules: edit [pins]")
        else:
            out.append(item)
    return tuple(out)


def load_matrix(path: str | Path = DEFAULT_MATRIX) -> Matrix:
    """Read and validate the matrix; raises repro.core.errors.MatrixError naming file, env and key."""
    path = Path(path)
    try:
        data = tomllib.loads(read_regular(path, MAX_MATRIX_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise MatrixError(
            f"env matrix {path} not found", fix="run from the repository or pass the path"
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise MatrixError(f"{path} is not valid TOML", why=why) from None
    except OSError as exc:  # a folder, a file this user may not read
        raise MatrixError(
            f"env matrix {path} cannot be read",
            why=str(exc) if isinstance(exc, (NotRegularFile, FileTooLarge)) else exc.strerror or str(exc),
            fix="pass MATRIX=<the matrix TOML file> (default env_matrix/envs.toml)",
        ) from None
    checker = _Checker(path)
    checker.unknown_keys(None, data, TOP_KEYS)
    if data.get("schema") != SCHEMA:
        checker.add(None, "schema", f"must be {SCHEMA}, got {data.get('schema')!r}")
    tables = read_tables(checker, data)
    envs: dict[str, Env] = {}
    for env_id, raw in _table(checker, data, "env").items():
        env = check_env(checker, env_id, raw, tables)
        if env is not None:
            envs[env_id] = env
    raw_envs = list(_table(checker, data, "env"))
    if not raw_envs:
        checker.add(None, "env", "no [env.ID] tables")
    default = data.get("default")
    if not isinstance(default, str) or default not in raw_envs:
        checker.add(None, "default", f"{default!r} names no env", closest(str(default), raw_envs))
    if checker.problems:
        raise MatrixProblemsError(path, checker.problems)
    assert isinstance(default, str)
    return Matrix(path, default, envs, tables)
