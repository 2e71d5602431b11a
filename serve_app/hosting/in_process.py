"""The service's executor when a host and its service share a process (the local server).

Batches go straight to the least busy loaded instance of their version, as a
Ray gateway calls the instances it holds itself, with no channel in between;
a sequence model's steps go through a sequence router in this process.
Pure of Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from serve_app.errors import InternalError
from serve_app.hosting.host import InstanceHost
from serve_app.hosting.instance import HostedInstance
from serve_app.inference.execution import Execution, ExecutionResult, PartResult
from serve_app.keys import ModelKey
from serve_app.sequence.batcher import SequenceBatchingConfig
from serve_app.sequence.messages import SequenceStep, StepResult
from serve_app.sequence.port import InProcessSequencePort
from serve_app.sequence.router import SequenceRouter


class InProcessExecutor:
    def __init__(self, host: InstanceHost, router: SequenceRouter, link: Any = None) -> None:
        """``router``: the one ``host`` tells of freed slots (its ``on_release``); ``link``: what the
        instances' Python models call the server through: it learns the service's event loop from each call
        here (tests drive one service from several loops)."""
        self.host = host
        self.router = router
        self._link = link
        self._ports: dict[ModelKey, InProcessSequencePort] = {}

    def _loaded(self, key: ModelKey) -> list[HostedInstance]:
        return [i for i in self.host.of(key) if i.instance is not None]

    def capacity(self, key: ModelKey) -> int:
        return max(1, len(self._loaded(key)))

    def instances(self, key: ModelKey) -> int:
        return len(self._loaded(key))

    def _pick(self, key: ModelKey) -> HostedInstance:
        loaded = self._loaded(key)
        if not loaded:
            raise InternalError(f"model '{key.name}' version {key.version} is not loaded here")
        if self._link is not None:
            self._link.loop = asyncio.get_running_loop()
        return min(loaded, key=lambda i: i.calls)

    async def execute(self, key: ModelKey, executions: list[Execution]) -> list[ExecutionResult]:
        return await self._pick(key).execute(executions)

    async def stream(self, key: ModelKey, execution: Execution) -> AsyncGenerator[tuple[int, PartResult], None]:
        async with contextlib.aclosing(self._pick(key).stream(execution)) as items:
            async for item in items:
                yield item

    def sequence_port(self, key: ModelKey) -> InProcessSequencePort:
        port = self._ports.get(key)
        if port is not None:
            return port
        loaded = [i for i in self._loaded(key) if i.sequence is not None]
        if not loaded:
            raise InternalError(f"model '{key.name}' version {key.version} is not loaded here")
        self.router.add_model(key.label, key.name, SequenceBatchingConfig.from_model_config(loaded[0].config).slots)
        for instance in loaded:
            self.router.instance_up(key.label, instance.id, (self.host.host_id, 0))
        port = self._ports[key] = InProcessSequencePort(key.label, self.router, self._step)
        return port

    async def _step(self, step: SequenceStep) -> StepResult:
        if self._link is not None:
            self._link.loop = asyncio.get_running_loop()
        return await self.host.step(step)
