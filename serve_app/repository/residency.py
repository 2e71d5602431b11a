"""Which models loaded on demand stay, which go: the load-on-demand budget as pure decisions.

The model manager asks :meth:`Residency.admit` before it loads models that
requests wait for; the answer says which models to load now, which to unload
first to make room, and when to ask again for those that must wait.  Time
comes from an injectable clock, and what the gateways know of each model's use
(its last request, requests in flight or queued, live sequences) is passed in,
so every rule is tested without Ray and without sleeping.

Rules:

* every model a node holds counts against its budget, but only models loaded
  on demand can be evicted; a model the operator loaded (the repository API,
  ``--load-model``) is pinned, also when it was loaded on demand first;
* a model is evicted only while idle: no request in flight or queued, no live
  sequence, not a step of a loaded ensemble that is itself busy or pinned, and
  loaded at least ``min_resident_s`` ago (so a working set larger than the
  budget waits for room instead of thrashing);
* among those, the least recently used goes first (its last request, or its
  load when it had none); an ensemble step takes the loaded ensembles that use
  it along (they can't serve without it), and they free their slots too;
* loads are admitted in the order they were asked for, at most
  ``max_loads`` at once; a load that finds no room waits (its wait is
  bounded by the caller), and the ones behind it wait too.

Across a cluster the budget holds per node: a model loaded on demand goes to
one node, the one with the most room left; where no node has room, to the
node whose least recently used evictable model was used longest ago (that
model makes room).  A model that runs on every node (the operator's, or one
in processes of its own that Serve places) counts on every node, and
evicting it frees a slot on each.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_NODE = ""  # the one node of a residency that is given no nodes
RETRY_S = 0.5  # how soon to ask again when room depends on requests finishing (nobody says when)


@dataclass(frozen=True, slots=True)
class Usage:
    """What the gateways know of a loaded model's use (summed over all of them)."""

    last_used: float | None = None  # on the residency's clock; None: no request since its load
    busy: bool = False  # requests in flight or queued
    sequences: int = 0  # live sequences


@dataclass(slots=True)
class _Resident:
    nodes: frozenset[str] | None  # None: on every node
    loaded_at: float
    last_used: float
    pinned: bool

    def on(self, node: str) -> bool:
        return self.nodes is None or node in self.nodes


@dataclass(frozen=True, slots=True)
class Admission:
    """``evict`` first (LRU first, each with the ensembles that go with it), then ``load``; ask again at
    ``retry_at`` (the clock's time) for the models still waiting, None when none is.  ``nodes``: the node
    each loaded model goes to, when the residency was given nodes to choose from."""

    load: list[str] = field(default_factory=list)
    evict: list[str] = field(default_factory=list)
    retry_at: float | None = None
    nodes: dict[str, str] = field(default_factory=dict)


class Residency:
    """What is loaded where, since when, and whether the operator asked for it."""

    def __init__(
        self,
        budget_per_node: int = 0,
        min_resident_s: float = 0.0,
        max_loads: int = 4,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.budget = budget_per_node  # 0: no limit
        self.min_resident_s = min_resident_s
        self.max_loads = max(1, max_loads)
        self.clock = clock
        self._models: dict[str, _Resident] = {}

    # -- what the manager reports -------------------------------------------------------------
    def loaded(self, name: str, pinned: bool, nodes: Iterable[str] | None = None) -> None:
        """``name`` now serves, on ``nodes`` (None: on every node); a reload (poll saw its directory change)
        keeps whose it is (see :meth:`pin`)."""
        now = self.clock()
        where = None if nodes is None else frozenset(nodes)
        old = self._models.get(name)
        if old is not None:
            old.loaded_at = now
            old.nodes = where
            return
        self._models[name] = _Resident(where, now, now, pinned)

    def pin(self, name: str) -> None:
        """The operator loaded ``name``: it is never evicted (where it runs changes only with a deploy)."""
        if name in self._models:
            self._models[name].pinned = True

    def stranded(self, live: Collection[str]) -> list[str]:
        """The models loaded on demand whose nodes all left the cluster (to unload: a request loads them again
        where there is room)."""
        return [n for n, r in self._models.items() if not r.pinned and r.nodes is not None and not r.nodes & set(live)]

    def nodes_of(self, name: str) -> frozenset[str] | None:
        """Where ``name`` runs (None: on every node, or not loaded)."""
        record = self._models.get(name)
        return None if record is None else record.nodes

    def kept_on(self, name: str) -> str | None:
        """The one node a reload of ``name`` stays on: a model loaded on demand there (None for the operator's
        models, which a deploy puts on every node)."""
        record = self._models.get(name)
        if record is None or record.pinned or record.nodes is None or len(record.nodes) != 1:
            return None
        return next(iter(record.nodes))

    def unloaded(self, name: str) -> None:
        self._models.pop(name, None)

    def touch(self, name: str) -> None:
        """A request asked for ``name`` (it is used now)."""
        if name in self._models:
            self._models[name].last_used = self.clock()

    def is_loaded(self, name: str) -> bool:
        return name in self._models

    def counted(self, node: str = DEFAULT_NODE, gone: Iterable[str] = ()) -> int:
        """The models ``node`` holds, pinned ones included (what its budget counts), less ``gone``."""
        skip = set(gone)
        return sum(1 for n, r in self._models.items() if r.on(node) and n not in skip)

    # -- the decision ---------------------------------------------------------------------------
    def admit(
        self,
        waiting: Iterable[tuple[str, int]],
        usage: Mapping[str, Usage],
        users: Mapping[str, Iterable[str]] | None = None,
        loading: int = 0,
        nodes: Sequence[str] = (),
    ) -> Admission:
        """Which of ``waiting`` (model, slots its load takes: itself and its steps not loaded yet; in the order
        asked) load now, where, and what to evict first.  ``usage``: the gateways' view by model; ``users``:
        step -> the loaded ensembles that use it; ``loading``: loads already under way (counted on every
        node); ``nodes``: where models can go (none given: one node)."""
        now = self.clock()
        users = users or {}
        candidates = list(nodes) or [DEFAULT_NODE]
        load: list[str] = []
        evict: list[str] = []
        placed: dict[str, str] = {}
        planned: dict[str, int] = dict.fromkeys(candidates, loading)  # slots taken by loads admitted here
        retry_at: float | None = None
        gone: set[str] = set()
        for name, slots in waiting:
            if loading + len(load) >= self.max_loads:
                retry_at = now + RETRY_S
                break
            if self.budget <= 0:
                node = min(candidates, key=lambda n: (planned[n] + self.counted(n), candidates.index(n)))
                picked: list[str] = []
            else:
                choice = self._place(candidates, slots, planned, usage, users, gone, now)
                if choice is None:  # no node has room, even evicting: wait (and those behind it too)
                    retry_at = min(self._next_chance(self._lru(n, usage), usage, users, gone, now) for n in candidates)
                    break
                node, picked = choice
            gone.update(picked)
            evict += picked
            planned[node] += slots
            load.append(name)
            if nodes:
                placed[name] = node
        return Admission(load, evict, retry_at, placed)

    def _place(
        self,
        candidates: list[str],
        slots: int,
        planned: Mapping[str, int],
        usage: Mapping[str, Usage],
        users: Mapping[str, Iterable[str]],
        gone: set[str],
        now: float,
    ) -> tuple[str, list[str]] | None:
        """The node a load of ``slots`` goes to, and what to evict there first: the node with the most room
        left, else the one whose first victim was used longest ago; None when no node can make room."""
        free = {n: self.budget - self.counted(n, gone) - planned[n] for n in candidates}
        roomy = max(candidates, key=lambda n: (free[n], -candidates.index(n)))
        if free[roomy] >= slots:
            return roomy, []
        best: tuple[tuple[float, int], str, list[str]] | None = None
        for node in candidates:
            order = self._lru(node, usage)
            taken = set(gone)
            picked: list[str] = []
            freed = 0
            while free[node] + freed < slots:
                victim = self._victim(order, usage, users, taken, now)
                if victim is None:
                    break
                going = [victim, *self._cascade(victim, users, taken)]
                taken.update(going)
                picked += going
                freed += sum(1 for g in going if self._models[g].on(node))
            if free[node] + freed < slots:
                continue
            rank = (self._last(picked[0], usage), candidates.index(node))
            if best is None or rank < best[0]:
                best = (rank, node, picked)
        return None if best is None else (best[1], best[2])

    def _last(self, name: str, usage: Mapping[str, Usage]) -> float:
        """When ``name`` was last used, as the gateways or the residency saw it (its load, if never)."""
        seen = usage.get(name, Usage()).last_used
        mine = self._models[name].last_used
        return mine if seen is None else max(seen, mine)

    def _lru(self, node: str, usage: Mapping[str, Usage]) -> list[str]:
        """The models on ``node`` loaded on demand, least recently used first."""
        mine = [n for n, r in self._models.items() if r.on(node) and not r.pinned]
        return sorted(mine, key=lambda n: (self._last(n, usage), n))

    def _idle(self, name: str, usage: Mapping[str, Usage]) -> bool:
        seen = usage.get(name, Usage())
        return not seen.busy and seen.sequences == 0

    def _blocked(
        self, name: str, usage: Mapping[str, Usage], users: Mapping[str, Iterable[str]], gone: set[str], now: float
    ) -> float | None:
        """Why ``name`` can't be evicted now: None if it can, else when it may (``now`` when unknown)."""
        record = self._models[name]
        if record.pinned:
            return float("inf")
        if not self._idle(name, usage):
            return now
        ready_at = record.loaded_at + self.min_resident_s
        for user in users.get(name, ()):
            if user in gone:
                continue
            other = self._models.get(user)
            if other is None or other.pinned:
                return float("inf")  # a step of a pinned ensemble (or one not loaded on demand) stays
            if not self._idle(user, usage):
                return now
            ready_at = max(ready_at, other.loaded_at + self.min_resident_s)
        return None if ready_at <= now else ready_at

    def _victim(
        self,
        order: list[str],
        usage: Mapping[str, Usage],
        users: Mapping[str, Iterable[str]],
        gone: set[str],
        now: float,
    ) -> str | None:
        for name in order:
            if name not in gone and self._blocked(name, usage, users, gone, now) is None:
                return name
        return None

    def _cascade(self, name: str, users: Mapping[str, Iterable[str]], gone: set[str]) -> list[str]:
        """The loaded ensembles that go with ``name`` (transitively), users before what they use."""
        out: list[str] = []
        stack = [name]
        while stack:
            for user in users.get(stack.pop(), ()):
                if user not in gone and user not in out and user in self._models:
                    out.append(user)
                    stack.append(user)
        return out

    def _next_chance(
        self,
        order: list[str],
        usage: Mapping[str, Usage],
        users: Mapping[str, Iterable[str]],
        gone: set[str],
        now: float,
    ) -> float:
        """When to ask again: the earliest a model becomes evictable by age, or soon when it waits for requests
        to finish (nobody announces that)."""
        soonest = float("inf")
        for name in order:
            if name in gone:
                continue
            at = self._blocked(name, usage, users, gone, now)
            if at is not None:
                soonest = min(soonest, now + RETRY_S if at <= now else at)
        return min(soonest, now + RETRY_S) if soonest == float("inf") else soonest
