"""The instances of one process, by id: what they run, and what the channel carries to them.

A shared host follows its *content*, the instance groups the model manager
wants in every host of its pool (:meth:`InstanceHost.apply`): groups it lacks
are loaded (their instances in parallel, each on its own thread), groups no
longer wanted are stopped and closed.  Every host of a pool holds the same
content, so a host Serve replaces loads the same groups again.  Gateways send
:class:`ExecuteOn` batches, and the sequence router its polls and restores,
naming the instance; a message for an instance that is not here (it was
unloaded, or its host restarted) is answered as a stopping instance would:
``Draining`` for a batch (it never ran, so it may go elsewhere), "not here"
for a sequence step.

The local server (``python -m serve_app --local``) holds its instances in one
host too, loaded before it serves (:meth:`InstanceHost.add_blocking`), and
with its sequence router in the same process (``on_release``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

from serve_app.errors import Draining, Unavailable
from serve_app.hosting.instance import HostedInstance
from serve_app.hosting.messages import ExecuteOn, InstanceLoad, StreamOn
from serve_app.keys import ModelKey
from serve_app.observability import python_logging
from serve_app.sequence.messages import InstanceEvents, PollEvents, RestoreSequence, SequenceStep, StepResult

STOP_WAIT_S = 27.0  # a group's instances may finish their work this long when it is removed


Released = Callable[[str, InstanceEvents], None]  # (model version label, freed slots): an in-process router


class InstanceHost:
    def __init__(
        self,
        host_id: str,
        gpu_ids: tuple[int, ...] | None = (),
        link: Any = None,
        on_release: Released | None = None,
    ) -> None:
        """``host_id``: unique across the cluster (instance ids start with it); ``gpu_ids``: the devices this
        process sees, for GPU instances (None: every GPU, unpinned, so a GPU instance uses its group's device);
        ``link``: how model code here reaches the server (Python models' BLS and model control);
        ``on_release``: the sequence router, when it runs in this process (else it polls the instances)."""
        self.host_id = host_id
        self.gpu_ids = gpu_ids if gpu_ids is not None else ()
        self._every_gpu = gpu_ids is None
        self.link = link
        self._on_release = on_release
        self._instances: dict[str, HostedInstance] = {}
        self._groups: dict[str, tuple[InstanceLoad, list[HostedInstance], str]] = {}  # group id -> (load, them, error)
        self._lock = asyncio.Lock()

    # -- content -----------------------------------------------------------------------
    @staticmethod
    def group_id(load: InstanceLoad) -> str:
        return load.instance_key(0).rsplit(".", 1)[0]

    async def apply(self, loads: list[InstanceLoad]) -> dict[str, str]:
        """Host exactly ``loads``: load what is missing, stop and close what is no longer wanted.  Returns
        each wanted group's load error ("" when its instances loaded)."""
        async with self._lock:
            wanted = {self.group_id(load): load for load in loads}
            gone = [g for g in self._groups if g not in wanted]
            await asyncio.gather(*(self._remove(g, unloading=True) for g in gone))
            new = [load for g, load in wanted.items() if g not in self._groups]
            await asyncio.gather(*(self._add(load) for load in new))
            return {g: self._groups[g][2] for g in wanted}

    async def _add(self, load: InstanceLoad) -> None:
        them = self._make(load)
        await asyncio.gather(*(i.start() for i in them))
        self._hold(load, them)

    def add_blocking(self, load: InstanceLoad) -> str:
        """Load one group now, its instances one after the other (a server that loads before it serves);
        its load error ("" when its instances loaded)."""
        them = self._make(load)
        for i in them:
            i.start_blocking()
        return self._hold(load, them)

    def discard(self, load: InstanceLoad) -> None:
        """Close a group that never served (a model that failed to load as a whole)."""
        entry = self._groups.pop(self.group_id(load), None)
        for i in entry[1] if entry is not None else ():
            self._instances.pop(i.id, None)
            i.close()

    def _make(self, load: InstanceLoad) -> list[HostedInstance]:
        gpu_ids = self.gpu_ids
        if self._every_gpu and load.kind == "KIND_GPU":
            gpu_ids = (load.spec.device or 0,)
        them = []
        for n in range(load.count):
            instance_id = f"{self.host_id}/{load.instance_key(n)}"
            released = functools.partial(self._on_release, load.key.label) if self._on_release else None
            them.append(HostedInstance(load, instance_id, load.spec.instance_name(n), gpu_ids, self.link, released))
        return them

    def _hold(self, load: InstanceLoad, them: list[HostedInstance]) -> str:
        errors = [i.load_error for i in them if i.instance is None]
        error = errors[0] if errors else ""
        self._groups[self.group_id(load)] = (load, them, error)
        for i in them:
            self._instances[i.id] = i
        return error

    async def _remove(self, group: str, *, unloading: bool) -> None:
        _, them, _ = self._groups.pop(group)
        for i in them:
            i.unloading = unloading
        deadline = time.monotonic() + STOP_WAIT_S
        await asyncio.gather(*(i.stop(deadline) for i in them))
        for i in them:
            self._instances.pop(i.id, None)
            i.close()

    def adopt(self, instance: HostedInstance) -> None:
        """Host an instance made elsewhere (a dedicated replica's one instance)."""
        self._instances[instance.id] = instance

    # -- lookups -----------------------------------------------------------------------
    def instances(self) -> list[HostedInstance]:
        return list(self._instances.values())

    def of(self, key: ModelKey) -> list[HostedInstance]:
        """The instances of one load of one model version."""
        return [i for i in self._instances.values() if i.key == key]

    def get(self, instance_id: str) -> HostedInstance | None:
        return self._instances.get(instance_id)

    # -- the channel ---------------------------------------------------------------------
    async def on_channel(self, message: object) -> object:
        """Batches, sequence steps, and the router's polls and restores, each for the instance it names."""
        if isinstance(message, (ExecuteOn, StreamOn)) and message.logs is not None:
            python_logging.apply(message.logs)  # /v2/logging changes reach the models hosted here
        if isinstance(message, ExecuteOn):
            instance = self._instances.get(message.instance)
            if instance is None:
                raise Draining(f"instance {message.instance} is not hosted here (unloaded, or its host restarted)")
            return await instance.execute(message.executions)
        if isinstance(message, StreamOn):
            instance = self._instances.get(message.instance)
            if instance is None:
                raise Draining(f"instance {message.instance} is not hosted here (unloaded, or its host restarted)")
            return instance.stream(message.execution)
        if isinstance(message, SequenceStep):
            return await self.step(message)
        if isinstance(message, PollEvents):
            instance = self._instances.get(message.instance)
            if instance is None:
                raise Unavailable(f"instance {message.instance} is not hosted here")
            return await instance.poll(message)
        if isinstance(message, RestoreSequence):
            instance = self._instances.get(message.instance)
            return instance is not None and instance.restore(message)
        raise TypeError(f"unexpected channel message {type(message).__name__}")

    async def step(self, step: SequenceStep) -> StepResult:
        """A sequence step for the instance it names ("not here" when it is gone: the router places it again)."""
        instance = self._instances.get(step.instance)
        if instance is None:
            return StepResult(not_here=True)
        return await instance.step(step)

    # -- stopping ------------------------------------------------------------------------
    async def stop(self, *, unloading: bool) -> None:
        """The process is going away: every instance finishes what it can (bounded), then closes."""
        deadline = time.monotonic() + STOP_WAIT_S
        for i in self._instances.values():
            i.unloading = i.unloading or unloading
        await asyncio.gather(*(i.stop(deadline) for i in self._instances.values()))
        for i in self._instances.values():
            i.close()
