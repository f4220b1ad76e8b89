"""THE reader of the tool's own JSON files on the host: results.json, suite.json, bisect.json,
survey.json, probe.json and a run's record.json.

These files are input like any other: copied between machines, shared in a results folder, cut
short by a full disk, edited by hand. One damaged file must not end in a traceback halfway through
a report or a RESUME=1 run. So every host-side read goes through `read` (a regular file, at most
MAX_BYTES, UTF-8, valid JSON, nested at most MAX_DEPTH levels) and `check` (the keys its consumer
reads have the types it expects), and anything else is a UsageError (exit 2) that names the file
and the field. (The workload, which runs inside the envs, keeps its own small reader in
repro/workload/record.py: it may import nothing from here.)
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from repro.core.errors import UsageError
from repro.core.smallfile import FileTooLarge, NotRegularFile, read_regular

# A results.json of a large survey is a few MB; nothing the tool writes comes near this.
MAX_BYTES = 64 * 1024 * 1024
# Records nest a handful of levels (a run's config, its fix info); a deeper file is not ours, and
# past this every recursive consumer (the scrubber, json.dumps) would risk a RecursionError.
MAX_DEPTH = 64
FIX = "re-run the step that wrote it, or move the damaged folder away"


def read(path: Path, what: str = "", *, fix: str = FIX) -> Any:
    """The JSON value in `path`; a UsageError naming the file and the problem otherwise
    (including a missing file: callers check existence first where it is optional)."""
    what = what or path.name
    try:
        raw = read_regular(path, MAX_BYTES)
    except FileTooLarge:
        raise UsageError(
            f"{path} is too large to be a {what}",
            why=f"it holds more than {MAX_BYTES} bytes; the tool never writes one that large",
            fix=fix,
        ) from None
    except NotRegularFile as exc:
        raise UsageError(f"cannot read {what} {path}", why=str(exc), fix=fix) from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}", why=exc.strerror or str(exc), fix=fix) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path} is not a {what}: it is not UTF-8 text",
            why=f"byte {exc.start} is 0x{raw[exc.start]:02x}; the tool writes its records as UTF-8 JSON",
            fix=fix,
        ) from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise _too_deep(path, what, fix) from None
    except ValueError as exc:
        raise UsageError(f"{path} is not a {what}: it is not valid JSON", why=str(exc), fix=fix) from None
    if _depth(data) > MAX_DEPTH:
        raise _too_deep(path, what, fix)
    return data


def _too_deep(path: Path, what: str, fix: str) -> UsageError:
    return UsageError(
        f"{path} is not a {what}: it is nested too deeply",
        why=f"more than {MAX_DEPTH} levels of lists and objects; the tool's records have a few",
        fix=fix,
    )


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in `value` (iterative: a deep value must not recurse)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_DEPTH:
            todo.extend((child, level + 1) for child in children)
    return deepest


# ---- shapes: the keys a consumer reads and their types -------------------------------------------

NoneType = type(None)


@dataclass(frozen=True)
class Shape:
    """What a JSON value may be: one of `types`; a list's items or (without `fields`) an object's
    values are `items`; an object's known keys are `fields` (others are not checked), of which
    `required` must be present."""

    types: tuple[type, ...]
    items: Shape | None = None
    fields: Mapping[str, Shape] = field(default_factory=dict)
    required: tuple[str, ...] = ()


_NAMES = {str: "a string", int: "a whole number", float: "a number", bool: "true/false"}
_NAMES.update({dict: "an object", list: "a list", NoneType: "null"})


def _expected(shape: Shape) -> str:
    return " or ".join(dict.fromkeys(_NAMES.get(t, t.__name__) for t in shape.types))


def _fits(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # JSON true/false is not a number here
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def check(value: Any, shape: Shape, path: Path, where: str = "") -> Any:
    """`value` itself when it has `shape`; a UsageError naming the file and the field otherwise."""
    todo: list[tuple[Any, Shape, str]] = [(value, shape, where)]
    while todo:
        item, want, at = todo.pop()
        if not _fits(item, want.types):
            shown = json.dumps(item)[:60] if not isinstance(item, (dict, list)) else type(item).__name__
            raise UsageError(
                f"{path} is damaged: {at or 'the file'} is {shown}, not {_expected(want)}",
                why="the tool writes this field with that type; the file was cut short, edited, "
                "or written by something else",
                fix=FIX,
            )
        if isinstance(item, dict):
            for key in want.required:
                if key not in item:
                    raise UsageError(f"{path} is damaged: {at or 'the file'} has no {key!r}", fix=FIX)
            if want.fields:
                todo += [(item[k], s, _join(at, k)) for k, s in want.fields.items() if k in item]
            elif want.items is not None:
                todo += [(v, want.items, _join(at, k)) for k, v in item.items()]
        elif isinstance(item, list) and want.items is not None:
            todo += [(v, want.items, f"{at}[{i}]") for i, v in enumerate(item)]
    return value


def _join(at: str, key: str) -> str:
    return f"{at}.{key}" if at and key.isidentifier() else f"{at}[{key!r}]" if at else key


def load(path: Path, shape: Shape, what: str = "", *, fix: str = FIX) -> Any:
    """`read` then `check`."""
    return check(read(path, what, fix=fix), shape, path)


def optional(*types: type) -> tuple[type, ...]:
    return (*types, NoneType)


STR = Shape((str,))
OPT_STR = Shape(optional(str))
OPT_INT = Shape(optional(int))
OPT_NUM = Shape(optional(float))
OPT_BOOL = Shape(optional(bool))
OPT_OBJECT = Shape(optional(dict))
OPT_SCALAR = Shape(optional(str, float, bool))
STRINGS = Shape(optional(list), items=STR)
STR_MAP = Shape(optional(dict), items=STR)


def as_json(value: Any) -> Any:
    """A dataclass as the tool's JSON files hold it: its fields by name (nested ones too), enums by
    their value, tuples as lists. For a dataclass whose `to_dict` is exactly its fields."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: as_json(v) for k, v in value.items()}
    return value
