"""An ensemble's scheduler: run its steps as a data-flow graph of requests to the composing models.

A step runs as soon as every tensor its ``input_map`` names exists (the
ensemble's inputs, or outputs of earlier steps), so independent steps run
concurrently.  Each step is an ordinary request to its model through the
service (same validation, scheduling, batching and statistics as a client's
request); tensors pass from step to step as the same numpy arrays, without
copies.  Only the steps the requested outputs need run (Triton prunes the
others: their models' statistics don't move).  A failing step fails the request
with Triton's ``in ensemble '<name>',`` prefix and the other running steps are
cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from serve_app.errors import InvalidArgument, ServeError, as_serve_error
from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, RequestedOutput
from serve_app.protos import model_config_pb2 as mc
from serve_app.stats import ModelStats

Infer = Callable[[InferRequest], Awaitable[InferResponse]]


@dataclass(frozen=True, slots=True)
class _Step:
    model: str
    version: str  # "" = the model's newest served version
    inputs: tuple[tuple[str, str], ...]  # (model input, ensemble tensor)
    outputs: tuple[tuple[str, str], ...]  # (model output, ensemble tensor)


class EnsembleScheduler:
    def __init__(
        self,
        config: mc.ModelConfig,
        signature: ModelSignature,
        infer: Infer,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.signature = signature
        self.stats = ModelStats(signature.name, signature.version)
        self._infer = infer
        self._clock = clock
        self._steps = tuple(
            _Step(
                s.model_name,
                str(s.model_version) if s.model_version >= 0 else "",
                tuple(sorted(s.input_map.items())),
                tuple(sorted(s.output_map.items())),
            )
            for s in config.ensemble_scheduling.step
        )

    async def submit(self, request: InferRequest, options: RequestOptions, arrival_ns: int) -> InferResponse:
        self.stats.pending += 1
        try:
            tensors = await self._run(request)
        except ServeError as exc:
            self.stats.record_failure("OTHER", self._clock() - arrival_ns, time.time_ns() // 1_000_000)
            raise type(exc)(f"in ensemble '{self.signature.name}', {exc.message}") from None
        finally:
            self.stats.pending -= 1
        sig = self.signature
        names = [o.name for o in request.outputs] if request.outputs else list(sig.outputs)
        outputs = []
        for name in names:
            t = tensors[name]
            outputs.append(InferTensor(name, sig.outputs[name].datatype.wire_name, tuple(t.data.shape), t.data))
        now = self._clock()
        self.stats.execution_count += 1
        self.stats.record_success(max(1, options.batch_size), now - arrival_ns, 0, 0, 0, 0, time.time_ns() // 1_000_000)
        return InferResponse(sig.name, sig.version, request.id, outputs)

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

    async def _run(self, request: InferRequest) -> dict[str, InferTensor]:
        tensors: dict[str, InferTensor] = {t.name: t for t in request.inputs}
        outputs = [o.name for o in request.outputs] if request.outputs else list(self.signature.outputs)
        waiting = self.needed_steps(outputs)
        running: dict[asyncio.Task[InferResponse], int] = {}
        try:
            while waiting or running:
                for i in [i for i in waiting if all(t in tensors for _, t in self._steps[i].inputs)]:
                    waiting.remove(i)
                    running[asyncio.ensure_future(self._infer(self._request(request, i, tensors)))] = i
                if not running:
                    missing = sorted({t for i in waiting for _, t in self._steps[i].inputs if t not in tensors})
                    raise InvalidArgument(f"tensors {missing} are needed by a step but nothing produced them")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step = self._steps[running.pop(task)]
                    exc = task.exception()
                    if exc is not None:
                        raise as_serve_error(exc)
                    produced = {o.name: o for o in task.result().outputs}
                    for model_out, tensor in step.outputs:
                        out = produced[model_out]
                        tensors[tensor] = InferTensor(tensor, out.datatype, out.shape, out.data)
        finally:
            for task in running:
                task.cancel()
        return tensors

    def _request(self, request: InferRequest, index: int, tensors: dict[str, InferTensor]) -> InferRequest:
        step = self._steps[index]
        inputs = []
        for model_in, tensor in step.inputs:
            t = tensors[tensor]
            inputs.append(InferTensor(model_in, t.datatype, t.shape, t.data))
        return InferRequest(
            model_name=step.model,
            model_version=step.version,
            id=request.id,
            inputs=inputs,
            outputs=[RequestedOutput(name) for name, _ in step.outputs],
            parameters=dict(request.parameters),
        )
