"""A decoupled execution as an async stream: the model's responses as it sends them, from any thread.

The model's ``execute`` runs on the instance's thread and may return before
it has answered (its responses then come from threads of its own); each
response crosses to the event loop through a queue, and the stream ends once
every request of the execution has had its final response.  When ``execute``
returns before that, the stream says so (an item with index ``EXECUTED``), so
a batcher may send the instance its next batch, as Triton does.  Closing the
stream early (its client went away) marks the requests still open as
cancelled, which the model reads through ``is_cancelled()``; so does a
request's own cancel signal (``RequestPart.cancel``), which leaves its
responses flowing until the model's final one.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Executor

from serve_app.errors import as_serve_error
from serve_app.inference import custom_metrics
from serve_app.inference.execution import EXECUTED, Execution, PartResult
from serve_app.runtime.instance import ModelInstance


async def stream_execution(
    instance: ModelInstance, execution: Execution, thread: Executor
) -> AsyncGenerator[tuple[int, PartResult], None]:
    """(request index, response) pairs of ``execution`` on ``instance`` (``thread``: where it executes)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, PartResult]] = asyncio.Queue()
    open_parts = set(range(max(1, len(execution.parts))))
    cancelled: set[int] = set()

    def emit(index: int, part: PartResult) -> None:
        if not loop.is_closed():  # a model may send long after its stream was given up (and its loop gone)
            loop.call_soon_threadsafe(queue.put_nowait, (index, part))

    started = time.perf_counter_ns()
    # ``execute`` may answer from its own thread before it returns: responses are read while it runs.
    stops = [
        part.cancel.listen(functools.partial(cancelled.add, index))
        for index, part in enumerate(execution.parts)
        if part.cancel is not None
    ]
    run = loop.run_in_executor(thread, instance.stream, execution, emit, cancelled.__contains__)
    run.add_done_callback(functools.partial(_failed_run, emit, len(open_parts)))
    run.add_done_callback(lambda _: emit(EXECUTED, PartResult(final=False, empty=True)))
    try:
        while open_parts:
            index, part = await queue.get()
            if index == EXECUTED:
                yield index, part
                continue
            if index not in open_parts:
                continue  # after its final (a failure reported twice)
            if part.final:
                open_parts.discard(index)
                part.compute_ns = time.perf_counter_ns() - started
                part.custom_metrics = custom_metrics.REGISTRY.snapshot()  # what the model counted, to the gateway
            yield index, part
    finally:
        for stop in stops:
            stop()
        cancelled.update(open_parts)


def _failed_run(emit: Callable[[int, PartResult], None], count: int, run: asyncio.Future[None]) -> None:
    """Running the execution itself failed (not the model's code, whose errors the backend answers): every
    request of it ends with that error."""
    if run.cancelled() or run.exception() is None:
        return
    error = as_serve_error(run.exception() or RuntimeError("the execution failed"))
    for index in range(count):
        emit(index, PartResult(error=error, final=True))
