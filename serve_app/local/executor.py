"""Run models in this process: the ModelExecutor of the local host (tests, tools, serving without Ray)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from serve_app.errors import InternalError
from serve_app.inference.execution import Execution, ExecutionResult, PartResult
from serve_app.inference.options import CorrId
from serve_app.keys import ModelKey
from serve_app.runtime.instance import ModelInstance
from serve_app.runtime.streaming import stream_execution
from serve_app.sequence.batcher import SequenceBatchingConfig
from serve_app.sequence.instance import SequenceInstance
from serve_app.sequence.messages import (
    Assignment,
    InstanceEvents,
    Recovery,
    SequenceStep,
    SlotEvent,
    StateBackup,
    StepResult,
)
from serve_app.sequence.router import SequenceRouter


class LocalSequencePort:
    """A sequence model's router and instance in this process: the same logic as on Ray, called directly."""

    def __init__(self, key: str, router: SequenceRouter, instance: SequenceInstance) -> None:
        self._key = key
        self._router = router
        self.instance = instance

    async def assign(self, corr_id: CorrId, timeout_us: int = 0) -> Assignment:
        return await self._router.assign(self._key, corr_id, timeout_us)

    async def lookup(self, corr_id: CorrId, timeout_us: int = 0) -> Assignment:
        return await self._router.lookup(self._key, corr_id, timeout_us)

    async def recover(self, corr_id: CorrId, failed_instance: str, step_id: int) -> Recovery:
        return await self._router.recover(self._key, corr_id, failed_instance, step_id)

    def backup(self, backup: StateBackup) -> None:
        self._router.assigner(self._key).backed_up("", (backup,))

    def backlog_deadline(self, corr_id: CorrId, timeout_us: int) -> None:
        self._router.shorten(self._key, corr_id, timeout_us)

    async def dispatch(self, assignment: Assignment, step: SequenceStep) -> asyncio.Future[StepResult]:
        # A task starts in creation order and queues its step before its first await: steps keep their order.
        return asyncio.ensure_future(self.instance.step(step))


class LocalModelExecutor:
    """One instance per model version, executing on its own thread, one call at a time."""

    def __init__(self, instances: dict[ModelKey, ModelInstance], link: Any = None) -> None:
        """``link``: what the instances' Python models call the server through; it learns the service's event
        loop from the first call here."""
        self._instances = instances
        self._link = link
        self._threads = {key: ThreadPoolExecutor(max_workers=1) for key in instances}
        self.router = SequenceRouter()
        self._ports: dict[ModelKey, LocalSequencePort] = {}

    def capacity(self, key: ModelKey) -> int:
        return 1

    def instances(self, key: ModelKey) -> int:
        return 1 if key.version_key in self._instances else 0

    def _instance(self, key: ModelKey) -> ModelInstance:
        instance = self._instances.get(key.version_key)
        if instance is None:
            raise InternalError(f"model '{key.name}' version {key.version} is not loaded here")
        return instance

    async def execute(self, key: ModelKey, executions: list[Execution]) -> list[ExecutionResult]:
        instance = self._instance(key)
        loop = asyncio.get_running_loop()
        if self._link is not None:
            self._link.loop = loop
        return await loop.run_in_executor(self._threads[key.version_key], instance.run_all, executions)

    async def stream(self, key: ModelKey, execution: Execution) -> AsyncGenerator[tuple[int, PartResult], None]:
        instance = self._instance(key)
        if self._link is not None:
            self._link.loop = asyncio.get_running_loop()
        stream = stream_execution(instance, execution, self._threads[key.version_key])
        async with contextlib.aclosing(stream) as items:
            async for item in items:
                yield item

    def sequence_port(self, key: ModelKey) -> LocalSequencePort:
        port = self._ports.get(key.version_key)
        if port is not None:
            return port
        instance = self._instance(key)
        config = instance.ctx.config
        thread = self._threads[key.version_key]
        label, instance_id = key.label, f"local-{key.name}-{key.version}"

        async def run(execution: Execution) -> ExecutionResult:
            if self._link is not None:
                self._link.loop = asyncio.get_running_loop()
            return await asyncio.get_running_loop().run_in_executor(thread, instance.run, execution)

        def released(events: list[SlotEvent]) -> None:
            self.router.released(label, InstanceEvents(instance_id, tuple(events)))

        seq = SequenceInstance(
            config,
            instance.ctx.model_file.parent.parent,
            run,
            instance_id=instance_id,
            on_release=released,
            per_request=instance.backend.per_request,
        )
        self.router.add_model(label, key.name, SequenceBatchingConfig.from_model_config(config).slots)
        self.router.instance_up(label, instance_id, ("local", 0))
        port = self._ports[key.version_key] = LocalSequencePort(label, self.router, seq)
        return port

    def close(self) -> None:
        for thread in self._threads.values():
            thread.shutdown(wait=False)
