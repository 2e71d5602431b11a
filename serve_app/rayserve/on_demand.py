"""Load on demand in the model manager: the thin loop that carries out :class:`Residency`'s decisions.

Requests for a model that is not loaded wait on one future per model (so
concurrent first requests share one load); the loop admits waiting models in
the order asked, evicts what the residency picks, then loads a batch under the
manager's lock, as the repository API's loads are.  On a cluster it also asks
which nodes have hosts (the budget is per node, and the residency picks each
load's node) and unloads the models whose node left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from serve_app.errors import NotFound, Unavailable
from serve_app.repository.model_control import Demand, ModelControl
from serve_app.repository.residency import Residency, Usage
from serve_app.settings import ServerSettings
from serve_app.stats.on_demand import OnDemandStats

logger = logging.getLogger("ray.serve")

NODES_TTL_S = 2.0  # how long the list of nodes with hosts is trusted (nodes join and leave)


def unknown_model(name: str) -> NotFound:
    """Triton's answer for a name the repository doesn't have."""
    return NotFound(f"Request for unknown model: '{name}' is not found")


def failed_model(name: str, reason: str) -> Unavailable:
    """The answer for a model whose load failed (until its directory changes)."""
    return Unavailable(f"Request for unknown model: '{name}' has no available versions: {reason}")


class Manager(Protocol):
    """What the loop needs of the model manager."""

    control: ModelControl

    @property
    def lock(self) -> asyncio.Lock: ...

    async def demand_load(
        self, names: list[str], nodes: Mapping[str, str] | None = None
    ) -> tuple[dict[str, str], list[str]]: ...

    async def host_nodes(self) -> list[str]: ...

    async def evict(self, names: list[str]) -> None: ...


class OnDemand:
    def __init__(
        self, manager: Manager, settings: ServerSettings, usage: Callable[[], Awaitable[dict[str, Usage]]]
    ) -> None:
        self._manager = manager
        self._settings = settings
        self._usage = usage
        self.residency = Residency(
            settings.max_loaded_models_per_node,
            settings.on_demand_min_resident_s,
            max_loads=settings.model_load_thread_count or 4,
        )
        self.stats = OnDemandStats()
        self._waiting: dict[str, asyncio.Future[None]] = {}  # in the order asked
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._nodes: tuple[float, list[str]] = (-NODES_TTL_S, [])  # when asked, the nodes with hosts then

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    @property
    def running(self) -> bool:
        return self._task is None or not self._task.done()

    async def demand(self, name: str) -> None:
        """Returns once ``name`` serves (loading it if needed); raises why it doesn't."""
        control = self._manager.control
        state = control.demand(name)
        if state is Demand.SERVES:
            self.residency.touch(name)
            return
        if state is Demand.UNKNOWN:
            raise unknown_model(name)
        if state is Demand.FAILED:
            raise failed_model(name, control.failure(name))
        future = self._waiting.get(name)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._waiting[name] = future
            self._wake.set()
        wait_s = self._settings.on_demand_wait_s
        try:
            await asyncio.wait_for(asyncio.shield(future), wait_s)
        except asyncio.TimeoutError:
            raise Unavailable(
                f"model '{name}' was not loaded within {wait_s:g}s (on_demand_wait_s): the node's "
                f"{self._settings.max_loaded_models_per_node} loaded models are busy or loaded too recently to "
                "evict, or its load is slow"
            ) from None

    async def _run(self) -> None:
        retry_in: float | None = None
        while True:
            if retry_in is None:
                await self._wake.wait()
            else:
                try:
                    await asyncio.wait_for(self._wake.wait(), max(0.01, retry_in))
                except asyncio.TimeoutError:
                    pass
            self._wake.clear()
            try:
                retry_in = await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("loading models on demand failed")
                retry_in = 1.0

    async def _step(self) -> float | None:
        """Admit, evict and load once; returns when to try again for models still waiting (None: none is)."""
        if not self._waiting:
            return None
        manager = self._manager
        usage = await self._usage() if self.residency.budget > 0 else {}
        nodes = await self._host_nodes() if self.residency.budget > 0 else []
        async with manager.lock:
            control = manager.control
            stranded = self.residency.stranded(nodes) if nodes else []
            if stranded:
                logger.info("unloading %s: the nodes they were loaded on left", ", ".join(stranded))
                await manager.evict(stranded)
            waiting = [(n, self._slots(n)) for n in self._waiting]
            admission = self.residency.admit(waiting, usage, control.users(), nodes=nodes if len(nodes) > 1 else ())
            if admission.evict:
                logger.info("unloading %s to make room for %s", ", ".join(admission.evict), ", ".join(admission.load))
                await manager.evict(admission.evict)
                for name in admission.evict:
                    self.stats.of(name).evictions += 1
            if admission.load:
                start = time.monotonic()
                failures, loaded = await manager.demand_load(admission.load, admission.nodes)
                took = time.monotonic() - start
                for name in loaded:
                    self.stats.record_load(name, took)
                for name in failures:
                    self.stats.of(name).load_failures += 1
                for name in admission.load:
                    future = self._waiting.pop(name)
                    if future.done():
                        continue
                    if name in failures:
                        future.set_exception(failed_model(name, failures[name]))
                        future.exception()  # retrieved: no warning when every request gave up waiting
                    else:
                        future.set_result(None)
        if not self._waiting:
            return None
        if admission.load or admission.retry_at is None:  # the loads are done: the next ones may go now
            return 0.0
        return max(0.0, admission.retry_at - self.residency.clock())

    async def _host_nodes(self) -> list[str]:
        at, nodes = self._nodes
        if time.monotonic() - at < NODES_TTL_S:
            return nodes
        nodes = await self._manager.host_nodes()
        self._nodes = (time.monotonic(), nodes)
        return nodes

    def _slots(self, name: str) -> int:
        """How many models loading ``name`` adds: itself and its steps (transitively) not loaded yet."""
        control = self._manager.control
        seen = {name}
        queue = [name]
        while queue:
            for step in control.steps_of(queue.pop()):
                if step not in seen and control.source(step) is None and control.repository.has_model(step):
                    seen.add(step)
                    queue.append(step)
        return len(seen)


def usage_of(answers: list[Any]) -> dict[str, Usage]:
    """The gateways' views of each model's use, added up (any busy is busy; the latest last use)."""
    out: dict[str, Usage] = {}
    for answer in answers:
        if isinstance(answer, BaseException):
            continue
        for name, (last, busy, sequences) in answer.items():
            old = out.get(name, Usage())
            latest = last if old.last_used is None else (old.last_used if last is None else max(last, old.last_used))
            out[name] = Usage(latest, old.busy or busy, old.sequences + sequences)
    return out
