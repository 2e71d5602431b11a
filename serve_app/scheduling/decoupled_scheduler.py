"""A decoupled model's scheduler: each request's responses streamed back as the model sends them.

Triton's decoupled models answer a request zero or more times and then close
it with a final flag, from ``execute`` or later.  Each request goes to an
instance as its own execution (the instance runs one ``execute`` at a time,
as Triton's does) and its responses come back one by one
(:class:`~serve_app.inference.types.StreamItem`), the last one final.  A
model that sends nothing for ``response_timeout_s`` has its request ended
with an error, so no client waits for ever; a client that stops reading
cancels the request on the instance.  Statistics count a request once, at
its final response, or as failed with reason CANCELED when its client left first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable

from serve_app.errors import ServeError, Unavailable, Unsupported, as_serve_error
from serve_app.inference.execution import EXECUTED, Execution, PartResult
from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, StreamItem
from serve_app.scheduling.model_scheduler import part_outputs, request_part
from serve_app.stats import ModelStats

Stream = Callable[[Execution], AsyncGenerator[tuple[int, PartResult], None]]

# Triton's answer to a request that can't take a stream of responses (the unary gRPC call's wording).
DECOUPLED_UNARY = "ModelInfer RPC doesn't support models with decoupled transaction policy"


class DecoupledScheduler:
    def __init__(
        self,
        signature: ModelSignature,
        stream: Stream,
        *,
        response_timeout_s: float,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.signature = signature
        self.stats = ModelStats(signature.name, signature.version)
        self._stream = stream
        self._timeout = response_timeout_s
        self._clock = clock
        self._all_outputs = tuple(signature.outputs)
        self.inflight = 0

    async def submit(self, request: InferRequest, options: RequestOptions, arrival_ns: int) -> InferResponse:
        """A decoupled model gives no single response: callers that need one use :meth:`submit_stream`."""
        raise Unsupported(DECOUPLED_UNARY)

    async def submit_stream(
        self, request: InferRequest, options: RequestOptions, arrival_ns: int
    ) -> AsyncGenerator[StreamItem, None]:
        """The request's responses as they come; the last one is final."""
        part = request_part(request, options)
        execution = Execution({}, part.outputs or self._all_outputs, options.batch_size, parts=(part,))
        sig = self.signature
        self.inflight += 1
        self.stats.pending += 1
        dispatch_ns = self._clock()
        finished = responded = False
        try:
            async with contextlib.aclosing(self._stream(execution)) as responses:
                while not finished:
                    try:
                        index, answer = await asyncio.wait_for(anext(responses), self._timeout)
                    except StopAsyncIteration:
                        raise Unavailable(f"model '{sig.name}' ended a request without its final response") from None
                    except asyncio.TimeoutError:
                        raise Unavailable(
                            f"model '{sig.name}' sent no response for {self._timeout:g}s and has not finished the "
                            "request (its final flag)"
                        ) from None
                    if index == EXECUTED:
                        continue  # the model's ``execute`` returned: nothing to tell the client
                    finished = answer.final
                    if not responded and not answer.empty:
                        responded = True
                        self.stats.record_first_response(self._clock() - arrival_ns)
                    if finished:
                        self._count(answer, arrival_ns, dispatch_ns)
                    yield stream_item(answer, request, sig, self._all_outputs)
        except (ServeError, OSError) as exc:
            if not finished:
                error = as_serve_error(exc)
                self.stats.record_failure("OTHER", self._clock() - arrival_ns, time.time_ns() // 1_000_000)
                finished = True
                yield StreamItem(error=error, final=True)
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:  # the client cancelled or stopped reading before the final response
                self.stats.record_failure("CANCELED", self._clock() - arrival_ns, time.time_ns() // 1_000_000)
            raise
        finally:
            self.inflight -= 1
            self.stats.pending -= 1

    def _count(self, answer: PartResult, arrival_ns: int, dispatch_ns: int) -> None:
        now, now_ms = self._clock(), time.time_ns() // 1_000_000
        if answer.error is not None:
            self.stats.record_failure("BACKEND", now - arrival_ns, now_ms, executed_ns=answer.compute_ns)
            return
        self.stats.record_execution(1, 0, answer.compute_ns, 0)
        self.stats.record_success(
            1, now - arrival_ns, dispatch_ns - arrival_ns, 0, answer.compute_ns, 0, now_ms, first_response=False
        )

    def drained(self) -> bool:
        return self.inflight == 0


def stream_item(
    answer: PartResult, request: InferRequest, sig: ModelSignature, all_outputs: tuple[str, ...]
) -> StreamItem:
    """One of the model's responses to ``request`` as its client gets it."""
    if answer.error is not None:
        return StreamItem(error=answer.error, final=answer.final)
    if answer.empty:
        return StreamItem(final=True)  # the final flag alone
    response = InferResponse(sig.name, sig.version, request.id, part_outputs(answer, request, all_outputs))
    response.parameters.update(answer.parameters)
    return StreamItem(response, final=answer.final)
