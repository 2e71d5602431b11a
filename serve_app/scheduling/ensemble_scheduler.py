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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from serve_app.errors import InvalidArgument, ServeError, as_serve_error
from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, ParamValue, RequestedOutput
from serve_app.protos import model_config_pb2 as mc
from serve_app.stats import ModelStats

Infer = Callable[[InferRequest], Awaitable[InferResponse]]

SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
_INT64_WRAP = 2**64
Sequence = dict[str, ParamValue]  # the sequence parameters a tensor carries: sequence_id, sequence_start, sequence_end


def request_sequence(parameters: dict[str, ParamValue]) -> Sequence:
    """A request's sequence parameters as Triton's ensemble reports them (ID 0 and no flags without any)."""
    corr = parameters.get("sequence_id", 0)
    return {
        "sequence_id": corr if isinstance(corr, (int, str)) and not isinstance(corr, bool) else 0,
        "sequence_start": parameters.get("sequence_start") is True,
        "sequence_end": parameters.get("sequence_end") is True,
    }


def response_parameters(sequence: Sequence) -> dict[str, ParamValue]:
    """The response's parameters: Triton sends an integer ID as int64 (IDs >= 2**63 come out negative)."""
    corr = sequence["sequence_id"]
    if isinstance(corr, int) and corr >= _INT64_WRAP // 2:
        corr -= _INT64_WRAP
    return {**sequence, "sequence_id": corr}


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
            tensors, sequences = await self._run(request)
        except ServeError as exc:
            self.stats.record_failure("OTHER", self._clock() - arrival_ns, time.time_ns() // 1_000_000)
            raise type(exc)(f"in ensemble '{self.signature.name}', {exc.message}") from None
        except asyncio.CancelledError:  # the client left: its running steps were cancelled, its queued ones dropped
            self.stats.record_failure("CANCELED", self._clock() - arrival_ns, time.time_ns() // 1_000_000)
            raise
        finally:
            self.stats.pending -= 1
        sig = self.signature
        names = [o.name for o in request.outputs] if request.outputs else list(sig.outputs)
        outputs = []
        parameters: dict[str, ParamValue] = {}
        for name in names:
            t = tensors[name]
            outputs.append(InferTensor(name, sig.outputs[name].datatype.wire_name, tuple(t.data.shape), t.data))
            if name in sequences:
                parameters = response_parameters(sequences[name])
        now = self._clock()
        self.stats.execution_count += 1
        self.stats.record_success(max(1, options.batch_size), now - arrival_ns, 0, 0, 0, 0, time.time_ns() // 1_000_000)
        return InferResponse(sig.name, sig.version, request.id, outputs, parameters)

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

    async def _run(self, request: InferRequest) -> tuple[dict[str, InferTensor], dict[str, Sequence]]:
        """The ensemble's tensors, and the sequence parameters of those its steps produced."""
        tensors: dict[str, InferTensor] = {t.name: t for t in request.inputs}
        sequences: dict[str, Sequence] = {}  # tensor -> the sequence parameters of the step that produced it
        overrides: dict[str, Sequence] = {}  # tensor -> the sequence parameters its step's response set
        outputs = [o.name for o in request.outputs] if request.outputs else list(self.signature.outputs)
        waiting = self.needed_steps(outputs)
        running: dict[asyncio.Task[InferResponse], int] = {}
        requests: dict[int, InferRequest] = {}
        try:
            while waiting or running:
                for i in [i for i in waiting if all(t in tensors for _, t in self._steps[i].inputs)]:
                    waiting.remove(i)
                    step_request = self._request(request, i, tensors, overrides)
                    running[asyncio.ensure_future(self._infer(step_request))] = i
                    requests[i] = step_request
                if not running:
                    missing = sorted({t for i in waiting for _, t in self._steps[i].inputs if t not in tensors})
                    raise InvalidArgument(f"tensors {missing} are needed by a step but nothing produced them")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    index = running.pop(task)
                    step = self._steps[index]
                    exc = task.exception()
                    if exc is not None:
                        raise as_serve_error(exc)
                    response = task.result()
                    produced = {o.name: o for o in response.outputs}
                    override = {k: response.parameters[k] for k in SEQUENCE_PARAMETERS if k in response.parameters}
                    step_parameters = requests.pop(index).parameters
                    if override:  # Triton: the response's flags replace the step's (unset ones are false)
                        step_parameters = {**step_parameters, "sequence_start": False, "sequence_end": False}
                    sequence = request_sequence({**step_parameters, **override})
                    for model_out, tensor in step.outputs:
                        out = produced[model_out]
                        tensors[tensor] = InferTensor(tensor, out.datatype, out.shape, out.data)
                        sequences[tensor] = sequence
                        if override:
                            overrides[tensor] = sequence
        finally:
            for task in running:
                task.cancel()
        return tensors, sequences

    def _request(
        self, request: InferRequest, index: int, tensors: dict[str, InferTensor], overrides: dict[str, Sequence]
    ) -> InferRequest:
        """The step's request: the ensemble request's parameters, with the sequence parameters a producing
        step's response set on one of its inputs (Triton takes the first such input's)."""
        step = self._steps[index]
        inputs = []
        parameters = dict(request.parameters)
        override: Sequence | None = None
        for model_in, tensor in step.inputs:
            t = tensors[tensor]
            inputs.append(InferTensor(model_in, t.datatype, t.shape, t.data))
            if override is None and tensor in overrides:
                override = overrides[tensor]
        if override is not None:
            parameters.update(override)
        return InferRequest(
            model_name=step.model,
            model_version=step.version,
            id=request.id,
            inputs=inputs,
            outputs=[RequestedOutput(name) for name, _ in step.outputs],
            parameters=parameters,
        )
