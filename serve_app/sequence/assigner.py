"""Which instance and slot holds each sequence of one model version: pure bookkeeping.

This is the table behind the sequence router (Triton's SequenceBatchScheduler
maps, lifted out of the instances so that it spans replicas and nodes):

- a START for a new correlation ID takes a free slot on the instance with the
  most free slots (lowest slot first), or joins the ordered backlog when every
  slot is taken;
- a START for an active ID keeps its slot under a new slot token (the instance
  restarts the sequence after its queued requests);
- when an instance releases a slot (END executed, or idle timeout) the oldest
  backlogged sequence gets it;
- a backlogged sequence whose requests carry a ``timeout`` leaves the backlog
  when the earliest of their deadlines passes (:meth:`expire_backlog`: Triton's
  reaper rejects its requests, and the ID is forgotten);
- when an instance is lost, its sequences whose state is backed up (see
  ``config/state_backup.py``) are placed in free slots of other
  instances (ahead of the backlog; they wait for a slot up to the caller's
  restore wait), and the caller restores them there (:meth:`take_restores`,
  :meth:`restored`); lookups wait meanwhile.  The others are remembered as
  lost, so their next requests get a clear error instead of a silent restart
  on another instance.

Slots are numbered per instance: ``0 .. slots-1`` (batch slots for the direct
strategy, candidate places for the oldest strategy).
"""

from __future__ import annotations

import heapq
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np

from serve_app.errors import InvalidArgument, Unavailable
from serve_app.inference.options import CorrId
from serve_app.sequence.backups import SequenceBackups
from serve_app.sequence.messages import Assignment, SlotEvent, StateBackup

LOST_MEMORY = 100_000  # lost sequence IDs remembered (oldest forgotten first)


@dataclass(slots=True)
class _Instance:
    id: str
    address: tuple[str, int]
    free: list[int]  # heap of free slots
    owners: dict[int, CorrId] = field(default_factory=dict)
    unseen: dict[int, int] = field(default_factory=dict)  # slot -> since when its instance has not held it
    draining: bool = False  # stopping: keeps its sequences, takes no new one


@dataclass(frozen=True, slots=True)
class Restore:
    """A sequence of a lost instance placed in a free slot: its state is to be sent there."""

    corr_id: CorrId
    assignment: Assignment
    states: dict[str, np.ndarray]
    no: int = 0


class SequenceAssigner:
    def __init__(self, model_name: str, slots_per_instance: int, grace_ns: int = 10_000_000_000) -> None:
        """``grace_ns``: how long a slot given here may stay unknown to its instance (see :meth:`reconcile`)."""
        self.model_name = model_name
        self.slots = max(1, slots_per_instance)
        self.grace_ns = grace_ns
        self._instances: dict[str, _Instance] = {}
        self.active: dict[CorrId, Assignment] = {}
        self._backlog: OrderedDict[CorrId, None] = OrderedDict()
        self._deadlines: dict[CorrId, int] = {}  # backlogged sequence -> when its wait times out
        self._lost: OrderedDict[CorrId, str] = OrderedDict()
        self.backups = SequenceBackups()
        self._to_place: OrderedDict[CorrId, tuple[str, int]] = OrderedDict()  # lost with a backup: (reason, since)
        self._restoring: dict[CorrId, Assignment] = {}  # placed, state on its way to the instance
        self._placed: list[Restore] = []
        self._lost_from: dict[CorrId, str] = {}  # waiting for a slot or restoring: the instance it was lost with

    # -- instances ---------------------------------------------------------------
    def instances(self) -> list[str]:
        return list(self._instances)

    def has_instance(self, instance: str) -> bool:
        return instance in self._instances

    def add_instance(
        self, instance: str, address: tuple[str, int], occupied: tuple[SlotEvent, ...] = ()
    ) -> list[tuple[CorrId, Assignment]]:
        """A new (or rediscovered) instance; ``occupied`` are the sequences it already holds (after a
        router restart).  Returns backlogged sequences admitted to its free slots."""
        taken = {e.slot for e in occupied if 0 <= e.slot < self.slots}
        inst = _Instance(instance, address, [s for s in range(self.slots) if s not in taken])
        heapq.heapify(inst.free)
        self._instances[instance] = inst
        for e in occupied:
            if e.slot not in taken:
                continue
            inst.owners[e.slot] = e.corr_id  # held until the instance releases it, even if the ID lives elsewhere
            if e.corr_id not in self.active:
                self.active[e.corr_id] = Assignment(instance, address, e.slot, e.slot_token)
        return self._admit()

    def remove_instance(self, instance: str, reason: str, now_ns: int = 0, restore: bool = True) -> list[CorrId]:
        """Forget a failed instance.  Its sequences with a backup wait to be restored elsewhere (see
        :meth:`take_restores`; not with ``restore`` False: the model is going away); the others become lost.
        Returns the lost IDs."""
        inst = self._instances.pop(instance, None)
        if inst is None:
            return []
        lost = []
        for corr in inst.owners.values():
            current = self.active.get(corr)
            if current is not None and current.instance == instance:
                del self.active[corr]
            elif (restoring := self._restoring.get(corr)) is not None and restoring.instance == instance:
                del self._restoring[corr]  # it died before its restore arrived: place it again
            else:
                continue  # a slot it still held for a sequence that lives elsewhere now
            if restore and corr in self.backups:
                self._to_place[corr] = (reason, now_ns)
                self._lost_from[corr] = instance
            else:
                self._remember_lost(corr, reason)
                lost.append(corr)
        self._place_restores()
        return lost

    def set_draining(self, instance: str, draining: bool) -> None:
        """A stopping instance (scaled down) serves its live sequences to their end but gets no new one."""
        inst = self._instances.get(instance)
        if inst is not None:
            inst.draining = draining

    # -- sequences ----------------------------------------------------------------
    def start(self, corr_id: CorrId, deadline_ns: int = 0) -> Assignment | None:
        """The slot for a START; None while the sequence waits in the backlog (or for its restore).
        ``deadline_ns``: when the request's timeout ends its wait in the backlog (0: never)."""
        self._lost.pop(corr_id, None)
        if corr_id in self._restoring:
            return None  # the START runs in the restored slot (it resets the state anyway)
        if self._to_place.pop(corr_id, None) is not None:
            self.backups.drop(corr_id)  # starting anew: the old state is not needed
            self._lost_from.pop(corr_id, None)
        current = self.active.get(corr_id)
        if current is not None:
            # A restart keeps the slot under a new slot token, so a release of the old one that is still
            # on its way (END already ran) can't free the slot under the restarted sequence.
            restarted = replace(current, slot_token=secrets.randbits(62))
            self.active[corr_id] = restarted
            return restarted
        if corr_id in self._backlog:
            self._shorten(corr_id, deadline_ns)
            return None
        inst = self._most_free()
        if inst is None or self._backlog:
            self._backlog[corr_id] = None
            self._shorten(corr_id, deadline_ns)
            return None
        return self._place(corr_id, inst)

    def lookup(self, corr_id: CorrId, deadline_ns: int = 0) -> Assignment | None:
        """Where a continuing sequence is; None while backlogged (its wait then ends by ``deadline_ns`` at
        the latest, as for :meth:`start`).  Raises the error its request gets when it is not active (never
        started, ended, timed out, or lost with its instance)."""
        current = self.active.get(corr_id)
        if current is not None:
            return current
        if corr_id in self._backlog:
            self._shorten(corr_id, deadline_ns)
            return None
        if corr_id in self._restoring or corr_id in self._to_place:
            return None
        reason = self._lost.get(corr_id)
        if reason is not None:
            raise Unavailable(
                f"sequence {corr_id} of model '{self.model_name}' was lost: {reason}; send its next "
                "request with the START flag to start it again"
            )
        raise InvalidArgument(
            f"inference request for sequence {corr_id} to model '{self.model_name}' must specify the "
            "START flag on the first request of the sequence"
        )

    def release(self, instance: str, slot: int, corr_id: CorrId, slot_token: int) -> list[tuple[CorrId, Assignment]]:
        """An instance freed ``slot`` (its sequence ended or timed out).  Returns admitted backlog entries."""
        inst = self._instances.get(instance)
        if inst is None or inst.owners.get(slot) != corr_id:
            return []
        current = self.active.get(corr_id)
        if current is not None and current.instance == instance and current.slot == slot:
            if current.slot_token != slot_token:
                return []  # released by an older owner of the same ID: the current one keeps it
            del self.active[corr_id]
            self.backups.drop(corr_id)
        del inst.owners[slot]
        inst.unseen.pop(slot, None)
        heapq.heappush(inst.free, slot)
        return self._admit()

    def cancel(self, corr_id: CorrId) -> None:
        """Drop a backlogged sequence (its requests gave up)."""
        self._backlog.pop(corr_id, None)
        self._deadlines.pop(corr_id, None)

    def shorten(self, corr_id: CorrId, deadline_ns: int) -> None:
        """A request of a backlogged sequence (not seen here) ends its wait by ``deadline_ns`` at the latest."""
        if corr_id in self._backlog:
            self._shorten(corr_id, deadline_ns)

    def expire_backlog(self, now_ns: int) -> list[CorrId]:
        """Backlogged sequences whose deadline has passed: they leave the backlog (and are forgotten)."""
        expired = [corr for corr, deadline in self._deadlines.items() if deadline <= now_ns]
        for corr in expired:
            self.cancel(corr)
        return expired

    def next_deadline(self) -> int:
        """The earliest backlog deadline (0: none)."""
        return min(self._deadlines.values(), default=0)

    def reconcile(self, instance: str, occupied: tuple[SlotEvent, ...], now_ns: int) -> list[tuple[CorrId, Assignment]]:
        """Free slots given out here that the instance has not held for ``grace_ns`` (their START never
        reached it: the client or its gateway went away).  Returns admitted backlog entries."""
        inst = self._instances.get(instance)
        if inst is None:
            return []
        held = {e.slot for e in occupied}
        admitted: list[tuple[CorrId, Assignment]] = []
        for slot, corr in list(inst.owners.items()):
            if slot in held:
                inst.unseen.pop(slot, None)
                continue
            since = inst.unseen.setdefault(slot, now_ns)
            if now_ns - since >= self.grace_ns:
                del inst.unseen[slot]
                current = self.active.get(corr)
                slot_token = current.slot_token if current is not None and current.instance == instance else 0
                admitted += self.release(instance, slot, corr, slot_token)
        return admitted

    # -- state backups and restores ---------------------------------------------------------
    def backed_up(self, instance: str, backups: tuple[StateBackup, ...]) -> None:
        """Keep the states sent (by ``instance``, or by gateways naming theirs), each if that instance still
        holds the sequence in that slot and slot token."""
        for b in backups:
            current = self.active.get(b.corr_id)
            owner = b.instance or instance
            if current is not None and current.instance == owner:
                if current.slot == b.slot and current.slot_token == b.slot_token:
                    self.backups.store(b)
            elif self._lost_from.get(b.corr_id) == owner:
                # A step answered just before its instance died, passed on after the router saw it die: still
                # the sequence's latest state (restores read the record when they are sent).
                record = self.backups.get(b.corr_id)
                if record is not None and record.slot_token == b.slot_token:
                    self.backups.store(b)

    def take_restores(self) -> list[Restore]:
        """Sequences placed for a restore since the last call: send each its state."""
        placed, self._placed = self._placed, []
        return placed

    def restored(
        self, corr_id: CorrId, assignment: Assignment, ok: bool, reason: str
    ) -> tuple[list[tuple[CorrId, Assignment]], bool]:
        """The outcome of a restore.  Returns the sequences admitted (the restored one first) and whether
        this one is now lost."""
        if self._restoring.get(corr_id) != assignment:
            return [], False  # superseded (restarted, or its target was lost meanwhile)
        del self._restoring[corr_id]
        self._lost_from.pop(corr_id, None)
        inst = self._instances.get(assignment.instance)
        held = inst is not None and inst.owners.get(assignment.slot) == corr_id
        if ok and held:
            self.active[corr_id] = assignment
            self.backups.moved(corr_id, assignment.slot_token)
            return [(corr_id, assignment)], False
        self.backups.drop(corr_id)
        self._remember_lost(corr_id, reason)
        if held and inst is not None:
            del inst.owners[assignment.slot]
            heapq.heappush(inst.free, assignment.slot)
        return self._admit(), True

    def expire_restores(self, now_ns: int, wait_ns: int) -> list[CorrId]:
        """Sequences that found no free slot within ``wait_ns`` of their instance's loss: now lost."""
        expired = [corr for corr, (_, since) in self._to_place.items() if now_ns - since >= wait_ns]
        for corr in expired:
            reason, _ = self._to_place.pop(corr)
            self.backups.drop(corr)
            self._lost_from.pop(corr, None)
            self._remember_lost(corr, f"{reason}, and no instance had a free slot to restore it")
        return expired

    def restoring(self) -> int:
        return len(self._to_place) + len(self._restoring)

    @property
    def backlog(self) -> list[CorrId]:
        return list(self._backlog)

    def free_slots(self) -> int:
        return sum(len(i.free) for i in self._instances.values())

    # -- internals -------------------------------------------------------------------
    def _most_free(self) -> _Instance | None:
        best: _Instance | None = None
        for inst in self._instances.values():
            if inst.free and not inst.draining and (best is None or len(inst.free) > len(best.free)):
                best = inst
        return best

    def _place(self, corr_id: CorrId, inst: _Instance) -> Assignment:
        slot = heapq.heappop(inst.free)
        inst.owners[slot] = corr_id
        assignment = Assignment(inst.id, inst.address, slot, secrets.randbits(62))
        self.active[corr_id] = assignment
        return assignment

    def _place_restores(self) -> None:
        while self._to_place:
            inst = self._most_free()
            if inst is None:
                return
            corr, _ = self._to_place.popitem(last=False)
            record = self.backups.get(corr)
            if record is None:
                continue
            slot = heapq.heappop(inst.free)
            inst.owners[slot] = corr
            assignment = Assignment(inst.id, inst.address, slot, secrets.randbits(62))
            self._restoring[corr] = assignment
            self._placed.append(Restore(corr, assignment, record.states, record.no))

    def _admit(self) -> list[tuple[CorrId, Assignment]]:
        """Give free slots to sequences waiting for a restore, then to the backlog in order."""
        self._place_restores()
        admitted = []
        while self._backlog:
            inst = self._most_free()
            if inst is None:
                break
            corr, _ = self._backlog.popitem(last=False)
            self._deadlines.pop(corr, None)
            admitted.append((corr, self._place(corr, inst)))
        return admitted

    def _shorten(self, corr_id: CorrId, deadline_ns: int) -> None:
        """A backlogged sequence waits until the earliest deadline of its requests (Triton's backlog timeout)."""
        if deadline_ns:
            current = self._deadlines.get(corr_id)
            self._deadlines[corr_id] = deadline_ns if current is None else min(current, deadline_ns)

    def _remember_lost(self, corr_id: CorrId, reason: str) -> None:
        self._lost[corr_id] = reason
        self._lost.move_to_end(corr_id)
        while len(self._lost) > LOST_MEMORY:
            self._lost.popitem(last=False)
