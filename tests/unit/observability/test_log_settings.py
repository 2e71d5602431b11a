"""Log setting requests with Triton's rules and messages, per protocol."""

from __future__ import annotations

import pytest

from serve_app.errors import InvalidArgument, ServeError, Unavailable, Unsupported
from serve_app.observability.log_settings import NO_VALUE, LogSettings, parse_log_update


def test_changes() -> None:
    new = parse_log_update(LogSettings(), {"log_info": False, "log_verbose_level": 2, "log_format": "ISO8601"})
    assert new == LogSettings(log_info=False, log_verbose_level=2, log_format="ISO8601")


def test_http_null_leaves_a_setting_alone() -> None:
    assert parse_log_update(LogSettings(), {"log_info": None, "log_file": None}, http=True) == LogSettings()


@pytest.mark.parametrize(
    ("values", "http", "error", "message"),
    [
        ({"log_file": "x"}, True, Unsupported, "log file location can not be updated through network protocol"),
        ({"log_file": NO_VALUE}, False, Unsupported, "log file location can not be updated through network protocol"),
        ({"log_info": 1}, False, InvalidArgument, "expect boolean for 'log_info'"),
        ({"log_warning": NO_VALUE}, False, InvalidArgument, "expect boolean for 'log_warning'"),
        ({"log_verbose_level": True}, False, InvalidArgument, "expect int32 for 'log_verbose_level'"),
        ({"log_format": 3}, False, InvalidArgument, "expect string for 'log_format'"),
        ({"log_format": "xml"}, False, InvalidArgument, "invalid argument for log_format, got: xml"),
        ({"log_format": "xml"}, True, Unavailable, "invalid argument for --log_format, got: xml"),
        ({"log_error": "yes"}, True, InvalidArgument, "attempt to access JSON non-boolean as boolean"),
    ],
)
def test_tritons_messages(values: dict[str, object], http: bool, error: type[ServeError], message: str) -> None:
    with pytest.raises(error) as info:
        parse_log_update(LogSettings(), values, http=http)
    assert info.value.message == message


def test_http_verbose_level_is_an_unsigned_integer() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_log_update(LogSettings(), {"log_verbose_level": -1}, http=True)
    assert info.value.message == "attempt to access JSON non-unsigned-integer as unsigned-integer"
