"""Log settings applied to Python's logging: the ``serve_app`` logger, in the process that applies them.

Triton switches info, warning and error messages on and off one by one and has a verbose level;
here a filter on the logger lets through what is on (errors and criticals go with ``log_error``)
and a verbose level above 0 lets debug messages through.  The format is Triton's:
``I1126 12:37:19.123456 4242 gateway.py:87] message`` (default) or
``2026-11-26T12:37:19Z I gateway.py:87] message`` (ISO8601).

:func:`install` (at start, in the server's own processes) gives the logger a handler of its own,
to stderr or to ``log_file``; :func:`apply` changes the levels and the format at run time.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import asdict

from serve_app.observability.log_settings import LogSettings

LOGGER = "serve_app"
# The server's start-up log settings, as the model processes it starts find them in their environment.
ENV = "SERVE_APP_LOG_SETTINGS"
_LETTERS = {logging.DEBUG: "V", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "E"}


class TritonFormatter(logging.Formatter):
    def __init__(self, iso8601: bool = False) -> None:
        super().__init__()
        self.iso8601 = iso8601

    def format(self, record: logging.LogRecord) -> str:
        letter = _LETTERS.get(record.levelno, "I")
        where = f"{record.filename}:{record.lineno}]"
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if self.iso8601:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            return f"{stamp} {letter} {where} {message}"
        local = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        return f"{letter}{time.strftime('%m%d %H:%M:%S', local)}.{micros:06d} {record.process} {where} {message}"


class LevelGate(logging.Filter):
    """Lets through the messages whose kind is switched on."""

    def __init__(self) -> None:
        super().__init__()
        self.settings = LogSettings()

    def filter(self, record: logging.LogRecord) -> bool:
        s = self.settings
        if record.levelno >= logging.ERROR:
            return s.log_error
        if record.levelno >= logging.WARNING:
            return s.log_warning
        if record.levelno >= logging.INFO:
            return s.log_info
        return s.log_verbose_level > 0


def _gate(logger: logging.Logger) -> LevelGate:
    for f in logger.filters:
        if isinstance(f, LevelGate):
            return f
    gate = LevelGate()
    logger.addFilter(gate)
    return gate


def apply(settings: LogSettings) -> None:
    """Switch the ``serve_app`` logger's kinds of messages and its format (of the handler :func:`install` gave it)."""
    logger = logging.getLogger(LOGGER)
    _gate(logger).settings = settings
    logger.setLevel(logging.DEBUG if settings.log_verbose_level > 0 else logging.INFO)
    for handler in logger.handlers:
        if isinstance(handler.formatter, TritonFormatter):
            handler.formatter.iso8601 = settings.log_format == "ISO8601"


def install(settings: LogSettings) -> None:
    """At a server process's start: the logger writes, in Triton's format, to stderr or ``log_file`` (once)."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(h.formatter, TritonFormatter) for h in logger.handlers):
        handler: logging.Handler = (
            logging.FileHandler(settings.log_file) if settings.log_file else logging.StreamHandler(sys.stderr)
        )
        handler.setFormatter(TritonFormatter())
        logger.addHandler(handler)
        logger.propagate = False
    apply(settings)


def to_env(settings: LogSettings) -> dict[str, str]:
    """Environment variables that carry ``settings`` to a process the server starts (a model's replica)."""
    return {ENV: json.dumps(asdict(settings), separators=(",", ":"))}


def install_from_env() -> None:
    """In a model process: :func:`install` with the server's start-up settings, when it was given them."""
    raw = os.environ.get(ENV)
    if raw:
        install(LogSettings(**json.loads(raw)))
