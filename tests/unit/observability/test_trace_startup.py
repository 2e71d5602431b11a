"""Triton's --trace-config entries."""

from __future__ import annotations

import pytest

from serve_app.errors import InvalidArgument
from serve_app.observability.trace_settings import DEFAULT_URL, ExportConfig, TraceLevel
from serve_app.observability.trace_startup import TraceStartup


def test_defaults_are_tritons() -> None:
    s = TraceStartup.parse([])
    assert (s.level, s.rate, s.count, s.export) == (TraceLevel.OFF, 1000, -1, ExportConfig())
    assert s.export.url == DEFAULT_URL


def test_entries() -> None:
    s = TraceStartup.parse(
        [
            "mode=opentelemetry",
            "level=TIMESTAMPS",
            "level=TENSORS",
            "rate=5",
            "count=3",
            "opentelemetry,url=localhost:4318/v1/traces",
            "opentelemetry,resource=service.name=test=x",
            "opentelemetry,bsp_schedule_delay=0",
            "triton,file=/tmp/t.json",
            "triton,log-frequency=50",
        ]
    )
    assert s.level == TraceLevel.TIMESTAMPS | TraceLevel.TENSORS
    assert (s.rate, s.count, s.log_frequency) == (5, 3, 50)
    assert s.export == ExportConfig("localhost:4318/v1/traces", (("service.name", "test=x"),), bsp_schedule_delay=0)


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("mode=triton", "is not supported"),
        ("rate=x", "is not an integer"),
        ("count=-2", "out of range"),
        ("level=LOUD", "level must be OFF, TIMESTAMPS or TENSORS"),
        ("zipkin,url=x", "unknown trace mode 'zipkin'"),
        ("opentelemetry,resource=novalue", "resource=<key>=<value>"),
        ("nosetting", "expected [<mode>,]<setting>=<value>"),
        ("opentelemetry,bsp_max_export_batch_size=4096", "must not exceed"),
    ],
)
def test_bad_entries(entry: str, fragment: str) -> None:
    with pytest.raises(InvalidArgument, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        TraceStartup.parse([entry])
