"""Log settings applied to the serve_app logger."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from serve_app.observability.log_settings import LogSettings
from serve_app.observability.python_logging import LOGGER, TritonFormatter, apply


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))


@pytest.fixture
def records() -> Iterator[Records]:
    logger = logging.getLogger(LOGGER)
    handler = Records()
    handler.setFormatter(TritonFormatter())
    logger.addHandler(handler)
    level = logger.level
    try:
        yield handler
    finally:
        apply(LogSettings())
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_each_kind_is_switched_on_and_off(records: Records) -> None:
    log = logging.getLogger(LOGGER)
    apply(LogSettings(log_info=False, log_error=False, log_verbose_level=1))
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    assert [r.getMessage() for r in records.records] == ["d", "w"]


def test_formats(records: Records) -> None:
    log = logging.getLogger(LOGGER)
    apply(LogSettings())
    log.warning("plain")
    apply(LogSettings(log_format="ISO8601"))
    log.warning("iso")
    default, iso = records.lines
    assert default.startswith("W") and default.endswith("] plain") and " test_python_logging.py:" in default
    assert iso[4] == "-" and "Z W test_python_logging.py:" in iso and iso.endswith("] iso")


def test_model_processes_get_the_start_up_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model's replica finds the server's start-up log settings in its environment and applies them."""
    from serve_app.observability import python_logging

    settings = LogSettings(log_info=False, log_verbose_level=2, log_format="ISO8601")
    for key, value in python_logging.to_env(settings).items():
        monkeypatch.setenv(key, value)
    logger = logging.getLogger(LOGGER)
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    try:
        python_logging.install_from_env()
        gate = next(f for f in logger.filters if isinstance(f, python_logging.LevelGate))
        assert gate.settings == settings
        assert logger.level == logging.DEBUG
    finally:
        for handler in logger.handlers:
            if handler not in handlers:
                logger.removeHandler(handler)
        logger.propagate, logger.level = propagate, level
        apply(LogSettings())
