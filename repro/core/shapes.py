"""The shapes (repro.core.records.Shape) of the tool's JSON files: the keys their host-side
consumers read, with the types the tool writes them with. Keys are optional unless `required`
(older files lack newer keys; every consumer reads them with .get); a present key of another type
is refused when the file is read, not deep inside a report."""

from __future__ import annotations

from repro.core.records import (
    OPT_BOOL,
    OPT_INT,
    OPT_NUM,
    OPT_OBJECT,
    OPT_SCALAR,
    OPT_STR,
    STR,
    STR_MAP,
    STRINGS,
    Shape,
    optional,
)
from repro.workload.record import record_annotations

# How a record key's annotation (repro.workload.record.RunRecord, the one declaration of the keys)
# reads as a shape. Lenient on purpose: older records lack newer keys and null stands for "not
# known", so every key is optional and may be null, but a present key of another type is refused.
_BY_ANNOTATION: dict[str, Shape] = {
    "int": OPT_INT,
    "str": OPT_STR,
    "bool": OPT_BOOL,
    "float": OPT_NUM,
    "list[str]": STRINGS,
    "list[float | None]": Shape(optional(list), items=OPT_NUM),
    "dict[str, str]": STR_MAP,
    "dict[str, int | None]": Shape(optional(dict), items=OPT_INT),
    "dict[str, float | None]": Shape(optional(dict), items=OPT_NUM),
    "dict[str, str | None]": Shape(optional(dict), items=OPT_SCALAR),  # versions: as older tools wrote them
    "dict[str, Any]": OPT_OBJECT,
    "Layout": OPT_OBJECT,
    "RecordedException": OPT_OBJECT,
    "RanOn": OPT_OBJECT,
    "CustomJob": OPT_OBJECT,
}
# What names a run: always present, always a string.
RUN_IDENTITY = ("env", "scenario", "patch")


def field_shape(key: str, annotation: str) -> Shape | None:
    """The shape of one record key (None: any JSON value, e.g. the DeepSpeed config). An
    annotation without a shape here fails at import, so a new key cannot go unchecked."""
    if key in RUN_IDENTITY:
        return STR
    if annotation == "Any":
        return None
    base = annotation.removesuffix(" | None")
    if base not in _BY_ANNOTATION:
        raise TypeError(f"RunRecord.{key}: no shape for the annotation {annotation!r} (repro/core/shapes.py)")
    return _BY_ANNOTATION[base]


# One run's record: in results.json, suite.json, probe.json.
RUN = Shape(
    (dict,),
    fields={
        key: shape
        for key, annotation in record_annotations().items()
        if (shape := field_shape(key, annotation)) is not None
    },
)
RUNS = Shape((list,), items=RUN)

ENV = Shape(
    (dict,),
    fields={
        "platform": OPT_STR,
        "engine": OPT_STR,
        "image_id": OPT_STR,
        "pins": Shape(optional(dict), items=OPT_SCALAR),
        "derived_from": OPT_STR,
        "built_on": OPT_STR,
        "artifacts": STR_MAP,
        "suite_exit_code": OPT_INT,
    },
)

INVOCATION = Shape(
    (dict,),
    fields={
        "argv": STRINGS,
        "command": OPT_STR,
        "started_at": OPT_STR,
        "finished_at": OPT_STR,
        "interrupted": OPT_BOOL,
        "host": OPT_OBJECT,
        "python_command": OPT_STR,
        "resumed_at": STRINGS,
    },
)

# results.json (repro.core.results.ResultsData)
RESULTS = Shape(
    (dict,),
    fields={
        "schema": Shape((int,)),
        "tool_version": OPT_STR,
        "invocation": INVOCATION,
        "envs": Shape((dict,), items=ENV),
        "runs": RUNS,
    },
    required=("schema", "invocation", "envs", "runs"),
)

# An env's suite.json, as the suite writes it inside the env.
SUITE = Shape(
    (dict,), fields={"runs": RUNS, "artifacts": STR_MAP, "interrupted": OPT_BOOL}, required=("runs",)
)

# bisect.json, survey.json and probe.json (repro.bisect.output)
PROBE = Shape(
    (dict,),
    fields={
        "version": STR,
        "outcome": STR,
        "signature": OPT_STR,
        "verdict": OPT_STR,
        "reason": OPT_STR,
        "seconds": OPT_NUM,
        "env": OPT_STR,
        "record": OPT_STR,
        "versions": Shape(optional(dict), items=OPT_SCALAR),
    },
    required=("version", "outcome"),
)
_OPT_PROBE = Shape(optional(dict), fields=PROBE.fields, required=PROBE.required)
CHANGE = Shape(
    (dict,),
    fields={
        "before": STR,
        "after": STR,
        "outcome_before": OPT_STR,
        "outcome_after": OPT_STR,
        "signature_before": OPT_STR,
        "signature_after": OPT_STR,
        "unknown_between": STRINGS,
    },
    required=("before", "after"),
)
COMMIT = Shape(
    optional(dict),
    fields={
        "sha": OPT_STR,
        "short": STR,
        "subject": STR,
        "date": OPT_STR,
        "pr": OPT_INT,
        "pr_url": OPT_STR,
        "files": OPT_STR,
    },
    required=("short", "subject"),
)
_WALK_FIELDS = {
    "kind": OPT_STR,
    "axis": OPT_STR,
    "env": OPT_STR,
    "scenario": OPT_STR,
    "patch": OPT_STR,
    "bad_if": OPT_STR,
    "status": OPT_STR,
    "first_bad": OPT_STR,
    "last_good": OPT_STR,
    "unknown_between": STRINGS,
    "evidence": Shape(optional(dict), fields={"first_bad": _OPT_PROBE, "last_good": _OPT_PROBE}),
    "change_points": Shape(optional(list), items=CHANGE),
    "probes": Shape(optional(list), items=PROBE),
    "repro_command": OPT_STR,
    "command": OPT_STR,
    "first_bad_commit": COMMIT,
    "last_good_commit": COMMIT,
    "reproduce": Shape(optional(dict), fields={"make": OPT_STR, "pip": OPT_STR, "command": OPT_STR}),
    "ds_repo": OPT_STR,
    "candidates": STRINGS,
}
# A release or commit bisect (a survey's "commits" is a list of them).
COMMIT_WALK = Shape((dict,), fields=_WALK_FIELDS)
WALK = Shape(
    (dict,),
    fields={**_WALK_FIELDS, "commits": Shape(optional(dict, list), items=COMMIT_WALK, fields=_WALK_FIELDS)},
)
