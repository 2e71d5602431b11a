"""The settings path both front ends share, and how front-end processes catch up with the owner's record."""

from __future__ import annotations

import pytest

from serve_app.errors import InvalidArgument
from serve_app.observability.diagnostics import Diagnostics, DiagnosticsLog
from serve_app.observability.log_settings import LogSettings
from serve_app.observability.trace_settings import NewSetting, TraceLevel
from serve_app.observability.trace_startup import TraceStartup


class Recorder:
    """A control that only records what it is asked to make apply (as the model manager would)."""

    def __init__(self) -> None:
        self.trace: list[tuple[str, NewSetting]] = []
        self.logs: list[LogSettings] = []

    async def update_trace(self, model: str, new: NewSetting) -> None:
        self.trace.append((model, new))

    async def update_logs(self, settings: LogSettings) -> None:
        self.logs.append(settings)


async def test_a_checked_change_goes_to_the_control() -> None:
    control = Recorder()
    d = Diagnostics(control=control)
    d.model_ready = lambda name: name == "m"
    await d.trace_setting("m", {"trace_rate": ["7"]})
    assert control.trace == [("m", NewSetting(rate=7))]
    with pytest.raises(InvalidArgument, match=r"^Request for unknown model : x$"):
        await d.trace_setting("x", None)
    with pytest.raises(InvalidArgument, match="sample rate must be non-zero"):
        await d.trace_setting("", {"trace_level": ["TIMESTAMPS"], "trace_rate": ["0"]})
    assert len(control.trace) == 1  # a refused change never reaches the control
    await d.log_settings({"log_info": False})
    assert control.logs == [LogSettings(log_info=False)]


async def test_in_process_a_change_applies_at_once() -> None:
    d = Diagnostics()
    answer = dict(await d.trace_setting("", {"trace_level": ["TIMESTAMPS"]}))
    assert answer["trace_level"] == ["TIMESTAMPS"]
    assert d.traces.global_setting.level == TraceLevel.TIMESTAMPS


def test_tracing_off_starts_no_trace() -> None:
    assert Diagnostics().start_trace("m", "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01", 0) is None


def test_front_ends_catch_up_with_the_record_in_order() -> None:
    record = DiagnosticsLog(TraceStartup(), LogSettings())
    record.record_trace("m", NewSetting(rate=12))
    record.record_trace("", NewSetting(level=TraceLevel.TIMESTAMPS, count=5))
    early, late = Diagnostics(), Diagnostics()
    early.catch_up(*record.snapshot())
    early.traces.global_setting.sample()  # its counters move; a repeated push must not reset them
    early.catch_up(*record.snapshot())
    assert early.traces.global_setting.seen == 1
    record.record_trace("m", NewSetting(clear_rate=True))
    for d in (early, late):
        d.catch_up(*record.snapshot())
        assert d.traces.setting_for("m") is d.traces.global_setting
        assert (d.traces.global_setting.level, d.traces.global_setting.count) == (TraceLevel.TIMESTAMPS, 5)


def test_the_owner_refuses_what_its_record_makes_invalid() -> None:
    record = DiagnosticsLog(TraceStartup(level=TraceLevel.TIMESTAMPS), LogSettings())
    with pytest.raises(InvalidArgument):
        record.record_trace("", NewSetting(rate=0))
    assert record.updates == []


def test_a_new_record_continues_from_the_settings_here() -> None:
    d = Diagnostics()
    old = DiagnosticsLog(TraceStartup(), LogSettings(), epoch=1)
    old.record_trace("", NewSetting(rate=3))
    d.catch_up(*old.snapshot())
    new = DiagnosticsLog(TraceStartup(), LogSettings(), epoch=2)
    new.record_trace("", NewSetting(count=4))
    d.catch_up(*new.snapshot())
    assert (d.traces.global_setting.rate, d.traces.global_setting.count) == (3, 4)
