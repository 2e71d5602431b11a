"""Triton's rate limiter (``--rate-limit execution_count``), as pure bookkeeping.

A model's instances execute only while they hold the resources their
``instance_group { rate_limiter { resources [...] } }`` name.  A scheduler
with a batch to send asks for them (:meth:`RateLimiter.request`); requests
wait in one line ordered as Triton orders its staged instances, by
``executions so far x priority`` (priority 0 counts as 1, so a priority-2
instance gets half the turns of a priority-1 one), then by priority, then by
arrival; only the head of the line is tried, so a request for many units is
not starved by smaller ones.  Its ``grant`` callback runs once the resources
are allocated, and the execution gives them back (:meth:`release`).

How many units of each resource there are: ``--rate-limit-resource
name:count`` where given, otherwise the largest count any registered model
needs (Triton's default: each instance can always run alone).  Resources are
counted per process that schedules (a gateway: per node with one gateway per
node, as Triton's are per server); device-specific resources count as the
process's, since a gateway's instances are not per device.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from serve_app.errors import InvalidArgument
from serve_app.protos import model_config_pb2 as mc


@dataclass(frozen=True, slots=True)
class Needs:
    """What one execution of a model version holds while it runs, and its priority."""

    resources: Mapping[str, int]
    priority: int = 1

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> Needs | None:
        """The largest count of each resource its instance groups name, and their best priority (None: the
        model names none and is not limited)."""
        resources: dict[str, int] = {}
        priorities = []
        for group in config.instance_group:
            if not group.HasField("rate_limiter"):
                continue
            priorities.append(max(1, group.rate_limiter.priority))
            for r in group.rate_limiter.resources:
                resources[r.name] = max(resources.get(r.name, 0), r.count)
        if not priorities:
            return None
        return cls(resources, min(priorities))


def check_resources(model: str, needs: Needs | None, explicit: Mapping[str, int]) -> None:
    """Triton's load error when an explicit count is below what one execution of ``model`` needs."""
    if needs is None or not explicit:
        return
    for name, count in sorted(needs.resources.items()):
        available = explicit.get(name, 0)
        if available < count:
            raise InvalidArgument(
                f"model '{model}': Resource count for \"{name}\" is limited to {available} which will prevent "
                f"scheduling of one or more model instances, the minimum required count is {count}"
            )


@dataclass(slots=True)
class _Waiting:
    owner: object
    needs: Needs
    grant: Callable[[], None]
    order: tuple[int, int, int] = (0, 0, 0)


@dataclass
class RateLimiter:
    explicit: Mapping[str, int] = field(default_factory=dict)  # --rate-limit-resource counts
    # registered owners (model schedulers; one that is dropped, its model unloaded, leaves by itself)
    _needed: weakref.WeakKeyDictionary[object, Needs] = field(default_factory=weakref.WeakKeyDictionary)
    _executions: weakref.WeakKeyDictionary[object, int] = field(default_factory=weakref.WeakKeyDictionary)
    _allocated: dict[str, int] = field(default_factory=dict)
    _line: list[_Waiting] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _counts: dict[str, int] = field(default_factory=dict)  # default counts, for _counted_for owners
    _counted_for: int = -1

    def register(self, owner: object, needs: Needs) -> None:
        self._needed[owner] = needs
        self._executions.setdefault(owner, 0)
        self._counted_for = -1

    def unregister(self, owner: object) -> None:
        self._needed.pop(owner, None)
        self._counted_for = -1
        self._executions.pop(owner, None)
        self._line = [w for w in self._line if w.owner is not owner]

    def available(self, resource: str) -> int:
        """Units of ``resource`` there are: the explicit count, or the largest any registered owner needs
        (computed again only when the registered owners change)."""
        if resource in self.explicit:
            return self.explicit[resource]
        if self._counted_for != len(self._needed):
            self._counts = {}
            for needs in self._needed.values():
                for name, count in needs.resources.items():
                    self._counts[name] = max(self._counts.get(name, 0), count)
            self._counted_for = len(self._needed)
        return self._counts.get(resource, 0)

    def in_use(self, resource: str) -> int:
        return self._allocated.get(resource, 0)

    def request(self, owner: object, grant: Callable[[], None]) -> None:
        """Call ``grant`` once ``owner`` (registered) holds its resources: now, or when its turn comes."""
        self._enqueue(owner, grant)
        self._allocate()

    def _enqueue(self, owner: object, grant: Callable[[], None]) -> None:
        needs = self._needed[owner]
        priority = max(1, needs.priority)
        order = (self._executions[owner] * priority, priority, next(self._seq))
        self._line.append(_Waiting(owner, needs, grant, order))
        self._line.sort(key=lambda w: w.order)

    def withdraw(self, owner: object) -> int:
        """Drop ``owner``'s waiting requests (its queue emptied); how many there were."""
        before = len(self._line)
        self._line = [w for w in self._line if w.owner is not owner]
        return before - len(self._line)

    def release(self, owner: object, again: Callable[[], None] | None = None) -> None:
        """An execution of ``owner`` ended: its resources are free again.  ``again``: ``owner`` has more to
        run, and takes its place in line before the resources go to anyone (as Triton stages a released
        instance that has requests before allocating)."""
        needs = self._needed.get(owner)
        if needs is not None:
            for name, count in needs.resources.items():
                self._allocated[name] = max(0, self._allocated.get(name, 0) - count)
            if again is not None:
                self._enqueue(owner, again)
        self._allocate()

    def waiting(self) -> int:
        return len(self._line)

    def _allocate(self) -> None:
        while self._line:
            head = self._line[0]
            if any(self.in_use(n) + c > self.available(n) for n, c in head.needs.resources.items()):
                return  # the head waits for its resources; nobody overtakes it
            self._line.pop(0)
            for name, count in head.needs.resources.items():
                self._allocated[name] = self._allocated.get(name, 0) + count
            if head.owner in self._executions:
                self._executions[head.owner] += 1
            head.grant()
