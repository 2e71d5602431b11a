"""A decoupled model with a dynamic batcher: several requests in one ``execute``, each with its own stream.

Triton's dynamic batcher batches a decoupled model's requests as it batches
any model's: ``execute`` gets several requests, each with its own response
sender.  Here the batching is the dynamic batcher's own
(:class:`~serve_app.scheduling.model_scheduler.ModelScheduler`, which keeps
each request's tensors); its dispatch runs a batch as one decoupled execution
and hands each response to the stream of the request it answers.

- An instance takes its next batch once ``execute`` returns (the execution's
  ``EXECUTED`` item), while the responses of the batch it ran may go on from
  the model's threads; the statistics count the batch and its requests then,
  as Triton's backend reports them when ``execute`` returns.
- A client that stops reading cancels its own request only (its cancel
  signal: ``is_cancelled()`` turns true for that request), and leaves the
  queue if it still waits there; the other requests of its batch go on.
- A model that sends nothing for ``response_timeout_s`` has the batch's open
  requests ended with UNAVAILABLE, as one request is by the unbatched scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

from serve_app.errors import ServeError, Unavailable, Unsupported, as_serve_error
from serve_app.inference.cancel import CancelSignal
from serve_app.inference.execution import EXECUTED, Execution, ExecutionResult, PartResult
from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, StreamItem
from serve_app.protos import model_config_pb2 as mc
from serve_app.scheduling.decoupled_scheduler import DECOUPLED_UNARY, Stream, stream_item
from serve_app.scheduling.model_scheduler import ModelScheduler


def batches_decoupled(config: mc.ModelConfig) -> bool:
    """Whether a decoupled model's requests are batched: it has a dynamic batcher, as in Triton."""
    return config.model_transaction_policy.decoupled and config.HasField("dynamic_batching")


@dataclass(eq=False, slots=True)
class _Sink:
    """Where a request's responses go until its client has read the final one."""

    arrival_ns: int
    items: asyncio.Queue[PartResult] = field(default_factory=asyncio.Queue)
    dispatched: bool = False  # part of a batch sent to an instance (errors now come as its responses)
    responded: bool = False


class BatchedDecoupledScheduler:
    def __init__(
        self,
        config: mc.ModelConfig,
        signature: ModelSignature,
        stream: Stream,
        *,
        capacity: int,
        response_timeout_s: float,
        max_queued: int = 0,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """``stream``: runs one execution on an instance, its responses as they come; ``capacity``: batches
        whose ``execute`` may run at once (the instances)."""
        self.signature = signature
        self._stream = stream
        self._timeout = response_timeout_s
        self._clock = clock
        self._all_outputs = tuple(signature.outputs)
        self._sinks: dict[CancelSignal, _Sink] = {}
        self._routes: set[asyncio.Task[None]] = set()  # batches whose responses are still coming
        self.batcher = ModelScheduler(
            config,
            signature,
            self._dispatch,
            capacity=capacity,
            max_queued=max_queued,
            per_request=True,
            clock=clock,
        )
        self.stats = self.batcher.stats

    @property
    def capacity(self) -> int:
        return self.batcher.capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        self.batcher.capacity = max(1, value)

    async def submit(self, request: InferRequest, options: RequestOptions, arrival_ns: int) -> InferResponse:
        """A decoupled model gives no single response: callers that need one use :meth:`submit_stream`."""
        raise Unsupported(DECOUPLED_UNARY)

    async def submit_stream(
        self, request: InferRequest, options: RequestOptions, arrival_ns: int
    ) -> AsyncGenerator[StreamItem, None]:
        """The request's responses as they come; the last one is final."""
        if request.cancel is None:
            request.cancel = CancelSignal()
        signal = request.cancel
        sink = _Sink(arrival_ns)
        self._sinks[signal] = sink
        queued = asyncio.get_running_loop().create_task(self._queue(request, options, arrival_ns, sink))
        finished = False
        try:
            while not finished:
                answer = await sink.items.get()
                finished = answer.final
                yield stream_item(answer, request, self.signature, self._all_outputs)
        finally:
            self._sinks.pop(signal, None)
            if not finished:
                signal.fire()  # this request only: the others of its batch go on
                queued.cancel()  # still in the queue: it leaves it

    async def _queue(self, request: InferRequest, options: RequestOptions, arrival_ns: int, sink: _Sink) -> None:
        """Through the dynamic batcher; a request refused or timed out there ends with that error."""
        try:
            await self.batcher.submit(request, options, arrival_ns)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not sink.dispatched:
                sink.items.put_nowait(PartResult(error=as_serve_error(exc), final=True))

    # -- a batch on an instance --------------------------------------------------------
    async def _dispatch(self, executions: list[Execution]) -> list[ExecutionResult]:
        return [await self._run(execution) for execution in executions]

    async def _run(self, execution: Execution) -> ExecutionResult:
        """Start the batch's stream; answer the batcher once ``execute`` has returned (or the stream ended)."""
        sinks = [self._sinks.get(part.cancel) if part.cancel is not None else None for part in execution.parts]
        for sink in sinks:
            if sink is not None:
                sink.dispatched = True
        executed: asyncio.Future[list[ServeError | None]] = asyncio.get_running_loop().create_future()
        started = self._clock()
        route = asyncio.get_running_loop().create_task(self._route(execution, sinks, executed))
        self._routes.add(route)
        route.add_done_callback(self._routes.discard)
        errors = await asyncio.shield(executed)
        parts = [PartResult(error=error, final=True, empty=True) for error in errors]
        return ExecutionResult(compute_infer_ns=self._clock() - started, parts=parts)

    async def _route(
        self, execution: Execution, sinks: list[_Sink | None], executed: asyncio.Future[list[ServeError | None]]
    ) -> None:
        """Each response to its request's stream, until every request of the batch has had its final one."""
        count = max(1, len(execution.parts))
        open_parts = set(range(count))
        errors: list[ServeError | None] = [None] * count
        try:
            async with contextlib.aclosing(self._stream(execution)) as responses:
                while open_parts:
                    try:
                        index, answer = await asyncio.wait_for(anext(responses), self._timeout)
                    except StopAsyncIteration:
                        raise Unavailable(
                            f"model '{self.signature.name}' ended a request without its final response"
                        ) from None
                    except asyncio.TimeoutError:
                        raise Unavailable(
                            f"model '{self.signature.name}' sent no response for {self._timeout:g}s and has not "
                            "finished the request (its final flag)"
                        ) from None
                    if index == EXECUTED:
                        _settle(executed, errors)
                        continue
                    if index not in open_parts:
                        continue
                    if answer.final:
                        open_parts.discard(index)
                        errors[index] = answer.error
                    self._deliver(sinks[index] if index < len(sinks) else None, answer)
        except (Exception, asyncio.CancelledError) as exc:  # every open request ends, with the reason
            stopped = isinstance(exc, asyncio.CancelledError)
            error = (
                Unavailable(f"model '{self.signature.name}': the server is stopping")
                if stopped
                else as_serve_error(exc)
            )
            for index in open_parts:
                errors[index] = error
                self._deliver(sinks[index] if index < len(sinks) else None, PartResult(error=error, final=True))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            _settle(executed, errors)

    def _deliver(self, sink: _Sink | None, answer: PartResult) -> None:
        if sink is None:
            return
        if not sink.responded and not answer.empty:
            sink.responded = True
            self.stats.record_first_response(self._clock() - sink.arrival_ns)
        sink.items.put_nowait(answer)

    def drained(self) -> bool:
        return self.batcher.drained() and not self._sinks and not self._routes


def _settle(executed: asyncio.Future[list[ServeError | None]], errors: list[ServeError | None]) -> None:
    if not executed.done():
        executed.set_result(list(errors))
