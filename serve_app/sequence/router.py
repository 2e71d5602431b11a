"""The sequence router's logic for every sequence model: assignment, backlog waits, slot events.

It wraps one :class:`~serve_app.sequence.assigner.SequenceAssigner`
per model version and lets a START (or a step of a backlogged or restoring
sequence) wait until its sequence is admitted, or until the request's
``timeout`` ends the wait (Triton's backlog timeout: every waiting request of
the sequence fails, and the ID is forgotten).  After an instance is lost it
answers gateways whose steps failed with it (:meth:`recover`): where the
sequence goes on, and the step's answer if the backed-up state includes it.
It imports no Ray: the Ray layer hosts it in one actor
(``serve_app.rayserve.sequence_router_deployment``), tests and the in-process executor
call it directly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from serve_app.errors import NotFound, ServeError, Unavailable
from serve_app.inference.options import CorrId
from serve_app.sequence.assigner import Restore, SequenceAssigner
from serve_app.sequence.backups import BackupRecord
from serve_app.sequence.messages import (
    BACKLOG_TIMEOUT,
    Assignment,
    AssignRequest,
    BacklogDeadline,
    InstanceEvents,
    LookupRequest,
    RecoverRequest,
    Recovery,
    SlotEvent,
    StateBackups,
)

logger = logging.getLogger("serve_app")

RESTORE_WAIT_S = 60.0  # how long a lost instance's sequences wait for a free slot (Serve replaces a replica in ~10 s)
RECOVER_WAIT_S = 20.0  # how long a failed step waits for its instance to be declared lost (polls time out at 15 s)


class SequenceRouter:
    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock = clock
        self._backlog_timer: asyncio.TimerHandle | None = None
        self._models: dict[str, SequenceAssigner] = {}
        self._waiters: dict[tuple[str, CorrId], list[asyncio.Future[Assignment]]] = {}
        self._down_waiters: dict[tuple[str, str], list[asyncio.Future[None]]] = {}
        self.restore_wait_ns = int(RESTORE_WAIT_S * 1e9)
        self.recover_wait_s = RECOVER_WAIT_S

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
            return await self.assign(message.model, message.corr_id, message.timeout_us)
        if isinstance(message, LookupRequest):
            return await self.lookup(message.model, message.corr_id, message.timeout_us)
        if isinstance(message, RecoverRequest):
            return await self.recover(message.model, message.corr_id, message.failed_instance, message.step_id)
        raise TypeError(f"unexpected message {type(message).__name__}")

    def one_way(self, message: Any) -> None:
        """Messages that get no answer: states gateways pass on (:class:`StateBackups`), backlog deadlines of
        steps held behind their START (:class:`BacklogDeadline`)."""
        if isinstance(message, BacklogDeadline):
            self.shorten(message.model, message.corr_id, message.timeout_us)
            return
        if not isinstance(message, StateBackups):
            raise TypeError(f"unexpected one-way message {type(message).__name__}")
        table = self._models.get(message.model)
        if table is not None:
            table.backed_up("", message.backups)

    async def assign(self, key: str, corr_id: CorrId, timeout_us: int = 0) -> Assignment:
        """The START's slot; waits in the backlog for at most ``timeout_us`` (0: no limit)."""
        deadline = self._deadline(timeout_us)
        for _ in range(3):
            placed = self.assigner(key).start(corr_id, deadline)
            if placed is not None:
                return placed
            self._arm_backlog_timer()
            try:
                return await self._wait(key, corr_id)
            except Unavailable as exc:
                if key not in self._models or exc.message == BACKLOG_TIMEOUT:
                    raise  # unloaded, or its timeout ended its wait in the backlog
                # It waited for its sequence's restore, which failed: a START needs no old state, so start anew.
                continue
        return await self._wait(key, corr_id)

    async def lookup(self, key: str, corr_id: CorrId, timeout_us: int = 0) -> Assignment:
        placed = self.assigner(key).lookup(corr_id, self._deadline(timeout_us))
        if placed is not None:
            return placed
        self._arm_backlog_timer()
        return await self._wait(key, corr_id)

    # -- backlog timeouts -----------------------------------------------------------------
    def _deadline(self, timeout_us: int) -> int:
        return self._clock() + timeout_us * 1000 if timeout_us > 0 else 0

    def shorten(self, key: str, corr_id: CorrId, timeout_us: int) -> None:
        """A request of a backlogged sequence that waits elsewhere (behind its START, in its gateway) carries a
        timeout: the sequence's wait in the backlog ends by then at the latest."""
        table = self._models.get(key)
        if table is not None and timeout_us > 0:
            table.shorten(corr_id, self._deadline(timeout_us))
            self._arm_backlog_timer()

    def expire_backlogs(self) -> None:
        """Fail the waiting requests of backlogged sequences whose timeout has passed (Triton's message)."""
        self._backlog_timer = None
        now = self._clock()
        for key, table in list(self._models.items()):
            for corr in table.expire_backlog(now):
                logger.info("model %s: sequence %s timed out in the backlog", key, corr)
                self._fail(key, corr, Unavailable(BACKLOG_TIMEOUT))
        self._arm_backlog_timer()

    def _arm_backlog_timer(self) -> None:
        """Wake up at the earliest backlog deadline."""
        deadline = min((d for t in self._models.values() if (d := t.next_deadline())), default=0)
        if self._backlog_timer is not None:
            self._backlog_timer.cancel()
            self._backlog_timer = None
        if deadline:
            delay_s = max(0.0, (deadline - self._clock()) / 1e9)
            self._backlog_timer = asyncio.get_running_loop().call_later(delay_s, self.expire_backlogs)

    async def recover(self, key: str, corr_id: CorrId, failed_instance: str, step_id: int) -> Recovery:
        """A step failed with ``failed_instance``: wait until that instance is declared lost (if it is, its
        sequences are being restored) and the sequence's new place is known."""
        table = self.assigner(key)
        current = table.active.get(corr_id)
        if current is not None and current.instance == failed_instance and table.has_instance(failed_instance):
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiters = self._down_waiters.setdefault((key, failed_instance), [])
            waiters.append(future)
            try:
                await asyncio.wait_for(future, self.recover_wait_s)
            except asyncio.TimeoutError:
                raise Unavailable(
                    f"sequence {corr_id} of model '{table.model_name}' was lost: its instance failed "
                    "to answer; send its next request with the START flag to start it again"
                ) from None
            finally:
                if future in waiters:
                    waiters.remove(future)
                if not waiters:
                    self._down_waiters.pop((key, failed_instance), None)
        assignment = await self.lookup(key, corr_id)
        record = table.backups.get(corr_id)
        return Recovery(assignment, table.backups.answer(corr_id, step_id), record.no if record is not None else 0)

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

    def instance_down(
        self, key: str, instance: str, reason: str, now_ns: int | None = None, *, restore: bool = True
    ) -> None:
        """An instance is gone: its sequences are restored elsewhere when backed up (unless ``restore`` is
        False: its model was unloaded or reloaded), else lost."""
        table = self.assigner(key)
        now = time.monotonic_ns() if now_ns is None else now_ns
        lost = table.remove_instance(instance, reason, now, restore)
        if lost:
            logger.warning("model %s: %d sequence(s) lost with instance %s: %s", key, len(lost), instance, reason)
        for corr in lost:
            self._fail(key, corr)
        if table.restoring():
            logger.warning("model %s: %d sequence(s) of instance %s to restore", key, table.restoring(), instance)
        for future in self._down_waiters.pop((key, instance), ()):
            if not future.done():
                future.set_result(None)

    def backed_up(self, key: str, events: InstanceEvents) -> None:
        """The states in an instance's snapshot."""
        if events.backups:
            self.assigner(key).backed_up(events.instance, events.backups)

    def backup_of(self, key: str, corr_id: CorrId) -> BackupRecord | None:
        table = self._models.get(key)
        return table.backups.get(corr_id) if table is not None else None

    def take_restores(self, key: str) -> list[Restore]:
        table = self._models.get(key)
        return table.take_restores() if table is not None else []

    def restored(self, key: str, restore: Restore, ok: bool, reason: str = "") -> None:
        """A restore's outcome: the sequence's waiting steps go on, or get the "was lost" error."""
        table = self._models.get(key)
        if table is None:
            return
        why = f"its instance failed and restoring its state failed ({reason})"
        admitted, lost = table.restored(restore.corr_id, restore.assignment, ok, why)
        if lost:
            logger.warning("model %s: sequence %s could not be restored: %s", key, restore.corr_id, reason)
            self._fail(key, restore.corr_id)
        self._admitted(key, admitted)

    def expire_restores(self, now_ns: int) -> None:
        for key, table in self._models.items():
            for corr in table.expire_restores(now_ns, self.restore_wait_ns):
                self._fail(key, corr)

    def _fail(self, key: str, corr_id: CorrId, error: ServeError | None = None) -> None:
        """Waiting steps of a sequence that is lost get ``error``, or the error a lookup gives now."""
        waiters = self._waiters.pop((key, corr_id), ())
        if not waiters:
            return
        if error is None:
            try:
                self.assigner(key).lookup(corr_id)
                error = Unavailable(f"sequence {corr_id} was lost")
            except ServeError as exc:
                error = exc
        for future in waiters:
            if not future.done():
                future.set_exception(error)

    def released(self, key: str, events: InstanceEvents, now_ns: int | None = None) -> None:
        """Slots an instance freed; with ``now_ns``, ``events.occupied`` is its full list of held slots
        and slots given out but never taken up are reclaimed after the grace period."""
        table = self.assigner(key)
        for e in events.released:
            self._admitted(key, table.release(events.instance, e.slot, e.corr_id, e.slot_token))
        if now_ns is not None:
            self._admitted(key, table.reconcile(events.instance, events.occupied, now_ns))
            self.expire_restores(now_ns)

    def _admitted(self, key: str, admitted: list[tuple[CorrId, Assignment]]) -> None:
        for corr_id, assignment in admitted:
            for future in self._waiters.pop((key, corr_id), ()):
                if not future.done():
                    future.set_result(assignment)
