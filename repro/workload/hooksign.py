"""Signed hook records: evidence a custom job cannot forge by writing files.

The job runner (repro/workload/job.py) makes a random key for each run and hands it to the hook in
KEY_VAR. The hook takes it out of `os.environ` at interpreter start, before any of the job's code
runs (`take_key`), passes it only into the environment of the processes it starts
(jobhook.py), and signs every record it writes (`sign`: HMAC-SHA256 over the record's canonical
JSON). After the run the runner sorts the records (`sort_records`): a record whose MAC does not
verify with the run's key, that has none, or whose file name is not its own pid, is not the hook's
and never counts; the record and the verdict name it.

What this stops: a job that writes or edits `hook/<pid>.json` (the files are in a folder the job
can reach through MICS_REPRO_JOB_DIR). What it does not stop: a job that sets out to dig the key
out of its own process (the hook's memory, /proc/self/environ) or out of a child's environment;
that is an attack on the lab, not a forgery by mistake, and docs/own-job.md says so.

Runs inside the environments: standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Final, TypedDict

if TYPE_CHECKING:
    from repro.workload.collectives import Installed
    from repro.workload.cpu.shims import TransportInfo
    from repro.workload.device import RanOn
    from repro.workload.fix import FixReport

KEY_VAR = "MICS_REPRO_HOOK_KEY"
MAC_FIELD: Final = "mac"


# What only the DeepSpeed engine knows (dtype_error: a DeepSpeed without those methods).
class EngineFacts(TypedDict, total=False):
    dtype: str
    dtype_error: str
    world_size: int
    rank: int


# What a pytest session of the job did: pytest_outcomes.summary(), declared here because that
# module imports jobhook (and jobhook this one), so neither can import it from there.
class PytestSummary(TypedDict):
    exitstatus: int
    collected: int | None
    counts: dict[str, int]  # outcome: tests
    ran: int
    tests: dict[str, dict[str, str]]  # test id: {"outcome", "message"}, the first MAX_TESTS
    tests_cut: int
    collect_errors: list[dict[str, str]]  # {"nodeid", "message"}: modules pytest could not collect


# hook/<pid>.json: what one hooked process did. Written by jobhook.py, declared here because
# job.py reads it back through sort_records (and jobhook imports this module, not the reverse).
class HookRecord(TypedDict, total=False):
    pid: int
    argv: list[str]
    patch: str  # MICS_REPRO_PATCH
    device: str  # MICS_REPRO_DEVICE
    placeholders: list[str]  # modules the CPU shims stood in for
    collectives: Installed
    collectives_error: str
    deepspeed: str  # its version
    fix: FixReport
    fix_error: str
    framework_dirs: list[str]
    launcher_default_port: int
    transport_info: TransportInfo
    steps: int
    engine: EngineFacts
    ran_on: RanOn
    ran_on_error: str
    test_harness_devices: int
    pytest: PytestSummary
    illegal_work_failures: int
    illegal_work_lines: int
    illegal_work_not_from_deepspeed: int
    mac: str  # MAC_FIELD


_RECORD_NAME = re.compile(r"^(?P<pid>\d+)\.json$")


def new_key() -> str:
    return os.urandom(32).hex()


def take_key(environ: MutableMapping[str, str]) -> bytes | None:
    """The run's key, removed from `environ` (os.environ: unset for the process too)."""
    value = environ.pop(KEY_VAR, None)
    return value.encode() if value else None


# record: a HookRecord, or whatever JSON object a file under hook/ holds (the job may forge it).
def _payload(record: Mapping[str, object]) -> bytes:
    body = {k: v for k, v in record.items() if k != MAC_FIELD}
    return json.dumps(body, sort_keys=True, default=str, separators=(",", ":")).encode()


def mac(record: Mapping[str, object], key: bytes) -> str:
    return hmac.new(key, _payload(record), hashlib.sha256).hexdigest()


def sign(record: HookRecord, key: bytes | None) -> HookRecord:
    """The record as written: JSON-normalised (what a reader gets back) with its MAC, or as it is
    without a key (a process the run's key did not reach)."""
    body: HookRecord = json.loads(json.dumps(record, default=str))
    if key:
        body[MAC_FIELD] = mac(body, key)
    return body


def why_not_signed(record: Any, file_name: str, key: bytes | None) -> str:
    """ "" when the record is the hook's (its MAC verifies and it sits under its own pid), else why not.
    Without a key (a runner that gave none) every JSON object is taken, as before signing."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if not key:
        return ""
    given = record.get(MAC_FIELD)
    if not isinstance(given, str):
        return "no signature"
    if not hmac.compare_digest(given, mac(record, key)):
        return "signature does not verify"
    m = _RECORD_NAME.match(file_name)
    if m is None or str(record.get("pid")) != m["pid"]:
        return f"signed for pid {record.get('pid')}, found as {file_name}"
    return ""


def sort_records(
    found: list[tuple[str, Any]], key: bytes | None
) -> tuple[list[HookRecord], list[dict[str, str]]]:
    """(the hook's records without their MAC, the others as {"file", "why"}) from (file name,
    parsed JSON) pairs (`why_not_signed`)."""
    trusted: list[HookRecord] = []
    forged: list[dict[str, str]] = []
    for name, record in found:
        why = why_not_signed(record, name, key)
        if why:
            forged.append({"file": name, "why": why})
            continue
        trusted.append(_without_mac(record))
    return trusted, forged


def _without_mac(record: HookRecord) -> HookRecord:
    body = record.copy()
    body.pop(MAC_FIELD, None)
    return body
