"""`assert_never` for every Python the code runs on (the host and the envs from 3.9).

Closed sets (Outcome, Signature, the verdicts) are Enums; every branch over one ends in
`assert_never(value)`, so a new member makes mypy name each place that must handle it. At run
time it is a plain failure naming the member nobody handled.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING or sys.version_info >= (3, 11):
    from typing import assert_never as assert_never
else:  # pragma: no cover - Python < 3.11 only
    from typing import NoReturn

    def assert_never(value: object) -> NoReturn:
        raise AssertionError(f"unhandled member of a closed set: {value!r}")
