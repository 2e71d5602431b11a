"""The sequence router's logic for every sequence model: assignment, backlog waits, slot events.

It wraps one :class:`~serve_app.scheduling.sequence_assigner.SequenceAssigner`
per model version and lets a START (or a step of a backlogged sequence) wait
until its sequence is admitted.  It imports no Ray: the Ray layer hosts it in
one actor (``serve_app.rayserve.sequence_router``), tests and the in-process
executor call it directly.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from serve_app.errors import NotFound, Unavailable
from serve_app.inference.sequence import (
    Assignment,
    AssignRequest,
    CorrId,
    InstanceEvents,
    LookupRequest,
    SlotEvent,
)
from serve_app.scheduling.sequence_assigner import SequenceAssigner

logger = logging.getLogger("serve_app")


class SequenceRouter:
    def __init__(self) -> None:
        self._models: dict[str, SequenceAssigner] = {}
        self._waiters: dict[tuple[str, CorrId], list[asyncio.Future[Assignment]]] = {}

    def add_model(self, key: str, model_name: str, slots_per_instance: int, grace_ns: int = 10_000_000_000) -> None:
        self._models.setdefault(key, SequenceAssigner(model_name, slots_per_instance, grace_ns))

    def remove_model(self, key: str) -> None:
        """Forget an unloaded model; sequences waiting in its backlog fail."""
        self._models.pop(key, None)
        for waiter_key in [k for k in self._waiters if k[0] == key]:
            for future in self._waiters.pop(waiter_key):
                if not future.done():
                    future.set_exception(Unavailable(f"model '{key}' was unloaded"))

    def assigner(self, key: str) -> SequenceAssigner:
        table = self._models.get(key)
        if table is None:
            raise NotFound(f"no sequence model '{key}' is served")
        return table

    # -- requests from gateways --------------------------------------------------------
    async def handle(self, message: Any) -> Any:
        if isinstance(message, AssignRequest):
            return await self.assign(message.model, message.corr_id)
        if isinstance(message, LookupRequest):
            return await self.lookup(message.model, message.corr_id)
        raise TypeError(f"unexpected message {type(message).__name__}")

    async def assign(self, key: str, corr_id: CorrId) -> Assignment:
        placed = self.assigner(key).start(corr_id)
        return placed if placed is not None else await self._wait(key, corr_id)

    async def lookup(self, key: str, corr_id: CorrId) -> Assignment:
        placed = self.assigner(key).lookup(corr_id)
        return placed if placed is not None else await self._wait(key, corr_id)

    async def _wait(self, key: str, corr_id: CorrId) -> Assignment:
        future: asyncio.Future[Assignment] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault((key, corr_id), [])
        waiters.append(future)
        try:
            return await future
        except asyncio.CancelledError:
            # Its requests gave up: a backlogged sequence nobody waits for must not take a slot later.
            if future in waiters:
                waiters.remove(future)
            if not waiters:
                self._waiters.pop((key, corr_id), None)
                self.assigner(key).cancel(corr_id)
            raise

    # -- events from instances ----------------------------------------------------------------
    def instance_up(
        self, key: str, instance: str, address: tuple[str, int], occupied: tuple[SlotEvent, ...] = ()
    ) -> None:
        self._admitted(key, self.assigner(key).add_instance(instance, address, occupied))

    def instance_down(self, key: str, instance: str, reason: str) -> None:
        lost = self.assigner(key).remove_instance(instance, reason)
        if lost:
            logger.warning("model %s: %d sequence(s) lost with instance %s: %s", key, len(lost), instance, reason)

    def released(self, key: str, events: InstanceEvents, now_ns: int | None = None) -> None:
        """Slots an instance freed; with ``now_ns``, ``events.occupied`` is its full list of held slots
        and slots given out but never taken up are reclaimed after the grace period."""
        table = self.assigner(key)
        for e in events.released:
            self._admitted(key, table.release(events.instance, e.slot, e.corr_id, e.generation))
        if now_ns is not None:
            self._admitted(key, table.reconcile(events.instance, events.occupied, now_ns))

    def _admitted(self, key: str, admitted: list[tuple[CorrId, Assignment]]) -> None:
        for corr_id, assignment in admitted:
            for future in self._waiters.pop((key, corr_id), ()):
                if not future.done():
                    future.set_result(assignment)
