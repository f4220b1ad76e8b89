"""Count DeepSpeed's IllegalWork log messages whatever DeepSpeed's log level is.

DeepSpeed reports the swallowed `_IllegalWork` exception through its "DeepSpeed" logger with
`log_dist(..., ranks=[0])` at INFO. DeepSpeed 0.13.x's logger is at INFO so users see it; in
0.19.6 the logger defaults to WARNING, so the message is never shown although it is emitted.

One failed wait logs two lines:
    [Rank 0] WARNING: Runtime Error while waiting the collective all-gather, possibly due to the _IllegalWork
    [Rank 0] Error message: Illegal to call wait on IllegalWork object
`failures` counts the second kind (one per failed wait); `lines` counts every line that mentions
IllegalWork. Only rank 0 logs them, so other ranks count 0; the launcher sums over ranks.

How it counts without changing the console: the logger's own `isEnabledFor` is shadowed on the
instance so records of every level reach the logger's filters; a logger-level filter counts them
and then drops anything below the logger's effective level, exactly what the level would have
dropped. The logger's level and its handlers are left alone, so DeepSpeed may still change them
(its engine sets the level from the config) and what is printed follows.

Whose message it is: a custom job's code can log to the same logger. Given `origin` (the folder of
the DeepSpeed package, as the job hook gives it), a message counts only when the code that logged
it is in that folder (the first frame outside the logging module and DeepSpeed's own logging
helpers, e.g. deepspeed/runtime/zero/mics.py); others go to `foreign`. The suite runs our own
model, which logs nothing of the kind, and counts without an origin.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from types import FrameType

DEEPSPEED_LOGGER = "DeepSpeed"
MARKER = "IllegalWork"
_FAILURE = re.compile(r"Error message: .*IllegalWork")
_LOGGING_FILE = os.path.normcase(os.path.abspath(logging.__file__))
_DEEPSPEED_LOG_HELPER = os.path.join("deepspeed", "utils", "logging.py")
_THIS_FILE = os.path.normcase(os.path.abspath(__file__))


def logged_from() -> str:
    """The file whose code made the logging call in progress: the first frame that is not the
    logging module's nor DeepSpeed's log helper (log_dist and friends)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        path = os.path.normcase(os.path.abspath(frame.f_code.co_filename))
        if path != _LOGGING_FILE and not path.endswith(_DEEPSPEED_LOG_HELPER) and path != _THIS_FILE:
            return path
        frame = frame.f_back
    return ""


class IllegalWorkCounter(logging.Filter):
    def __init__(self, logger: logging.Logger, origin: str | None = None) -> None:
        super().__init__()
        self.logger = logger
        self.origin = os.path.join(os.path.normcase(os.path.abspath(origin)), "") if origin else None
        self.failures = 0
        self.lines = 0
        self.foreign = 0  # IllegalWork lines logged by code outside `origin` (a job's own): not counted

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if MARKER in message:
            if self.origin is not None and not logged_from().startswith(self.origin):
                self.foreign += 1
            else:
                self.lines += 1
                if _FAILURE.search(message):
                    self.failures += 1
        return record.levelno >= self.logger.getEffectiveLevel()


def _let_everything_through(logger: logging.Logger) -> None:
    def is_enabled_for(level: int) -> bool:
        return not logger.disabled and level > logging.root.manager.disable

    setattr(logger, "isEnabledFor", is_enabled_for)  # noqa: B010 - mypy forbids assigning a method


_INSTALLED: dict[str, IllegalWorkCounter] = {}


def install(name: str = DEEPSPEED_LOGGER, origin: str | None = None) -> IllegalWorkCounter:
    """Start counting on logger `name` (idempotent). Works before or after DeepSpeed is imported:
    DeepSpeed configures the same logger object later and the counter stays attached. `origin`:
    count only messages logged by code under this folder (module docstring)."""
    counter = _INSTALLED.get(name)
    if counter is not None:
        return counter
    logger = logging.getLogger(name)
    counter = IllegalWorkCounter(logger, origin)
    logger.addFilter(counter)
    _let_everything_through(logger)
    _INSTALLED[name] = counter
    return counter


def uninstall(name: str = DEEPSPEED_LOGGER) -> IllegalWorkCounter | None:
    counter = _INSTALLED.pop(name, None)
    if counter is not None:
        counter.logger.removeFilter(counter)
        vars(counter.logger).pop("isEnabledFor", None)
    return counter
