"""The repository API as the gateways answer it: every call goes to the one model manager."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serve_app.repository.api import IndexEntry, LoadParameters


class ManagerClient:
    """RepositoryControl over the model manager's Serve handle: one answer for every gateway replica."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager

    async def index(self, ready_only: bool) -> list[IndexEntry]:
        entries: list[IndexEntry] = await self._manager.index.remote(ready_only)
        return entries

    async def load(self, name: str, params: LoadParameters) -> None:
        await self._manager.load.remote(name, params.config_json, dict(params.files))

    async def unload(self, name: str, unload_dependents: bool) -> None:
        await self._manager.unload.remote(name, unload_dependents)
