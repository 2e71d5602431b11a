"""One instance of a sequence model: its slots, their queues, their implicit state, one execution at a time.

Steps arrive from gateways already assigned to a slot (by the sequence
router); the pure :class:`~serve_app.sequence.batcher.SequenceBatcher`
decides what runs next; this driver turns its rows into one
:class:`~serve_app.inference.execution.Execution` (request inputs, control
tensors, input states), runs it off the event loop, keeps the output states
and answers each step.  Freed slots are reported to the router through
:meth:`poll` (a long poll the router keeps open, which also tells it the
instance is alive).

With state backup (``config/state_backup.py``) each answer also carries its
sequence's state after the step (numbered by the step's place in the
sequence), for the gateway to pass on to the router; the router's snapshot
after a restart gets every state, with the last step's id and answer.
:meth:`restore` takes over a sequence the router moved here from a lost
instance.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serve_app.errors import Unavailable, as_serve_error
from serve_app.inference.execution import FLAG_END, FLAG_START, Execution, ExecutionResult, RequestPart
from serve_app.protos import model_config_pb2 as mc
from serve_app.sequence.batcher import Row, SequenceBatcher, SequenceBatchingConfig, StaleStep
from serve_app.sequence.controls import RowControl, SequenceControls
from serve_app.sequence.implicit_state import ImplicitState, zeros_like
from serve_app.sequence.messages import (
    InstanceEvents,
    PollEvents,
    RestoreSequence,
    SequenceStep,
    SlotEvent,
    StateBackup,
    StepResult,
)

Run = Callable[[Execution], Awaitable[ExecutionResult]]


@dataclass(slots=True, eq=False)
class _Job:
    step: SequenceStep
    future: asyncio.Future[StepResult]
    arrival_ns: int


class SequenceInstance:
    def __init__(
        self,
        config: mc.ModelConfig,
        model_dir: Path,
        run: Run,
        *,
        instance_id: str,
        clock: Callable[[], int] = time.monotonic_ns,
        on_release: Callable[[list[SlotEvent]], None] | None = None,
        backup: bool = False,
        per_request: bool = False,
    ) -> None:
        """``on_release``: told of freed slots directly (in process), instead of through :meth:`poll`.
        ``backup``: each answer carries its sequence's new state (and snapshots carry every state).
        ``per_request``: the backend answers each request on its own (the Python backend): executions carry
        only the real rows, each with its correlation id and flags (:class:`RequestPart`)."""
        self.id = instance_id
        self.model_name = config.name
        self.batcher: SequenceBatcher[_Job] = SequenceBatcher(SequenceBatchingConfig.from_model_config(config))
        self.controls = SequenceControls.from_model_config(config)
        self.state = ImplicitState(config, model_dir)
        self._batched = config.max_batch_size > 0
        self._per_request = per_request
        self._run = run
        self._clock = clock
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        self._released: list[SlotEvent] = []
        self._events = asyncio.Event()
        self.draining = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_release = on_release
        self.backup = backup and bool(self.state) and on_release is None
        self._steps: dict[int, int] = {}  # slot -> steps its sequence has run (numbers the backups)
        self._last: dict[int, tuple[int, dict[str, np.ndarray] | None]] = {}  # slot -> its last step's id, answer

    # -- steps -------------------------------------------------------------------------
    async def step(self, step: SequenceStep) -> StepResult:
        """Queue one request in its slot and wait for its result."""
        now = self._clock()
        job = _Job(step, asyncio.get_running_loop().create_future(), now)
        # Sequences idle for too long leave their slots before this step is queued, even if their timer has not
        # fired yet: a late step of such a sequence is "not here" (it needs a START), never its continuation.
        self._report(self.batcher.expire_idle(now))
        try:
            displaced = self.batcher.enqueue(
                step.slot,
                step.corr_id,
                step.slot_token,
                job,
                start=step.start,
                end=step.end,
                now_ns=now,
                shape_key=self._shape_key(step),
            )
        except StaleStep:
            return StepResult(not_here=True)
        for p in displaced:
            err = Unavailable(f"sequence {p.item.step.corr_id} lost its slot to a new sequence")
            _resolve(p.item.future, StepResult(error=err))
        self._pump()
        return await job.future

    def _shape_key(self, step: SequenceStep) -> object:
        skip = 1 if self._batched else 0
        return tuple(sorted((name, arr.shape[skip:]) for name, arr in step.inputs.items()))

    # -- the loop ---------------------------------------------------------------------------
    def _pump(self) -> None:
        now = self._clock()
        self._report(self.batcher.expire_idle(now))
        wait = 0
        if not self._busy:
            decision = self.batcher.next_batch(now)
            if decision.rows:
                self._busy = True
                task = asyncio.get_running_loop().create_task(self._execute(decision.rows, now))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            wait = decision.wait_ns
        idle = self.batcher.idle_wait_ns(now)
        wait = min(w for w in (wait, idle) if w) if (wait or idle) else 0
        self._arm(wait)

    def _arm(self, wait_ns: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if wait_ns:
            self._timer = asyncio.get_running_loop().call_later(wait_ns / 1e9, self._pump)

    async def _execute(self, rows: list[Row[_Job]], dispatch_ns: int) -> None:
        try:
            for group in self._groups(rows):
                try:
                    execution = self._execution(group)
                    try:
                        result = await self._run(execution)
                    except Exception as exc:  # the model failed: the execution still counts
                        result = ExecutionResult(error=as_serve_error(exc))
                    self._answer(group, execution, result, dispatch_ns)
                except Exception as exc:  # whatever failed, every step of the group gets an answer
                    err = as_serve_error(exc)
                    for row in group:
                        if row.pending is not None:
                            _resolve(row.pending.item.future, StepResult(error=err))
        finally:
            self._busy = False
            self._report(self.batcher.finish(rows))
            self._pump()

    def _groups(self, rows: list[Row[_Job]]) -> list[list[Row[_Job]]]:
        """Rows whose implicit states have different shapes can't share a tensor: run them apart."""
        if not self.state:
            return [rows]
        groups: dict[object, list[Row[_Job]]] = {}
        for row in rows:
            if row.pending is None:
                continue
            states = self.state.row_states(row.slot, row.pending.item.step.start)
            key = tuple(a.shape for a in states.values())
            groups.setdefault(key, []).append(row)
        if len(groups) == 1:
            return [rows]  # keep the empty rows of a direct batch in place
        return list(groups.values())

    def _execution(self, rows: list[Row[_Job]]) -> Execution:
        if self._per_request:  # the model sees requests, not slots: no padding rows
            rows = [r for r in rows if r.pending is not None]
        real = [r.pending.item.step for r in rows if r.pending is not None]
        first = real[0]
        controls = [
            RowControl(r.pending.item.step.start, r.pending.item.step.end, True, r.pending.item.step.corr_id)
            if r.pending is not None
            else RowControl()
            for r in rows
        ]
        inputs: dict[str, np.ndarray] = {}
        states: dict[str, list[np.ndarray]] = {}
        if self.state:
            # Empty rows get zeros (empty strings) shaped like the real rows' states (which agree: see _groups).
            real_states = {
                id(r): self.state.row_states(r.slot, r.pending.item.step.start) for r in rows if r.pending is not None
            }
            ref = next(iter(real_states.values()))
            for r in rows:
                row_states = real_states.get(id(r)) or {n: zeros_like(a) for n, a in ref.items()}
                for name, arr in row_states.items():
                    states.setdefault(name, []).append(arr)
        if not self._batched:
            inputs.update(first.inputs)
            for name, arrs in states.items():
                inputs[name] = arrs[0]
        else:
            for name, ref_in in first.inputs.items():
                parts = [
                    row.pending.item.step.inputs[name] if row.pending is not None else zeros_like(ref_in)
                    for row in rows
                ]
                inputs[name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
            for name, arrs in states.items():
                inputs[name] = np.stack(arrs)
        inputs.update(self.controls.tensors(controls, self._batched))
        wanted: list[str] = []
        for step in real:
            for name in step.outputs:
                if name not in wanted:
                    wanted.append(name)
        for name in self.state.output_names:
            if name not in wanted:
                wanted.append(name)
        requests: tuple[RequestPart, ...] = ()
        if self._per_request:
            requests = tuple(
                RequestPart(
                    1,
                    tuple(dict.fromkeys((*step.outputs, *self.state.output_names))),
                    step.request_id,
                    step.parameters,
                    step.corr_id,
                    (FLAG_START if step.start else 0) | (FLAG_END if step.end else 0),
                )
                for step in real
            )
        return Execution(inputs, tuple(wanted), len(rows) if self._batched else 0, parts=requests)

    def _answer(self, rows: list[Row[_Job]], execution: Execution, result: ExecutionResult, dispatch_ns: int) -> None:
        if result.parts is not None:
            self._answer_parts([r for r in rows if r.pending is not None], execution, result, dispatch_ns)
            return
        first = True
        for index, row in enumerate(rows):
            if row.pending is None:
                continue
            job = row.pending.item
            res = StepResult(
                queue_ns=dispatch_ns - job.arrival_ns + result.wait_ns,
                compute_input_ns=result.compute_input_ns,
                compute_infer_ns=result.compute_infer_ns,
                compute_output_ns=result.compute_output_ns,
            )
            if first:
                res.execution_batch = max(1, execution.batch_size)
                first = False
            if result.error is not None:
                res.error = result.error
            else:
                outs = result.outputs
                if self._batched:
                    res.outputs = {n: outs[n][index : index + 1] for n in job.step.outputs}
                else:
                    res.outputs = {n: outs[n] for n in job.step.outputs}
                if self.state:
                    self.state.store(row.slot, outs, index if self._batched else None)
                    if self.backup and not job.step.end:
                        res.backup = self._backup(job.step, row.slot, res.outputs)
            _resolve(job.future, res)

    def _answer_parts(
        self, rows: list[Row[_Job]], execution: Execution, result: ExecutionResult, dispatch_ns: int
    ) -> None:
        """Each step's own answer (a backend that answers requests one by one)."""
        assert result.parts is not None
        for index, (row, part) in enumerate(zip(rows, result.parts, strict=True)):
            assert row.pending is not None
            job = row.pending.item
            res = StepResult(
                queue_ns=dispatch_ns - job.arrival_ns + result.wait_ns,
                compute_input_ns=result.compute_input_ns,
                compute_infer_ns=result.compute_infer_ns,
                compute_output_ns=result.compute_output_ns,
                execution_batch=max(1, execution.batch_size) if index == 0 else 0,
            )
            if part.error is not None or result.error is not None:
                res.error = part.error or result.error
            else:
                res.outputs = {n: a for n, a in part.outputs.items() if n in job.step.outputs}
                if self.state:
                    self.state.store(row.slot, part.outputs, 0 if self._batched else None)
                    if self.backup and not job.step.end:
                        res.backup = self._backup(job.step, row.slot, res.outputs)
            _resolve(job.future, res)

    # -- state backup ------------------------------------------------------------------------
    def _backup(self, step: SequenceStep, slot: int, outputs: dict[str, np.ndarray]) -> StateBackup:
        """The sequence's state after ``step``, numbered by the step's place in it, for the gateway to pass on."""
        no = 1 if step.start else self._steps.get(slot, 0) + 1
        self._steps[slot] = no
        self._last[slot] = (step.step_id, outputs)
        held = self.state.held(slot) or {}
        return StateBackup(step.corr_id, slot, step.slot_token, held, self.id, no)

    def restore(self, message: RestoreSequence) -> bool:
        """Hold a sequence the router moved here from a lost instance, with its last backed-up state."""
        if any(s.input_name not in message.states for s in self.state.specs):
            return False
        if not self.batcher.adopt(message.slot, message.corr_id, message.slot_token, self._clock()):
            return False
        self.state.put(message.slot, message.states)
        self._last.pop(message.slot, None)
        self._steps[message.slot] = message.no
        self._pump()  # arms the sequence's idle timeout
        return True

    # -- slot events for the router -----------------------------------------------------------
    def _report(self, released: list[SlotEvent]) -> None:
        if not released:
            return
        for e in released:
            self.state.drop(e.slot)
            self._last.pop(e.slot, None)
            self._steps.pop(e.slot, None)
        if self._on_release is not None:
            self._on_release(released)
            return
        self._released.extend(released)
        self._events.set()

    async def poll(self, request: PollEvents) -> InstanceEvents:
        """Slots freed since the last poll (waits up to ``wait_s`` for one) and every occupied slot (with
        ``snapshot``, at once: a restarted router rebuilds its table, and its backups, from it)."""
        if request.snapshot:
            self._released.clear()
        elif not self._released:
            try:
                await asyncio.wait_for(self._events.wait(), request.wait_s)
            except asyncio.TimeoutError:
                pass
        released, self._released = tuple(self._released), []
        occupied = tuple(self.batcher.occupied())
        backups = []
        if request.snapshot and self.backup:  # every held state, with its last step (maybe not yet answered)
            for e in occupied:
                held = self.state.held(e.slot)
                if held is not None:
                    step_id, outputs = self._last.get(e.slot, (0, None))
                    no = self._steps.get(e.slot, 0)
                    backups.append(StateBackup(e.corr_id, e.slot, e.slot_token, held, self.id, no, step_id, outputs))
        self._events.clear()
        return InstanceEvents(self.id, released, occupied, self.draining, tuple(backups))

    def drain(self) -> None:
        """Stopping: tell the router at its next poll to give this instance no new sequence."""
        self.draining = True
        self._events.set()

    def live_sequences(self) -> int:
        return len(self.batcher.occupied())

    @property
    def slots(self) -> int:
        return self.batcher.config.slots


def _resolve(future: asyncio.Future[StepResult], result: StepResult) -> None:
    if not future.done():
        future.set_result(result)
