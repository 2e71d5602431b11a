"""StopsOnShutdown: Serve's call of ``__del__`` stops the deployment once; the collector's call does nothing."""

from __future__ import annotations

import asyncio
import gc
import inspect
import warnings

from serve_app.rayserve.shutdown import StopsOnShutdown


class Deployment(StopsOnShutdown):
    def __init__(self) -> None:
        self.stops = 0

    async def stop_once(self) -> None:
        await asyncio.sleep(0)
        self.stops += 1


async def serve_calls_destructor(obj: object) -> None:
    """What Serve's replica does at shutdown: call ``__del__`` and await a coroutine it returns."""
    result = obj.__del__()  # type: ignore[attr-defined]
    if inspect.iscoroutine(result):
        await result


async def test_serve_shutdown_stops_once_then_the_collector_finds_nothing_to_do() -> None:
    d = Deployment()
    await serve_calls_destructor(d)
    assert d.stops == 1
    await serve_calls_destructor(d)
    await d.stop()
    assert d.stops == 1
    assert d.__del__() is None


async def test_an_explicit_stop_leaves_serves_call_nothing_to_do() -> None:
    d = Deployment()
    await d.stop()
    await serve_calls_destructor(d)
    assert d.stops == 1


def test_collected_outside_an_event_loop_it_makes_no_coroutine() -> None:
    d = Deployment()
    assert d.__del__() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del d
        gc.collect()
