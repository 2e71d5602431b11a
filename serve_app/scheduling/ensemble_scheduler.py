"""An ensemble's scheduler: run its steps as a data-flow graph of requests to the composing models.

A step runs as soon as every tensor its ``input_map`` names exists (the
ensemble's inputs, or outputs of earlier steps), so independent steps run
concurrently.  Each step is an ordinary request to its model through the
service (same validation, scheduling, batching and statistics as a client's
request); tensors pass from step to step as the same numpy arrays, without
copies.  Only the steps the requested outputs need run (Triton prunes the
others: their models' statistics don't move).  A failing step fails the request
with Triton's ``in ensemble '<name>',`` prefix and the other running steps are
cancelled; so are all of them when the ensemble's client cancels (steps still
queued in their models never run, each counted CANCELED, as is the ensemble).

A step may be a decoupled model: the steps after it run once per response it
sends, and the ensemble answers once per set of outputs
(:mod:`~serve_app.scheduling.ensemble_flow`), through :meth:`submit_stream`
(such an ensemble is decoupled itself, as Triton marks it).

Sequences go through as Triton sends them: each step's request carries the
ensemble request's parameters, its ``sequence_id``, ``sequence_start`` and
``sequence_end`` included, unless a step's response set them (then the steps
fed by that step's outputs get those instead).  Each tensor a step produces
remembers the sequence parameters of its step, and the ensemble's response
carries those of its outputs, as Triton's ensemble responses do (a request
without a sequence gets ``sequence_id`` 0, and both flags false).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

from serve_app.errors import InvalidArgument, ServeError
from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, ParamValue, StreamItem
from serve_app.protos import model_config_pb2 as mc
from serve_app.scheduling.ensemble_flow import Answer, EnsembleFlow, Sequence, Step, StepStream
from serve_app.scheduling.inflight_limiter import InflightLimiter
from serve_app.stats import ModelStats

Infer = Callable[[InferRequest], Awaitable[InferResponse]]

_INT64_WRAP = 2**64
# Triton's answer when the steps ended without setting every output (a model left one out of its response).
DEADLOCK = "unexpected deadlock, at least one output is not set while no more ensemble steps can be made"


def response_parameters(sequence: Sequence) -> dict[str, ParamValue]:
    """The response's parameters: Triton sends an integer ID as int64 (IDs >= 2**63 come out negative)."""
    corr = sequence["sequence_id"]
    if isinstance(corr, int) and corr >= _INT64_WRAP // 2:
        corr -= _INT64_WRAP
    return {**sequence, "sequence_id": corr}


def one_response(infer: Infer) -> StepStream:
    """A step stream of models that answer once: their response, final."""

    async def stream(request: InferRequest) -> AsyncGenerator[StreamItem, None]:
        yield StreamItem(await infer(request), final=True)

    return stream


class EnsembleScheduler:
    def __init__(
        self,
        config: mc.ModelConfig,
        signature: ModelSignature,
        stream: StepStream,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """``stream``: a step's responses (one, final, for a model that is not decoupled)."""
        self.signature = signature
        self.stats = ModelStats(signature.name, signature.version)
        self._stream = stream
        self._clock = clock
        self._steps = tuple(
            Step(
                s.model_name,
                str(s.model_version) if s.model_version >= 0 else "",
                tuple(sorted(s.input_map.items())),
                tuple(sorted(s.output_map.items())),
            )
            for s in config.ensemble_scheduling.step
        )
        limit = config.ensemble_scheduling.max_inflight_requests
        self.limiters = tuple(InflightLimiter(limit) for _ in self._steps) if limit else None

    async def submit(self, request: InferRequest, options: RequestOptions, arrival_ns: int) -> InferResponse:
        self.stats.pending += 1
        try:
            response: InferResponse | None = None
            async with contextlib.aclosing(self._flow(request).answers()) as answers:
                async for answer in answers:
                    if response is None and answer.outputs is not None:
                        response = self._response(request, answer)
            if response is None:
                raise InvalidArgument(DEADLOCK)
        except ServeError as exc:
            self.stats.record_failure("OTHER", self._clock() - arrival_ns, time.time_ns() // 1_000_000)
            raise self._in_ensemble(exc) from None
        except asyncio.CancelledError:  # the client left: its running steps were cancelled, its queued ones dropped
            self.stats.record_failure("CANCELED", self._clock() - arrival_ns, time.time_ns() // 1_000_000)
            raise
        finally:
            self.stats.pending -= 1
        self.stats.execution_count += 1
        self.stats.record_success(
            max(1, options.batch_size), self._clock() - arrival_ns, 0, 0, 0, 0, time.time_ns() // 1_000_000
        )
        return response

    async def submit_stream(
        self, request: InferRequest, options: RequestOptions, arrival_ns: int
    ) -> AsyncGenerator[StreamItem, None]:
        """The ensemble's responses as its outputs become ready; the last one (or the flag alone) is final.
        An error ends the stream as its final item."""
        self.stats.pending += 1
        finished = responded = False
        try:
            async with contextlib.aclosing(self._flow(request).answers()) as answers:
                async for answer in answers:
                    if answer.final:
                        finished = True
                        self.stats.execution_count += 1
                        self.stats.record_success(
                            max(1, options.batch_size), self._clock() - arrival_ns, 0, 0, 0, 0,
                            time.time_ns() // 1_000_000, first_response=False,
                        )  # fmt: skip
                    if answer.outputs is None:
                        yield StreamItem(final=True)
                        continue
                    if not responded:
                        responded = True
                        self.stats.record_first_response(self._clock() - arrival_ns)
                    yield StreamItem(self._response(request, answer), final=answer.final)
        except ServeError as exc:
            if not finished:
                finished = True
                self.stats.record_failure("OTHER", self._clock() - arrival_ns, time.time_ns() // 1_000_000)
                yield StreamItem(error=self._in_ensemble(exc), final=True)
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:  # the client left: the running steps were cancelled
                self.stats.record_failure("CANCELED", self._clock() - arrival_ns, time.time_ns() // 1_000_000)
            raise
        finally:
            self.stats.pending -= 1

    def drained(self) -> bool:
        """Always: it queues nothing itself (its steps wait in their own models' schedulers)."""
        return True

    def needed_steps(self, outputs: list[str]) -> list[int]:
        """The steps that produce ``outputs``, and those that feed them, in config order."""
        wanted = set(outputs)
        needed: set[int] = set()
        grew = True
        while grew:
            grew = False
            for i, step in enumerate(self._steps):
                if i not in needed and any(t in wanted for _, t in step.outputs):
                    needed.add(i)
                    wanted.update(t for _, t in step.inputs)
                    grew = True
        return sorted(needed)

    def _outputs(self, request: InferRequest) -> list[str]:
        return [o.name for o in request.outputs] if request.outputs else list(self.signature.outputs)

    def _flow(self, request: InferRequest) -> EnsembleFlow:
        outputs = self._outputs(request)
        return EnsembleFlow(
            self._steps,
            self.needed_steps(outputs),
            self._stream,
            request,
            outputs,
            limiters=self.limiters,
            name=self.signature.name,
        )

    def _in_ensemble(self, exc: ServeError) -> ServeError:
        return type(exc)(f"in ensemble '{self.signature.name}', {exc.message}")

    def _response(self, request: InferRequest, answer: Answer) -> InferResponse:
        """The response of one answer: its outputs (those a step left out omitted, as Triton omits them)
        and the sequence parameters of the step that produced the last of them."""
        assert answer.outputs is not None
        sig = self.signature
        outputs = []
        parameters: dict[str, ParamValue] = {}
        for name, value in answer.outputs.items():
            parameters = response_parameters(value.sequence)
            t = value.tensor
            if t is not None:
                outputs.append(InferTensor(name, sig.outputs[name].datatype.wire_name, tuple(t.data.shape), t.data))
        return InferResponse(sig.name, sig.version, request.id, outputs, parameters)
