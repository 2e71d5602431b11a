"""The trace settings store and sampling, against Triton's TraceManager rules (qa/L0_trace's sequences)."""

from __future__ import annotations

import pytest

from serve_app.errors import InvalidArgument
from serve_app.observability.trace_settings import NewSetting, TraceLevel, TraceSetting, TraceSettingsStore

TS = TraceLevel.TIMESTAMPS


def store(level: TraceLevel = TS, rate: int = 1, count: int = -1) -> TraceSettingsStore:
    return TraceSettingsStore(TraceSetting(level, rate, count, 0))


def values(s: TraceSetting) -> tuple[list[str], int, int, int]:
    return s.level.names(), s.rate, s.count, s.log_frequency


def test_a_model_without_its_own_setting_uses_the_global_object() -> None:
    st = store()
    assert st.setting_for("simple") is st.global_setting


def test_global_update_reaches_the_fields_a_model_did_not_specify() -> None:
    st = store()
    st.update("simple", NewSetting(rate=12, log_frequency=34))
    st.update("", NewSetting(level=TS | TraceLevel.TENSORS, count=78))
    assert values(st.setting_for("simple")) == (["TIMESTAMPS", "TENSORS"], 12, 78, 34)


def test_clearing_follows_tritons_clear_sequence() -> None:
    # qa/L0_trace trace_endpoint_test.py test_http_clear_settings
    st = store()
    st.update("simple", NewSetting(rate=12, log_frequency=34))
    st.update("", NewSetting(rate=56, count=78, level=TraceLevel.OFF))
    st.update("", NewSetting(clear_rate=True, clear_count=True))
    assert values(st.setting_for("")) == (["OFF"], 1, -1, 0)
    assert values(st.setting_for("simple")) == (["OFF"], 12, -1, 34)
    st.update("simple", NewSetting(clear_rate=True, clear_level=True))
    assert values(st.setting_for("simple")) == (["OFF"], 1, -1, 34)
    st.update("simple", NewSetting(clear_log_frequency=True))
    assert st.setting_for("simple") is st.global_setting  # nothing of its own left


def test_an_invalid_setting_is_refused_unless_it_turns_tracing_off() -> None:
    st = store()
    message = r"^Attempting to set invalid trace setting :sample rate must be non-zero$"
    with pytest.raises(InvalidArgument, match=message):
        st.check("", NewSetting(rate=0))
    st.check("", NewSetting(rate=0, level=TraceLevel.OFF))
    assert st.global_setting.rate == 1  # check changes nothing


def test_rate_samples_every_nth_request_while_count_lasts() -> None:
    setting = TraceSetting(TS, rate=3, count=2, log_frequency=0)
    assert [setting.sample() for _ in range(9)] == [False, False, True, False, False, True, False, False, False]
    assert setting.count == 0


def test_a_propagated_context_is_traced_regardless_of_rate_and_count() -> None:
    assert TraceSetting(TS, rate=0, count=-1, log_frequency=0).sample(propagated=True)
    assert TraceSetting(TS, rate=5, count=0, log_frequency=0).sample(propagated=True)
    assert not TraceSetting(TS, rate=0, count=-1, log_frequency=0).sample()


def test_off_samples_nothing() -> None:
    setting = TraceSetting(TraceLevel.OFF, rate=1, count=-1, log_frequency=0)
    assert not any(setting.sample() for _ in range(5))


def test_an_update_starts_the_counters_again() -> None:
    st = store(rate=2)
    st.global_setting.sample()
    st.update("", NewSetting(count=5))
    assert st.global_setting.seen == 0 and st.global_setting.count == 5
