"""The run record's keys are declared once (issue #46 item 1): RunRecord's fields. RECORD_KEYS,
every fresh record and the shape the host checks records against are read from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.core import shapes
from repro.core.errors import UsageError
from repro.core.records import check
from repro.workload import record


def test_the_keys_are_the_typed_records_fields_in_order() -> None:
    assert record.RECORD_KEYS == tuple(record.RunRecord.__annotations__)
    assert len(record.RECORD_KEYS) == 40 and record.RECORD_KEYS[:4] == ("schema", "env", "scenario", "patch")
    assert tuple(record.empty_record()) == record.RECORD_KEYS


def test_every_key_but_the_free_form_ones_is_checked() -> None:
    unchecked = {k for k, a in record.record_annotations().items() if a == "Any"}
    assert unchecked == {"config", "fix"}
    assert set(shapes.RUN.fields) == set(record.RECORD_KEYS) - unchecked
    assert all(shapes.RUN.fields[k] == shapes.STR for k in shapes.RUN_IDENTITY)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("world_size", "4"),
        ("losses", ["x"]),
        ("versions", {"torch": ["2.1"]}),
        ("schema", "1"),
        ("env", None),
    ],
)
def test_a_key_of_another_type_is_refused_when_read(tmp_path: Path, key: str, value: object) -> None:
    run = {"env": "cpu", "scenario": "mics", "patch": "stock", key: value}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(run))
    with pytest.raises(UsageError, match=key):
        check(run, shapes.RUN, path)


def test_a_record_of_an_older_tool_still_reads(tmp_path: Path) -> None:
    older = {"env": "cpu", "scenario": "zero3", "patch": "stock", "losses": [1.0, None], "ran_on": None}
    assert check(older, shapes.RUN, tmp_path / "results.json") == older


def test_a_key_whose_annotation_has_no_shape_fails_loudly() -> None:
    with pytest.raises(TypeError, match=r"RunRecord\.new_key: no shape for the annotation 'set\[int\]'"):
        shapes.field_shape("new_key", "set[int]")
