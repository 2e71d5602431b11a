"""Trace setting requests read with Triton's rules and messages, and answers in Triton's shape."""

from __future__ import annotations

import pytest

from serve_app.errors import InvalidArgument, ServeError, Unsupported
from serve_app.observability.trace_requests import parse_trace_update, render_setting
from serve_app.observability.trace_settings import ExportConfig, NewSetting, TraceLevel, TraceSetting


def test_values_become_an_update() -> None:
    new = parse_trace_update({"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": ["12"], "trace_count": None})
    assert new == NewSetting(level=TraceLevel.TIMESTAMPS | TraceLevel.TENSORS, rate=12, clear_count=True)


def test_an_empty_level_list_clears_and_unknown_levels_are_ignored() -> None:
    assert parse_trace_update({"trace_level": []}) == NewSetting(clear_level=True)
    assert parse_trace_update({"trace_level": ["FOO"]}) == NewSetting()
    assert parse_trace_update({"unknown": ["1"]}) == NewSetting()


def test_numbers_are_read_as_cpp_stoi_reads_them() -> None:
    assert parse_trace_update({"trace_rate": [" 7abc"]}).rate == 7
    assert parse_trace_update({"trace_rate": ["-1"]}).rate == 2**32 - 1  # stoi's int into a uint32


@pytest.mark.parametrize(
    ("values", "error", "message"),
    [
        ({"trace_file": ["x.log"]}, Unsupported, "trace file location can not be updated through network protocol"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, InvalidArgument, "Expect only one trace level 'OFF' is specified"),
        ({"trace_rate": ["abc"]}, InvalidArgument, "Unable to parse 'trace_rate', got: abc"),
        (
            {"trace_rate": ["99999999999"]},
            InvalidArgument,
            "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999",
        ),
        ({"trace_count": ["-2"]}, InvalidArgument, "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"),
        ({"log_frequency": ["1", "2"]}, InvalidArgument, "expect only 1 value for 'log_frequency'"),
    ],
)
def test_tritons_messages(values: dict[str, list[str]], error: type[ServeError], message: str) -> None:
    with pytest.raises(error) as info:
        parse_trace_update(values)
    assert info.value.message == message


def test_the_http_count_message_has_no_space_after_got() -> None:
    with pytest.raises(InvalidArgument, match=r"Expecting value >= -1, got:-2$"):
        parse_trace_update({"trace_count": ["-2"]}, http=True)


def test_render_in_opentelemetry_mode() -> None:
    setting = TraceSetting(TraceLevel.TIMESTAMPS, 1, -1, 0)
    export = ExportConfig(url="localhost:4318/v1/traces", resource=(("a", "b"), ("c", "d")))
    assert render_setting(setting, export) == [
        ("trace_level", ["TIMESTAMPS"]),
        ("trace_rate", ["1"]),
        ("trace_count", ["-1"]),
        ("trace_mode", ["opentelemetry"]),
        ("url", ["localhost:4318/v1/traces"]),
        ("resource", ["a=b", "c=d"]),
        ("bsp_max_queue_size", ["2048"]),
        ("bsp_schedule_delay", ["5000"]),
        ("bsp_max_export_batch_size", ["512"]),
    ]
