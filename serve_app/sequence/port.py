"""How a gateway reaches the sequence router and the instances of one sequence model.

Steps go straight to the instance that holds their sequence (one write on a
connection shared by every sequence of that instance); only STARTs and steps
whose place the gateway does not know ask the router.  The router's address
is resolved again whenever its channel breaks (``transport/router_client.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from serve_app.inference.options import CorrId
from serve_app.sequence.messages import (
    Assignment,
    AssignRequest,
    BacklogDeadline,
    LookupRequest,
    RecoverRequest,
    Recovery,
    SequenceStep,
    StateBackup,
    StateBackups,
    StepResult,
)
from serve_app.sequence.router import SequenceRouter
from serve_app.transport.pool import ChannelPool
from serve_app.transport.router_client import RouterClient


class SequencePort(Protocol):
    """How the gateway reaches the sequence router and the instances of one model version."""

    async def assign(self, corr_id: CorrId, timeout_us: int = 0) -> Assignment:
        """A slot for a START (waiting in the backlog for at most ``timeout_us``; 0: no limit)."""
        ...

    async def lookup(self, corr_id: CorrId, timeout_us: int = 0) -> Assignment:
        """Where a continuing sequence is (waiting while it is backlogged, as :meth:`assign`)."""
        ...

    async def recover(self, corr_id: CorrId, failed_instance: str, step_id: int) -> Recovery: ...

    def backup(self, backup: StateBackup) -> None:
        """Pass the state after an answered step on to the router (no waiting)."""
        ...

    def backlog_deadline(self, corr_id: CorrId, timeout_us: int) -> None:
        """Tell the router (no waiting) that a step held behind the sequence's backlogged START has a timeout."""
        ...

    async def dispatch(self, assignment: Assignment, step: SequenceStep) -> asyncio.Future[StepResult]:
        """Hand ``step`` to its instance; returns once it is sent, with a future for its result."""
        ...


class ChannelSequencePort:
    """A :class:`SequencePort` for one model version, over direct channels (the Ray gateway's)."""

    def __init__(self, key: str, router: RouterClient, pool: ChannelPool) -> None:
        self._key = key
        self._router = router
        self._pool = pool
        self._backups: list[StateBackup] = []

    def backup(self, backup: StateBackup) -> None:
        """Pass a step's state on to the router; the backups of one event-loop turn travel as one message."""
        if not self._backups:
            asyncio.get_running_loop().call_soon(self._flush)
        self._backups.append(backup)

    def _flush(self) -> None:
        backups, self._backups = tuple(self._backups), []
        self._router.post(StateBackups(self._key, backups))

    def backlog_deadline(self, corr_id: CorrId, timeout_us: int) -> None:
        self._router.post(BacklogDeadline(self._key, corr_id, timeout_us))  # after the START, on one connection

    async def assign(self, corr_id: CorrId, timeout_us: int = 0) -> Assignment:
        result: Assignment = await self._router.call(AssignRequest(self._key, corr_id, timeout_us))
        return result

    async def lookup(self, corr_id: CorrId, timeout_us: int = 0) -> Assignment:
        result: Assignment = await self._router.call(LookupRequest(self._key, corr_id, timeout_us))
        return result

    async def recover(self, corr_id: CorrId, failed_instance: str, step_id: int) -> Recovery:
        result: Recovery = await self._router.call(RecoverRequest(self._key, corr_id, failed_instance, step_id))
        return result

    async def dispatch(self, assignment: Assignment, step: SequenceStep) -> asyncio.Future[StepResult]:
        client = await self._pool.get(assignment.address)
        return client.send(step)


class InProcessSequencePort:
    """A :class:`SequencePort` whose router and instances are in this process (the local server's): the same
    logic as over channels, called directly.  ``send`` runs a step on the instance it names."""

    def __init__(self, key: str, router: SequenceRouter, send: Callable[[SequenceStep], Awaitable[StepResult]]) -> None:
        self._key = key
        self._router = router
        self._send = send

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
        return asyncio.ensure_future(self._send(step))
