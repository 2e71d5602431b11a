"""Run models in this process: the ModelExecutor for tests and tools without Ray."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from serve_app.errors import InternalError
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.runtime.instance import ModelInstance
from serve_app.service.catalog import ModelVersionEntry


class LocalModelExecutor:
    """One instance per model version, executing on its own thread, one call at a time."""

    def __init__(self, instances: dict[tuple[str, int], ModelInstance]) -> None:
        self._instances = instances
        self._threads = {key: ThreadPoolExecutor(max_workers=1) for key in instances}

    def capacity(self, entry: ModelVersionEntry) -> int:
        return 1

    async def execute(self, entry: ModelVersionEntry, executions: list[Execution]) -> list[ExecutionResult]:
        key = (entry.name, entry.version)
        instance = self._instances.get(key)
        if instance is None:
            raise InternalError(f"model '{entry.name}' version {entry.version} is not loaded here")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads[key], instance.run_all, executions)
