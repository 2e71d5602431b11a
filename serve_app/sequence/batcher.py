"""Batch formation for one instance of a sequence model, as a pure function of its slots and the time.

Each slot holds at most one sequence (its owner: correlation ID and the
slot_token the router gave it) and that sequence's queued requests, in order.

- **direct**: an execution covers slots ``0 .. highest occupied``; each slot
  with a queued request contributes its oldest one, the others are empty rows
  (the driver fills them with zeros and READY=false).  With
  ``max_queue_delay_microseconds`` and ``minimum_slot_utilization`` the batcher
  waits, up to the delay, until that share of the slots has a request.
- **oldest**: the head requests of the candidate sequences are batched oldest
  first, like the dynamic batcher (``preferred_batch_size``,
  ``max_queue_delay_microseconds``, ``max_batch_size``), never two requests of
  one sequence in one execution.

Rows whose input shapes differ from the first row's wait for a later
execution.  A sequence leaves its slot when its END request has executed, or
when it has been idle (nothing queued or executing) for
``max_sequence_idle_microseconds``; the freed slots are reported so that the
router can give them to backlogged sequences.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from serve_app.inference.options import CorrId
from serve_app.protos import model_config_pb2 as mc
from serve_app.sequence.messages import SlotEvent

T = TypeVar("T")

DEFAULT_IDLE_US = 1_000_000


class StaleStep(Exception):
    """The step names a sequence this instance does not hold in that slot."""


@dataclass(frozen=True, slots=True)
class SequenceBatchingConfig:
    direct: bool = True
    slots: int = 1
    max_batch_size: int = 1  # rows per execution (>= 1)
    preferred: tuple[int, ...] = ()
    max_queue_delay_ns: int = 0
    min_slot_utilization: float = 0.0
    idle_ns: int = DEFAULT_IDLE_US * 1000

    @classmethod
    def from_model_config(cls, config: mc.ModelConfig) -> SequenceBatchingConfig:
        sb = config.sequence_batching
        rows = max(1, config.max_batch_size)
        idle_ns = (sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US) * 1000
        if sb.HasField("oldest"):
            old = sb.oldest
            return cls(
                direct=False,
                # Triton: max_candidate_sequences places, or as many as the batch has rows when it is unset.
                slots=old.max_candidate_sequences if old.max_candidate_sequences > 0 else rows,
                max_batch_size=rows,
                preferred=tuple(sorted(set(old.preferred_batch_size))) if config.max_batch_size > 0 else (),
                max_queue_delay_ns=old.max_queue_delay_microseconds * 1000,
                idle_ns=idle_ns,
            )
        return cls(
            direct=True,
            slots=rows,
            max_batch_size=rows,
            max_queue_delay_ns=sb.direct.max_queue_delay_microseconds * 1000,
            min_slot_utilization=sb.direct.minimum_slot_utilization,
            idle_ns=idle_ns,
        )


@dataclass(slots=True, eq=False)
class Pending(Generic[T]):
    item: T
    start: bool
    end: bool
    enqueue_ns: int
    shape_key: object = None


@dataclass(slots=True)
class _Slot(Generic[T]):
    corr_id: CorrId
    slot_token: int
    last_ns: int
    queue: deque[Pending[T]] = field(default_factory=deque)
    inflight: int = 0
    ending: bool = False  # the last request queued carries END


@dataclass(slots=True)
class Row(Generic[T]):
    slot: int
    corr_id: CorrId | None  # None: an unoccupied slot inside a direct batch
    pending: Pending[T] | None  # None: no request from this slot in this execution (READY false)
    owner: object = None  # the slot's occupant when the row was formed


@dataclass(slots=True)
class BatchDecision(Generic[T]):
    rows: list[Row[T]] = field(default_factory=list)
    wait_ns: int = 0  # nothing to run yet: ask again after this long


class SequenceBatcher(Generic[T]):
    def __init__(self, config: SequenceBatchingConfig) -> None:
        self.config = config
        self._slots: list[_Slot[T] | None] = [None] * config.slots
        # The slot token each slot last released: a late START of that owner (sent before the router
        # learnt of the release) must not take the slot back, or the router would give it out twice.
        self._released: list[int] = [0] * config.slots
        self._max_preferred = max(config.preferred, default=config.max_batch_size)

    # -- admission -----------------------------------------------------------------
    def enqueue(
        self,
        slot: int,
        corr_id: CorrId,
        slot_token: int,
        item: T,
        *,
        start: bool,
        end: bool,
        now_ns: int,
        shape_key: object = None,
    ) -> list[Pending[T]]:
        """Queue a step in its slot.  A START with a new slot token restarts the slot's sequence when the
        ID is the same (its queued requests still run first); with another ID it takes the slot over and
        returns the requests of the previous owner, which will never run.  Raises :class:`StaleStep` for a step of a
        sequence this slot does not hold."""
        if not 0 <= slot < len(self._slots):
            raise StaleStep(f"slot {slot} does not exist")
        current = self._slots[slot]
        owned = current is not None and current.slot_token == slot_token and current.corr_id == corr_id
        displaced: list[Pending[T]] = []
        if not start and (current is None or not owned or current.ending):
            raise StaleStep(f"slot {slot} does not hold sequence {corr_id}")
        if start and not owned and slot_token == self._released[slot]:
            raise StaleStep(f"slot {slot} already released slot_token {slot_token}")
        if current is not None and not owned and current.corr_id == corr_id:
            current.slot_token = slot_token  # a restart: earlier requests still run first, then it starts anew
        elif current is None or not owned:
            if current is not None:
                displaced = list(current.queue)
            current = _Slot(corr_id, slot_token, now_ns)
            self._slots[slot] = current
        current.queue.append(Pending(item, start, end, now_ns, shape_key))
        current.last_ns = now_ns
        current.ending = end
        return displaced

    # -- batch formation ---------------------------------------------------------------
    def _head(self, i: int) -> Pending[T]:
        """The first request queued in slot ``i``, which the caller knows is occupied and has one."""
        s = self._slots[i]
        assert s is not None
        return s.queue[0]

    def next_batch(self, now_ns: int) -> BatchDecision[T]:
        """The rows of the next execution on this (free) instance, per the rules above."""
        return self._direct(now_ns) if self.config.direct else self._oldest(now_ns)

    def _direct(self, now_ns: int) -> BatchDecision[T]:
        cfg = self.config
        ready = [i for i, s in enumerate(self._slots) if s is not None and s.queue]
        if not ready:
            return BatchDecision()
        if cfg.max_queue_delay_ns > 0 and len(ready) < cfg.min_slot_utilization * cfg.slots:
            oldest = min(self._head(i).enqueue_ns for i in ready)
            waited = now_ns - oldest
            if waited < cfg.max_queue_delay_ns:
                return BatchDecision(wait_ns=cfg.max_queue_delay_ns - waited)
        highest = max(i for i, s in enumerate(self._slots) if s is not None)
        key = self._head(ready[0]).shape_key
        rows: list[Row[T]] = []
        for i in range(highest + 1):
            s = self._slots[i]
            if s is None:
                rows.append(Row(i, None, None))
            elif s.queue and s.queue[0].shape_key == key:
                s.inflight += 1
                rows.append(Row(i, s.corr_id, s.queue.popleft(), s))
            else:
                rows.append(Row(i, s.corr_id, None, s))
        return BatchDecision(rows)

    def _oldest(self, now_ns: int) -> BatchDecision[T]:
        cfg = self.config
        heads = sorted(
            ((s.queue[0].enqueue_ns, i) for i, s in enumerate(self._slots) if s is not None and s.queue),
        )
        if not heads:
            return BatchDecision()
        chosen: list[int] = []
        best = 0
        key = self._head(heads[0][1]).shape_key
        full = False
        for _, i in heads:
            if len(chosen) >= cfg.max_batch_size:
                full = True
                break
            if self._head(i).shape_key != key:
                full = True
                break
            chosen.append(i)
            if len(chosen) in cfg.preferred:
                best = len(chosen)
        oldest = heads[0][0]
        delay_exceeded = cfg.max_queue_delay_ns > 0 and now_ns - oldest >= cfg.max_queue_delay_ns
        if best and not delay_exceeded:
            chosen = chosen[:best]
        elif not (full or len(chosen) >= self._max_preferred or delay_exceeded or cfg.max_queue_delay_ns == 0):
            return BatchDecision(wait_ns=cfg.max_queue_delay_ns - (now_ns - oldest))
        rows = []
        for i in sorted(chosen, key=lambda j: self._head(j).enqueue_ns):
            s = self._slots[i]
            assert s is not None
            s.inflight += 1
            rows.append(Row(i, s.corr_id, s.queue.popleft(), s))
        return BatchDecision(rows)

    # -- completion and expiry --------------------------------------------------------------
    def finish(self, rows: list[Row[T]]) -> list[SlotEvent]:
        """After an execution: sequences whose END ran leave their slots (returned)."""
        released = []
        for row in rows:
            if row.pending is None:
                continue
            s = self._slots[row.slot]
            if s is None or s is not row.owner:
                continue
            s.inflight -= 1
            if row.pending.end and s.ending and not s.queue and s.inflight == 0:
                self._slots[row.slot] = None
                self._released[row.slot] = s.slot_token
                released.append(SlotEvent(row.slot, s.corr_id, s.slot_token))
        return released

    def expire_idle(self, now_ns: int) -> list[SlotEvent]:
        """Free the slots of sequences idle for ``max_sequence_idle_microseconds``."""
        released = []
        for i, s in enumerate(self._slots):
            if s is not None and not s.queue and s.inflight == 0 and now_ns - s.last_ns >= self.config.idle_ns:
                self._slots[i] = None
                self._released[i] = s.slot_token
                released.append(SlotEvent(i, s.corr_id, s.slot_token))
        return released

    def idle_wait_ns(self, now_ns: int) -> int:
        """How long until the next idle sequence expires (0: none is idle)."""
        deadlines = [
            s.last_ns + self.config.idle_ns for s in self._slots if s is not None and not s.queue and s.inflight == 0
        ]
        return max(min(deadlines) - now_ns, 1_000) if deadlines else 0

    def adopt(self, slot: int, corr_id: CorrId, slot_token: int, now_ns: int) -> bool:
        """Take over a sequence restored from another instance into a free slot (False if not free)."""
        if not 0 <= slot < len(self._slots) or self._slots[slot] is not None:
            return False
        self._slots[slot] = _Slot(corr_id, slot_token, now_ns)
        return True

    def occupied(self) -> list[SlotEvent]:
        return [SlotEvent(i, s.corr_id, s.slot_token) for i, s in enumerate(self._slots) if s is not None]

    def owner(self, slot: int) -> tuple[CorrId, int] | None:
        s = self._slots[slot] if 0 <= slot < len(self._slots) else None
        return None if s is None else (s.corr_id, s.slot_token)

    @property
    def queued(self) -> int:
        return sum(len(s.queue) for s in self._slots if s is not None)
