"""One model instance in a host: its backend on its own thread, its load meter, its sequence batcher.

A load error is kept, not raised: the instance answers every request with
UNAVAILABLE and the reason, so one bad model never fails its host.  An
instance that is stopping refuses new batches with ``Draining`` (gateways send
them to another instance), finishes those in progress and, when only scaled
down, lets its live sequences end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

from serve_app.autoscale import LoadMeter
from serve_app.backends import BackendContext
from serve_app.config.state_backup import state_backup_enabled
from serve_app.errors import Draining, Unavailable, as_serve_error
from serve_app.hosting.instance_thread import InstanceThread
from serve_app.hosting.messages import ExecuteOn, InstanceLoad
from serve_app.inference.execution import Execution, ExecutionResult, PartResult
from serve_app.observability import python_logging
from serve_app.protos import model_config_pb2 as mc
from serve_app.runtime import ModelInstance
from serve_app.runtime.streaming import stream_execution
from serve_app.sequence.instance import SequenceInstance
from serve_app.sequence.messages import (
    InstanceEvents,
    PollEvents,
    RestoreSequence,
    SequenceStep,
    SlotEvent,
    StepResult,
)

# Serve configures and forwards the "ray.serve" logger of its replicas (where hosts and instances run).
logger = logging.getLogger("ray.serve")

Figures = list[tuple[int, int, int, int]]  # warmup executions: (batch size, compute input/infer/output ns)

# A call whose executions recently took less than this runs on the event loop, not the instance's thread: the
# two thread hand-offs cost more than the execution (about 0.1 ms at concurrency 1 for a tiny model, the way
# KServe runs every model).  Longer ones, GPU instances and sequence models keep their thread.
INLINE_MAX_NS = 150_000
# Backends whose execution may run on any thread, one at a time (not CUDA contexts bound to a thread).
_INLINE_BACKENDS = frozenset({"onnxruntime", "pytorch"})


class HostedInstance:
    def __init__(
        self,
        load: InstanceLoad,
        instance_id: str,
        name: str,
        gpu_ids: tuple[int, ...] = (),
        link: Any = None,
        on_release: Callable[[InstanceEvents], None] | None = None,
    ) -> None:
        """``instance_id``: unique across the cluster; ``name``: Triton's ``<group name>_<n>``; ``link``: how
        model code reaches the server (a Python model's BLS calls and model control); ``on_release``: where a
        sequence instance tells its freed slots when the router is in this process (else the router polls)."""
        self._link = link
        self._on_release = on_release
        self.load = load
        self.id = instance_id
        self.name = name
        self.key = load.key
        self.config = mc.ModelConfig.FromString(load.config_bytes)
        self.ctx = BackendContext(
            model_name=load.key.name,
            version=load.key.version,
            config=self.config,
            model_file=Path(load.model_file),
            device_kind=load.kind,
            gpu_ids=gpu_ids,
            instance_group=load.spec.group_index,
            instance_name=name,
        )
        # One execution at a time per instance, off the event loop (Triton: one thread per instance); the
        # thread also serves the instance's lane, when it has one.
        self._thread = InstanceThread(f"{load.key.name}-exec")
        self.meter = LoadMeter(window_s=1.0)  # what autoscaling reads (record_autoscaling_stats)
        self.instance: ModelInstance | None = None
        self.load_error = ""
        self.sequence: SequenceInstance | None = None
        self.warmup_figures: Figures = []
        self._calls = 0  # batch calls in progress
        inline = load.kind == "KIND_CPU" and self.config.backend in _INLINE_BACKENDS
        self._inline = inline and not self.config.HasField("sequence_batching")
        self._recent_ns = INLINE_MAX_NS * 2  # a moving mean of the calls' execution time (the thread until known)
        self.stopping = False  # take no new batches
        self.unloading = False  # the model is unloaded: don't wait for live sequences

    # -- loading -------------------------------------------------------------------------
    async def start(self) -> bool:
        """Load the model and run its warmup on the instance's own thread; False (and ``load_error``) if
        that failed."""
        self._bind_loop(asyncio.get_running_loop())
        await asyncio.get_running_loop().run_in_executor(self._thread, self._load)
        self._attach_sequence()
        return self.instance is not None

    def start_blocking(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """:meth:`start` from a constructor that can't await (``loop``: the one the instance will serve on)."""
        self._bind_loop(loop)
        self._thread.submit(self._load).result()
        self._attach_sequence()
        return self.instance is not None

    def _bind_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Model code that calls the server (BLS) runs those calls on the loop the instance serves on."""
        if self._link is not None:
            self.ctx = dataclasses.replace(self.ctx, server_link=self._link, loop=loop)

    def _load(self) -> None:
        try:
            instance = ModelInstance(self.ctx)
            # Triton warms every instance up before it is ready, on the thread that runs its executions; a
            # failing sample fails the load (the model is UNAVAILABLE with that reason).
            try:
                warmup = instance.warm_up()
            except BaseException:
                instance.close()
                raise
            self.instance = instance
            self.warmup_figures = warmup.figures()
            if warmup.samples or warmup.skipped:
                logger.info(warmup.describe(self.key.name, self.key.version))
        except Exception as exc:
            self.instance = None
            self.load_error = as_serve_error(exc).message

    def _attach_sequence(self) -> None:
        if self.instance is None or not self.config.HasField("sequence_batching"):
            return
        self.sequence = SequenceInstance(
            self.config,
            self.ctx.model_file.parent.parent,
            self._run_one,
            instance_id=self.id,
            on_release=self._released if self._on_release is not None else None,
            backup=state_backup_enabled(self.config),
            per_request=self.instance.backend.per_request,
        )

    def _released(self, events: list[SlotEvent]) -> None:
        assert self._on_release is not None
        self._on_release(InstanceEvents(self.id, tuple(events)))

    def _failed(self) -> Unavailable:
        return Unavailable(f"model '{self.key.name}' version {self.key.version} failed to load: {self.load_error}")

    # -- work ------------------------------------------------------------------------------
    async def execute(self, executions: list[Execution], timeout_s: float | None = None) -> list[ExecutionResult]:
        """Run the executions one call carries, in order, on this instance (``asyncio.TimeoutError`` when its
        thread takes longer than ``timeout_s``: a call run inline on the loop is not timed)."""
        if self.instance is None:
            err = self._failed()
            return [ExecutionResult(error=err) for _ in executions]
        if self.stopping:
            raise Draining(f"model '{self.key.name}' version {self.key.version}: this instance is stopping")
        inline = self._inline and self._calls == 0 and self._recent_ns < INLINE_MAX_NS
        self._calls += 1
        try:
            if inline:  # nothing runs on the instance's thread now, and this is short: no hand-off
                results = self._run_all(executions, time.perf_counter_ns())
            else:
                loop = asyncio.get_running_loop()
                running = loop.run_in_executor(self._thread, self._run_all, executions, time.perf_counter_ns())
                results = await (running if timeout_s is None else asyncio.wait_for(running, timeout_s))
        finally:
            self._calls -= 1
        spent = sum(r.compute_input_ns + r.compute_infer_ns + r.compute_output_ns for r in results)
        self._recent_ns = (self._recent_ns + spent) // 2
        return results

    @property
    def calls(self) -> int:
        """Batch calls in progress (to pick the least busy of a version's instances)."""
        return self._calls

    def open_lane(self, token: bytes) -> str:
        """Let gateways on this node send batches straight to this instance's thread (a Unix socket: see
        :mod:`~serve_app.hosting.instance_thread`); its path, or "" where it has none (a sequence model's steps
        go through its sequence batcher, a decoupled model's responses stream over the channel, and a model that
        failed to load answers on its channel)."""
        decoupled = self.config.model_transaction_policy.decoupled  # its responses stream over the channel
        if self.instance is None or self.sequence is not None or decoupled or not token:
            return ""
        return self._thread.open_lane(self._on_lane, token, self.id)

    def _on_lane(self, message: object) -> list[ExecutionResult]:
        """A lane call, on the instance's thread: what :meth:`execute` does, without the hand-offs."""
        if not isinstance(message, ExecuteOn) or message.instance != self.id:
            raise Unavailable(f"a lane of model '{self.key.name}' got {type(message).__name__} for another instance")
        if message.logs is not None:
            python_logging.apply(message.logs)
        if self.stopping:
            raise Draining(f"model '{self.key.name}' version {self.key.version}: this instance is stopping")
        return self._run_all(message.executions, time.perf_counter_ns())

    def _run_all(self, executions: list[Execution], arrived_ns: int) -> list[ExecutionResult]:
        assert self.instance is not None
        self.meter.queued(*[e.queue_ns / 1000 for e in executions])
        self.meter.begin()
        try:
            return self.instance.run_all(executions, arrived_ns)
        finally:
            self.meter.end()

    def _run_step(self, execution: Execution) -> ExecutionResult:
        assert self.instance is not None
        self.meter.begin()
        try:
            return self.instance.run(execution)
        finally:
            self.meter.end()

    async def _run_one(self, execution: Execution) -> ExecutionResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._run_step, execution)

    async def stream(self, execution: Execution) -> AsyncGenerator[tuple[int, PartResult], None]:
        """A decoupled execution's responses, (request index, response), as the model sends them; the stream
        ends once every request has had its final one.  Closing it early (the client went away) cancels the
        requests still open: ``is_cancelled()`` turns true for the model."""
        if self.instance is None:
            err = self._failed()
            for index in range(max(1, len(execution.parts))):
                yield index, PartResult(error=err)
            return
        if self.stopping:
            raise Draining(f"model '{self.key.name}' version {self.key.version}: this instance is stopping")
        self._calls += 1
        self.meter.begin()
        try:
            async with contextlib.aclosing(stream_execution(self.instance, execution, self._thread)) as items:
                async for item in items:
                    yield item
        finally:
            self.meter.end()
            self._calls -= 1

    async def step(self, step: SequenceStep) -> StepResult:
        if self.sequence is None:
            return StepResult(error=self._failed())
        return await self.sequence.step(step)

    async def poll(self, request: PollEvents) -> InstanceEvents:
        if self.sequence is None:
            raise Unavailable(f"model '{self.key.name}' version {self.key.version} has no sequence batcher here")
        return await self.sequence.poll(request)

    def restore(self, message: RestoreSequence) -> bool:
        return self.sequence is not None and not self.stopping and self.sequence.restore(message)

    def metrics(self) -> dict[str, float]:
        """This instance's load, for its model's autoscaling policy (Serve can't see channel traffic)."""
        if self.sequence is not None:
            self.meter.set_slots(self.sequence.live_sequences(), self.sequence.slots)
        return self.meter.metrics()

    # -- stopping --------------------------------------------------------------------------
    async def stop(self, deadline: float) -> None:
        """Finish the batches in progress and, unless unloading, let live sequences end (until
        ``deadline``, a ``time.monotonic()`` reading); new batches are refused from now on."""
        self.stopping = True
        if self.sequence is not None:
            self.sequence.drain()
        while (self._calls or self._thread.lane_calls) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.sequence is not None and not self.unloading:
            while self.sequence.live_sequences() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)

    def close(self) -> None:
        if self.instance is not None:
            self.instance.close()
        self._thread.shutdown(wait=False)
