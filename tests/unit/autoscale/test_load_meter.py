"""LoadMeter: busy fraction, queue delay and slots over a sliding window, on a fake clock."""

from __future__ import annotations

import pytest

from serve_app.autoscale import BACKLOG, BUSY, LIVE_SEQUENCES, QUEUE_DELAY_US, SLOTS, LoadMeter


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@pytest.fixture
def clock() -> Clock:
    return Clock()


def meter_at_full_window(clock: Clock, window_s: float = 5.0) -> LoadMeter:
    """A meter old enough that its window is full."""
    meter = LoadMeter(clock, window_s=window_s)
    clock.advance(window_s)
    return meter


def test_idle_meter_reports_zero_and_only_the_two_base_metrics(clock: Clock) -> None:
    meter = meter_at_full_window(clock)
    assert meter.metrics() == {BUSY: 0.0, QUEUE_DELAY_US: 0.0}


def test_fresh_meter_reports_nothing_busy_and_busy_when_executing(clock: Clock) -> None:
    meter = LoadMeter(clock)
    assert meter.metrics()[BUSY] == 0.0
    meter.begin()
    assert meter.metrics()[BUSY] == 1.0  # no time has passed: executing is all it has done


def test_busy_is_the_fraction_of_the_window_spent_executing(clock: Clock) -> None:
    meter = meter_at_full_window(clock)
    meter.begin()
    clock.advance(1.0)
    meter.end()
    clock.advance(1.0)
    meter.begin()
    clock.advance(0.5)
    meter.end()
    clock.advance(2.5)
    assert meter.metrics()[BUSY] == pytest.approx(1.5 / 5.0)


def test_busy_counts_an_execution_still_running(clock: Clock) -> None:
    meter = meter_at_full_window(clock)
    meter.begin()
    clock.advance(2.0)
    assert meter.metrics()[BUSY] == pytest.approx(2.0 / 5.0)
    clock.advance(10.0)
    assert meter.metrics()[BUSY] == 1.0  # running for longer than the window


def test_busy_forgets_executions_that_left_the_window(clock: Clock) -> None:
    meter = meter_at_full_window(clock)
    meter.begin()
    clock.advance(2.0)
    meter.end()
    clock.advance(4.0)  # the execution ran over [-6, -4]; the window is [-5, 0]
    assert meter.metrics()[BUSY] == pytest.approx(1.0 / 5.0)
    clock.advance(1.0)
    assert meter.metrics()[BUSY] == 0.0


def test_busy_of_a_young_meter_is_over_its_age(clock: Clock) -> None:
    meter = LoadMeter(clock, window_s=5.0)
    meter.begin()
    clock.advance(1.0)
    meter.end()
    assert meter.metrics()[BUSY] == 1.0  # busy for all of its one second, not 1/5
    clock.advance(1.0)
    assert meter.metrics()[BUSY] == pytest.approx(0.5)


def test_overlapping_executions_count_their_union_once(clock: Clock) -> None:
    meter = meter_at_full_window(clock)
    meter.begin()
    clock.advance(1.0)
    meter.begin()  # overlaps the first
    clock.advance(1.0)
    meter.end()
    clock.advance(1.0)
    meter.end()
    clock.advance(2.0)
    assert meter.metrics()[BUSY] == pytest.approx(3.0 / 5.0)


def test_end_without_begin_is_ignored(clock: Clock) -> None:
    meter = meter_at_full_window(clock)
    meter.end()
    clock.advance(1.0)
    assert meter.metrics()[BUSY] == 0.0
    meter.begin()
    clock.advance(1.0)
    meter.end()
    meter.end()  # one too many
    assert meter.metrics()[BUSY] == pytest.approx(1.0 / 5.0)


def test_executing_context_ends_even_when_the_block_raises(clock: Clock) -> None:
    meter = meter_at_full_window(clock)
    with pytest.raises(RuntimeError), meter.executing():
        clock.advance(1.0)
        raise RuntimeError("backend failed")
    clock.advance(1.0)
    assert meter.metrics()[BUSY] == pytest.approx(1.0 / 5.0)  # not still running


def test_queue_delay_is_the_mean_over_the_window(clock: Clock) -> None:
    meter = meter_at_full_window(clock)
    meter.queued(100.0)
    clock.advance(1.0)
    meter.queued(300.0)
    assert meter.metrics()[QUEUE_DELAY_US] == pytest.approx(200.0)
    clock.advance(4.5)  # the first left the window
    assert meter.metrics()[QUEUE_DELAY_US] == pytest.approx(300.0)
    clock.advance(1.0)
    assert meter.metrics()[QUEUE_DELAY_US] == 0.0  # none in the window


def test_the_batches_of_one_call_count_one_each(clock: Clock) -> None:
    meter = meter_at_full_window(clock)
    meter.queued(100.0, 200.0, -5.0)
    meter.queued()
    assert meter.metrics()[QUEUE_DELAY_US] == pytest.approx(100.0)
    assert len(meter._delays) == 3


def test_negative_queue_delay_counts_as_zero(clock: Clock) -> None:
    meter = meter_at_full_window(clock)
    meter.queued(-50.0)
    meter.queued(100.0)
    assert meter.metrics()[QUEUE_DELAY_US] == pytest.approx(50.0)


def test_sequence_instances_report_their_slots(clock: Clock) -> None:
    meter = meter_at_full_window(clock)
    meter.set_slots(3, 4, backlog=2)
    assert meter.metrics() == {BUSY: 0.0, QUEUE_DELAY_US: 0.0, LIVE_SEQUENCES: 3.0, SLOTS: 4.0, BACKLOG: 2.0}
    meter.set_slots(0, 4)
    m = meter.metrics()
    assert (m[LIVE_SEQUENCES], m[SLOTS], m[BACKLOG]) == (0.0, 4.0, 0.0)


@pytest.mark.parametrize(("live", "total", "backlog"), [(-1, 4, 0), (1, -4, 0), (1, 4, -1), (5, 4, 0)])
def test_impossible_slot_counts_are_rejected(clock: Clock, live: int, total: int, backlog: int) -> None:
    with pytest.raises(ValueError):
        LoadMeter(clock).set_slots(live, total, backlog)


def test_metric_values_are_floats_as_serve_requires(clock: Clock) -> None:
    meter = meter_at_full_window(clock)
    meter.set_slots(1, 2)
    assert all(type(v) is float for v in meter.metrics().values())


@pytest.mark.parametrize("window", [0.0, -1.0])
def test_window_must_be_positive(window: float) -> None:
    with pytest.raises(ValueError):
        LoadMeter(Clock(), window_s=window)


def test_old_entries_do_not_accumulate(clock: Clock) -> None:
    meter = meter_at_full_window(clock, window_s=1.0)
    for _ in range(1000):
        meter.begin()
        clock.advance(0.01)
        meter.end()
        meter.queued(10.0)
        clock.advance(0.01)
    assert len(meter._spans) <= 51 and len(meter._delays) <= 51
    assert meter.metrics()[BUSY] == pytest.approx(0.5, abs=0.02)
