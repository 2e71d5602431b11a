"""ModelExecutor over Ray Serve handles, one coalescer per model deployment."""

from __future__ import annotations

from typing import Any

from serve_app.errors import InternalError, ServeError
from serve_app.inference.types import InferRequest, InferResponse
from serve_app.scheduling.coalescer import Coalescer
from serve_app.service.catalog import ModelVersionEntry


class RayModelExecutor:
    def __init__(self, handles: dict[tuple[str, int], list[Any]], *, max_inflight: int) -> None:
        self._coalescers: dict[tuple[str, int], list[Coalescer[InferRequest, InferResponse]]] = {}
        for key, hs in handles.items():
            self._coalescers[key] = [self._make(h, max_inflight) for h in hs]

    @staticmethod
    def _make(handle: Any, max_inflight: int) -> Coalescer[InferRequest, InferResponse]:
        method = handle.infer_batch

        async def send(batch: list[InferRequest]) -> list[InferResponse | ServeError]:
            result: list[InferResponse | ServeError] = await method.remote(batch)
            return result

        return Coalescer(send, max_inflight=max_inflight)

    async def infer(self, entry: ModelVersionEntry, request: InferRequest) -> InferResponse:
        group = self._coalescers.get((entry.name, entry.version))
        if not group:
            raise InternalError(f"no deployment serves model '{entry.name}' version {entry.version}")
        target = group[0] if len(group) == 1 else min(group, key=lambda c: c.inflight + c.pending)
        return await target.submit(request)
