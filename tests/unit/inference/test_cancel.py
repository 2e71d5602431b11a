"""A request's cancel signal: fires once, tells its listeners, crosses a pickle as its flag alone."""

from __future__ import annotations

import pickle

from serve_app.inference.cancel import CancelSignal


def test_listeners_run_once_when_it_fires() -> None:
    signal = CancelSignal()
    calls: list[str] = []
    signal.listen(lambda: calls.append("a"))
    stop = signal.listen(lambda: calls.append("b"))
    stop()
    assert not signal.fired
    signal.fire()
    signal.fire()
    assert signal.fired and calls == ["a"]


def test_a_listener_added_after_it_fired_runs_at_once() -> None:
    signal = CancelSignal()
    signal.fire()
    calls: list[int] = []
    signal.listen(lambda: calls.append(1))()
    assert calls == [1]


def test_a_pickled_signal_keeps_its_flag_and_leaves_its_listeners_behind() -> None:
    signal = CancelSignal()
    calls: list[int] = []
    signal.listen(lambda: calls.append(1))
    copy = pickle.loads(pickle.dumps(signal))
    assert isinstance(copy, CancelSignal) and not copy.fired
    copy.fire()
    assert calls == []  # the copy's firing is the channel's to forward
    signal.fire()
    assert pickle.loads(pickle.dumps(signal)).fired
