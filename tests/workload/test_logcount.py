"""IllegalWork message counting with the real logging module (no DeepSpeed needed)."""

from __future__ import annotations

import io
import itertools
import logging
from collections.abc import Iterator

import pytest

from repro.workload import logcount

WARN_LINE = (
    "[Rank 0] WARNING: Runtime Error while waiting the collective all-gather, possibly due to "
    "the _IllegalWork"
)
ERROR_LINE = "[Rank 0] Error message: Illegal to call wait on IllegalWork object"
_names = itertools.count()


def _one_failure(logger: logging.Logger) -> None:
    """What DeepSpeed's MiCS handle logs for one failed wait (log_dist at INFO)."""
    logger.log(logging.INFO, WARN_LINE)
    logger.log(logging.INFO, ERROR_LINE)


def _set_level(logger: logging.Logger, level: int) -> None:
    """What DeepSpeed's set_log_level_from_string does: the logger and every handler."""
    logger.setLevel(level)
    for handler in logger.handlers:
        handler.setLevel(level)


@pytest.fixture
def ds_logger(request: pytest.FixtureRequest) -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger set up the way DeepSpeed's LoggerFactory does it, at the level the test asks for."""
    name = f"test-deepspeed-{next(_names)}"
    logger = logging.getLogger(name)
    level = getattr(request, "param", logging.WARNING)
    logger.setLevel(level)
    logger.propagate = False
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setLevel(level)
    logger.addHandler(handler)
    yield logger, stream
    logcount.uninstall(name)
    logger.removeHandler(handler)


def test_counts_failures_the_console_never_shows(ds_logger: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = ds_logger  # WARNING: DeepSpeed 0.19.6's default
    counter = logcount.install(logger.name)
    _one_failure(logger)
    _one_failure(logger)
    assert (counter.failures, counter.lines) == (2, 4)
    assert stream.getvalue() == ""


@pytest.mark.parametrize("ds_logger", [logging.INFO], indirect=True)
def test_counts_and_still_shows_at_info(ds_logger: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = ds_logger  # INFO: DeepSpeed 0.13.x's default
    counter = logcount.install(logger.name)
    _one_failure(logger)
    assert counter.failures == 1
    assert stream.getvalue().splitlines() == [WARN_LINE, ERROR_LINE]


def test_console_filtering_follows_later_level_changes(ds_logger: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = ds_logger
    counter = logcount.install(logger.name)
    _set_level(logger, logging.INFO)  # e.g. the engine applying a config's log level
    _one_failure(logger)
    _set_level(logger, logging.ERROR)
    _one_failure(logger)
    logger.warning("ordinary warning")
    assert counter.failures == 2
    assert stream.getvalue().splitlines() == [WARN_LINE, ERROR_LINE]


def test_other_messages_are_not_counted(ds_logger: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = ds_logger
    counter = logcount.install(logger.name)
    logger.warning("Error message: something else entirely")
    logger.info("Illegal to call wait on a work object")
    logger.debug("debug chatter")
    assert (counter.failures, counter.lines) == (0, 0)
    assert stream.getvalue().splitlines() == ["Error message: something else entirely"]


def test_install_is_idempotent_and_uninstall_restores(ds_logger: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = ds_logger
    counter = logcount.install(logger.name)
    assert logcount.install(logger.name) is counter
    _one_failure(logger)
    assert counter.failures == 1  # one filter, not two
    assert logcount.uninstall(logger.name) is counter
    assert "isEnabledFor" not in vars(logger)
    _one_failure(logger)
    assert counter.failures == 1
    assert not logger.isEnabledFor(logging.INFO)


def test_logging_disable_still_silences(ds_logger: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = ds_logger
    counter = logcount.install(logger.name)
    logging.disable(logging.CRITICAL)
    try:
        logger.error("hidden")
        _one_failure(logger)
    finally:
        logging.disable(logging.NOTSET)
    assert stream.getvalue() == ""
    assert counter.failures == 0
