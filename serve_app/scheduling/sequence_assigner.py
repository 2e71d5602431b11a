"""Which instance and slot holds each sequence of one model version: pure bookkeeping.

This is the table behind the sequence router (Triton's SequenceBatchScheduler
maps, lifted out of the instances so that it spans replicas and nodes):

- a START for a new correlation ID takes a free slot on the instance with the
  most free slots (lowest slot first), or joins the ordered backlog when every
  slot is taken;
- a START for an active ID keeps its slot under a new generation (the instance
  restarts the sequence after its queued requests);
- when an instance releases a slot (END executed, or idle timeout) the oldest
  backlogged sequence gets it;
- when an instance is lost, its sequences are remembered as lost, so their next
  requests get a clear error instead of a silent restart on another instance.

Slots are numbered per instance: ``0 .. slots-1`` (batch slots for the direct
strategy, candidate places for the oldest strategy).
"""

from __future__ import annotations

import heapq
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from serve_app.errors import InvalidArgument, Unavailable
from serve_app.inference.sequence import Assignment, CorrId, SlotEvent, describe

LOST_MEMORY = 100_000  # lost sequence IDs remembered (oldest forgotten first)


@dataclass(slots=True)
class _Instance:
    id: str
    address: tuple[str, int]
    free: list[int]  # heap of free slots
    owners: dict[int, CorrId] = field(default_factory=dict)
    unseen: dict[int, int] = field(default_factory=dict)  # slot -> since when its instance has not held it
    draining: bool = False  # stopping: keeps its sequences, takes no new one


class SequenceAssigner:
    def __init__(self, model_name: str, slots_per_instance: int, grace_ns: int = 10_000_000_000) -> None:
        """``grace_ns``: how long a slot given here may stay unknown to its instance (see :meth:`reconcile`)."""
        self.model_name = model_name
        self.slots = max(1, slots_per_instance)
        self.grace_ns = grace_ns
        self._instances: dict[str, _Instance] = {}
        self.active: dict[CorrId, Assignment] = {}
        self._backlog: OrderedDict[CorrId, None] = OrderedDict()
        self._lost: OrderedDict[CorrId, str] = OrderedDict()

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
                self.active[e.corr_id] = Assignment(instance, address, e.slot, e.generation)
        return self._admit()

    def remove_instance(self, instance: str, reason: str) -> list[CorrId]:
        """Forget a failed instance; its sequences become lost.  Returns their IDs."""
        inst = self._instances.pop(instance, None)
        if inst is None:
            return []
        lost = list(inst.owners.values())
        for corr in lost:
            self.active.pop(corr, None)
            self._remember_lost(corr, reason)
        return lost

    def set_draining(self, instance: str, draining: bool) -> None:
        """A stopping instance (scaled down) serves its live sequences to their end but gets no new one."""
        inst = self._instances.get(instance)
        if inst is not None:
            inst.draining = draining

    # -- sequences ----------------------------------------------------------------
    def start(self, corr_id: CorrId) -> Assignment | None:
        """The slot for a START; None while the sequence waits in the backlog."""
        self._lost.pop(corr_id, None)
        current = self.active.get(corr_id)
        if current is not None:
            # A restart keeps the slot under a new generation, so a release of the old one that is still
            # on its way (END already ran) can't free the slot under the restarted sequence.
            restarted = replace(current, generation=secrets.randbits(62))
            self.active[corr_id] = restarted
            return restarted
        if corr_id in self._backlog:
            return None
        inst = self._most_free()
        if inst is None or self._backlog:
            self._backlog[corr_id] = None
            return None
        return self._place(corr_id, inst)

    def lookup(self, corr_id: CorrId) -> Assignment | None:
        """Where a continuing sequence is; None while backlogged.  Raises the error its request gets
        when it is not active (never started, ended, timed out, or lost with its instance)."""
        current = self.active.get(corr_id)
        if current is not None:
            return current
        if corr_id in self._backlog:
            return None
        reason = self._lost.get(corr_id)
        if reason is not None:
            raise Unavailable(
                f"sequence {describe(corr_id)} of model '{self.model_name}' was lost: {reason}; send its next "
                "request with the START flag to start it again"
            )
        raise InvalidArgument(
            f"inference request for sequence {describe(corr_id)} to model '{self.model_name}' must specify the "
            "START flag on the first request of the sequence"
        )

    def release(self, instance: str, slot: int, corr_id: CorrId, generation: int) -> list[tuple[CorrId, Assignment]]:
        """An instance freed ``slot`` (its sequence ended or timed out).  Returns admitted backlog entries."""
        inst = self._instances.get(instance)
        if inst is None or inst.owners.get(slot) != corr_id:
            return []
        current = self.active.get(corr_id)
        if current is not None and current.instance == instance and current.slot == slot:
            if current.generation != generation:
                return []  # released by an older owner of the same ID: the current one keeps it
            del self.active[corr_id]
        del inst.owners[slot]
        inst.unseen.pop(slot, None)
        heapq.heappush(inst.free, slot)
        return self._admit()

    def cancel(self, corr_id: CorrId) -> None:
        """Drop a backlogged sequence (its requests gave up)."""
        self._backlog.pop(corr_id, None)

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
                generation = current.generation if current is not None and current.instance == instance else 0
                admitted += self.release(instance, slot, corr, generation)
        return admitted

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

    def _admit(self) -> list[tuple[CorrId, Assignment]]:
        admitted = []
        while self._backlog:
            inst = self._most_free()
            if inst is None:
                break
            corr, _ = self._backlog.popitem(last=False)
            admitted.append((corr, self._place(corr, inst)))
        return admitted

    def _remember_lost(self, corr_id: CorrId, reason: str) -> None:
        self._lost[corr_id] = reason
        self._lost.move_to_end(corr_id)
        while len(self._lost) > LOST_MEMORY:
            self._lost.popitem(last=False)
