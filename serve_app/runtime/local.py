"""Run models in this process: the ModelExecutor for tests and tools without Ray."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from serve_app.errors import InternalError
from serve_app.inference.types import InferRequest, InferResponse
from serve_app.runtime.instance import ModelInstance
from serve_app.service.catalog import ModelVersionEntry


class LocalModelExecutor:
    def __init__(self, instances: dict[tuple[str, int], ModelInstance]) -> None:
        self._instances = instances
        self._threads = {key: ThreadPoolExecutor(max_workers=1) for key in instances}

    async def infer(self, entry: ModelVersionEntry, request: InferRequest) -> InferResponse:
        key = (entry.name, entry.version)
        instance = self._instances.get(key)
        if instance is None:
            raise InternalError(f"model '{entry.name}' version {entry.version} is not loaded here")
        loop = asyncio.get_running_loop()
        (result,) = await loop.run_in_executor(self._threads[key], instance.execute, [request])
        if isinstance(result, BaseException):
            raise result
        return result
