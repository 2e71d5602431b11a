"""Triton's logging extension: the server's log settings, how a request changes them, and their effect on
Python's logging."""

from serve_app.logs.settings import LogSettings, parse_log_update

__all__ = ["LogSettings", "parse_log_update"]
