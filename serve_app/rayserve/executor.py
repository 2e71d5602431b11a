"""ModelExecutor over Ray Serve handles: one call per batch, to the least busy instance group."""

from __future__ import annotations

from typing import Any

from serve_app.errors import InternalError
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.service.catalog import ModelVersionEntry


class _Group:
    """One Serve deployment (an instance group) of a model version."""

    __slots__ = ("inflight", "method", "replicas")

    def __init__(self, handle: Any, replicas: int) -> None:
        self.method = handle.execute
        self.replicas = max(1, replicas)
        self.inflight = 0


class RayModelExecutor:
    def __init__(self, groups: dict[tuple[str, int], list[tuple[Any, int]]], *, inflight_per_instance: int) -> None:
        """``groups``: for each (model, version), its deployments' handles and replica counts."""
        self._groups = {key: [_Group(h, n) for h, n in hs] for key, hs in groups.items()}
        self._per_instance = max(1, inflight_per_instance)

    def capacity(self, entry: ModelVersionEntry) -> int:
        return sum(g.replicas for g in self._groups.get((entry.name, entry.version), ())) * self._per_instance

    async def execute(self, entry: ModelVersionEntry, executions: list[Execution]) -> list[ExecutionResult]:
        groups = self._groups.get((entry.name, entry.version))
        if not groups:
            raise InternalError(f"no deployment serves model '{entry.name}' version {entry.version}")
        group = groups[0] if len(groups) == 1 else min(groups, key=lambda g: g.inflight / g.replicas)
        group.inflight += 1
        try:
            result: list[ExecutionResult] = await group.method.remote(executions)
            return result
        finally:
            group.inflight -= 1
