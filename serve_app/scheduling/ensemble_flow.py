"""One ensemble request's data flow, response by response, as Triton's ensemble runs it.

Each ensemble tensor holds one value per *iteration*: the ensemble's inputs
are iteration 0, and each response a step sends gives every tensor the step
writes its next iteration, so a decoupled step's N responses make iterations
0 to N-1.  A step runs once for each iteration all its inputs have (the steps
after a decoupled one run once per response it sends), and the ensemble
answers once for each iteration all its requested outputs have.  An answer is
final when no step is left running (Triton's in-flight step count at zero);
when the step that ended last produced no answer, the final flag goes alone.
A step's error ends the flow and cancels the steps still running.

With ``max_inflight_requests`` (:mod:`~serve_app.scheduling.inflight_limiter`,
one limiter per step shared by the ensemble's requests), a step request starts
once its step has a free slot, and the flow reads a step's next response only
after it has started the steps the previous one feeds: a decoupled step is read
no faster than the steps after it can take its responses.  A slot is given back
when its step request's final response arrives, or it is cancelled.

A value is dropped once every step and output that reads it has (so a long
stream keeps only the iterations still in flight).  An output a step's
response leaves out still takes its iteration, empty: a step reading it gets
the request without that input, an answer goes without that output, as
Triton's placeholders do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from serve_app.errors import ServeError, as_serve_error
from serve_app.inference.types import InferRequest, InferTensor, ParamValue, RequestedOutput, StreamItem
from serve_app.scheduling.inflight_limiter import InflightLimiter

StepStream = Callable[[InferRequest], AsyncGenerator[StreamItem, None]]
Sequence = dict[str, ParamValue]  # the sequence parameters a value carries: sequence_id, sequence_start, sequence_end

SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")


def request_sequence(parameters: dict[str, ParamValue]) -> Sequence:
    """A request's sequence parameters as Triton's ensemble reports them (ID 0 and no flags without any)."""
    corr = parameters.get("sequence_id", 0)
    return {
        "sequence_id": corr if isinstance(corr, (int, str)) and not isinstance(corr, bool) else 0,
        "sequence_start": parameters.get("sequence_start") is True,
        "sequence_end": parameters.get("sequence_end") is True,
    }


@dataclass(frozen=True, slots=True)
class Step:
    model: str
    version: str  # "" = the model's newest served version
    inputs: tuple[tuple[str, str], ...]  # (model input, ensemble tensor)
    outputs: tuple[tuple[str, str], ...]  # (model output, ensemble tensor)


@dataclass(slots=True)
class Value:
    """One iteration of an ensemble tensor."""

    tensor: InferTensor | None  # None: the step's response left this output out
    sequence: Sequence  # the sequence parameters of the step that produced it
    override: bool  # its step's response set them (the steps reading it take them)
    uses: int  # steps and answers still to read it


@dataclass(frozen=True, slots=True)
class Answer:
    """One ensemble response: its requested outputs' values (None: the final flag alone)."""

    outputs: dict[str, Value] | None
    final: bool


@dataclass(slots=True)
class _Run:
    index: int  # the step
    parameters: dict[str, ParamValue]  # its request's
    limiter: InflightLimiter | None  # whose slot it holds until released
    task: asyncio.Task[None] | None = None
    processed: asyncio.Event | None = None  # set when the flow has handled its last item (with a limiter)

    def release(self) -> None:
        if self.limiter is not None:
            self.limiter.release()
            self.limiter = None


class EnsembleFlow:
    """Runs ``needed`` (step indexes) of ``steps`` for ``request``; :meth:`answers` yields the responses."""

    def __init__(
        self,
        steps: tuple[Step, ...],
        needed: list[int],
        stream: StepStream,
        request: InferRequest,
        outputs: list[str],
        *,
        limiters: tuple[InflightLimiter, ...] | None = None,
        name: str = "",
    ) -> None:
        """``limiters``: one per step (``max_inflight_requests``), shared by the ensemble's requests;
        ``name``: the ensemble's, for their log lines."""
        self._steps = steps
        self._limiters = limiters
        self._name = name
        self._needed = needed
        self._stream = stream
        self._request = request
        self._outputs = outputs
        self._uses: dict[str, int] = dict.fromkeys(outputs, 1)  # tensor -> readers of each of its values
        for i in needed:
            for tensor in dict.fromkeys(t for _, t in steps[i].inputs):
                self._uses[tensor] = self._uses.get(tensor, 0) + 1
        self._values: dict[str, dict[int, Value]] = {}
        self._next: dict[str, int] = {}  # tensor -> its next iteration
        self._runs: dict[int, _Run] = {}
        self._run_ids = 0
        self._queue: asyncio.Queue[tuple[int, StreamItem]] = asyncio.Queue()

    async def answers(self) -> AsyncGenerator[Answer, None]:
        """The ensemble's responses as they become ready, the last one final; a step's error is raised."""
        sequence = request_sequence(self._request.parameters)
        updated = [self._add(t.name, t, sequence, False) for t in self._request.inputs]
        try:
            await self._launch(updated)
            while True:
                if self._runs:
                    run_id, item = await self._queue.get()
                    run = self._runs[run_id]
                    if item.error is not None:
                        raise item.error
                    updated = self._consume(run, item) if item.response is not None else []
                    if item.final:
                        del self._runs[run_id]
                    await self._launch(updated)
                    if run.processed is not None:
                        run.processed.set()
                ready = self._ready_answers(updated)
                done = not self._runs
                if done and not ready:
                    ready.append(Answer(None, final=True))
                elif done:
                    ready[-1] = Answer(ready[-1].outputs, final=True)
                for answer in ready:
                    yield answer
                if done:
                    return
        finally:
            for run in self._runs.values():
                if run.task is not None:
                    run.task.cancel()
                run.release()

    # -- values ---------------------------------------------------------------------
    def _add(self, tensor: str, value: InferTensor | None, sequence: Sequence, override: bool) -> tuple[str, int]:
        iteration = self._next.get(tensor, 0)
        self._next[tensor] = iteration + 1
        uses = self._uses.get(tensor, 0)
        if uses:
            self._values.setdefault(tensor, {})[iteration] = Value(value, sequence, override, uses)
        return tensor, iteration

    def _read(self, tensor: str, iteration: int) -> Value:
        values = self._values[tensor]
        value = values[iteration]
        value.uses -= 1
        if not value.uses:
            del values[iteration]
        return value

    def _has(self, tensor: str, iteration: int) -> bool:
        return iteration in self._values.get(tensor, {})

    def _consume(self, run: _Run, item: StreamItem) -> list[tuple[str, int]]:
        """The values one response of a step gives, with the sequence parameters Triton gives them: the
        step's request's, or (its flags unset unless set) those the response sets."""
        assert item.response is not None
        response = item.response
        override = {k: response.parameters[k] for k in SEQUENCE_PARAMETERS if k in response.parameters}
        parameters = run.parameters
        if override:
            parameters = {**parameters, "sequence_start": False, "sequence_end": False, **override}
        sequence = request_sequence(parameters)
        produced = {o.name: o for o in response.outputs}
        updated = []
        for model_out, tensor in self._steps[run.index].outputs:
            out = produced.get(model_out)
            value = None if out is None else InferTensor(tensor, out.datatype, out.shape, out.data)
            updated.append(self._add(tensor, value, sequence, bool(override)))
        return updated

    # -- steps and answers ------------------------------------------------------------
    async def _launch(self, updated: list[tuple[str, int]]) -> None:
        """Start each needed step that reads an updated value and has all its inputs of that iteration."""
        ready: dict[tuple[int, int], None] = {}
        for tensor, iteration in updated:
            for i in self._needed:
                inputs = self._steps[i].inputs
                if any(t == tensor for _, t in inputs) and all(self._has(t, iteration) for _, t in inputs):
                    ready[(i, iteration)] = None
        for i, iteration in ready:
            request = self._step_request(i, iteration)
            limiter = None if self._limiters is None else self._limiters[i]
            run = _Run(i, request.parameters, limiter, processed=None if limiter is None else asyncio.Event())
            if limiter is not None:
                await limiter.acquire(self._name, i)
            self._run_ids += 1
            self._runs[self._run_ids] = run
            run.task = asyncio.ensure_future(self._pump(self._run_ids, run, request))

    def _step_request(self, index: int, iteration: int) -> InferRequest:
        """The step's request: the ensemble request's parameters, with the sequence parameters a producing
        step's response set on one of its inputs (Triton takes the first such input's)."""
        step = self._steps[index]
        inputs = []
        parameters = dict(self._request.parameters)
        override: Sequence | None = None
        for tensor in dict.fromkeys(t for _, t in step.inputs):
            value = self._read(tensor, iteration)
            for model_in, name in step.inputs:
                if name == tensor and value.tensor is not None:
                    t = value.tensor
                    inputs.append(InferTensor(model_in, t.datatype, t.shape, t.data))
            if override is None and value.override:
                override = value.sequence
        if override is not None:
            parameters.update(override)
        return InferRequest(
            model_name=step.model,
            model_version=step.version,
            id=self._request.id,
            inputs=inputs,
            outputs=[RequestedOutput(name) for name, _ in step.outputs],
            parameters=parameters,
        )

    def _ready_answers(self, updated: list[tuple[str, int]]) -> list[Answer]:
        """An answer for each updated iteration that every requested output now has."""
        iterations = dict.fromkeys(i for t, i in updated if t in self._outputs)
        ready = []
        for iteration in iterations:
            if all(self._has(t, iteration) for t in self._outputs):
                ready.append(Answer({t: self._read(t, iteration) for t in self._outputs}, final=False))
        return ready

    async def _pump(self, run_id: int, run: _Run, request: InferRequest) -> None:
        """A step's responses onto the flow's queue, its error as its final item; its slot given back at
        its final response (so a flow waiting for one needn't read the queue first).  With a limiter, the
        next response is read once the flow has handled this one."""
        try:
            async with contextlib.aclosing(self._stream(request)) as items:
                async for item in items:
                    if item.final:
                        run.release()
                        self._queue.put_nowait((run_id, item))
                        return
                    if run.processed is not None:
                        run.processed.clear()
                    self._queue.put_nowait((run_id, item))
                    if run.processed is not None:
                        await run.processed.wait()
        except Exception as exc:  # any failure of a step fails the ensemble with its message
            error: ServeError = as_serve_error(exc)
            run.release()
            self._queue.put_nowait((run_id, StreamItem(error=error, final=True)))
            return
        finally:
            run.release()
        self._queue.put_nowait((run_id, StreamItem(final=True)))
