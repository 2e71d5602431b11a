"""The request budget's reading of the scheduler's counts: the busiest thread's time on a CPU and waiting for one."""

from __future__ import annotations

import os

import pytest

from scripts.request_budget import busiest, busy_jiffies, sched_ns


def test_the_busiest_thread_of_the_window_is_the_one_that_ran_most_in_it() -> None:
    before = {1: (5_000, 0), 2: (0, 0)}
    after = {1: (5_100, 900), 2: (600, 300), 3: (200, 0)}  # 1 ran most before the window, 2 within it
    on_cpu, waiting = busiest(before, after, 1_000)
    assert (on_cpu, waiting) == pytest.approx((0.6, 0.3))


def test_an_empty_window_reads_as_idle() -> None:
    assert busiest({}, {}, 1_000) == (0.0, 0.0)
    assert busiest({1: (0, 0)}, {1: (10, 0)}, 0) == (0.0, 0.0)


def test_this_process_threads_and_the_machine_are_read() -> None:
    threads = sched_ns(os.getpid())
    assert threads and all(on_cpu >= 0 and waiting >= 0 for on_cpu, waiting in threads.values())
    busy, total = busy_jiffies()
    assert 0 <= busy <= total
