"""The sequence router: one Serve deployment (one replica, a named Ray actor) for every sequence model.

It holds the table of :class:`~serve_app.sequence.router.SequenceRouter`:
which instance and slot each live sequence has, and the backlog.  Gateways
reach it over a direct channel (a START costs one round trip; the other steps
of a sequence never touch it, see ``sequence/scheduler.py``).

The model manager tells it which sequence models are loaded (``set_models``;
a reload brings a new generation, whose instances replace the old ones).
It finds their instances with a Serve broadcast to the deployments that hold
them (every second until each model has all its instances, then every few
seconds) and keeps one long poll open to each: freed slots come back on it, and a poll that breaks
means the instance is gone, so its sequences are marked lost at once, or,
when their state is backed up (gateways pass each answered step's state on
here), restored in free slots of other instances.  If this
actor dies, Serve starts a new one, which rebuilds the table (and the backups)
from the instances' snapshots.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from serve_app.errors import as_serve_error
from serve_app.rayserve.shutdown import StopsOnShutdown
from serve_app.sequence.assigner import Restore
from serve_app.sequence.messages import InstanceEvents, PollEvents, RestoreSequence
from serve_app.sequence.router import SequenceRouter
from serve_app.transport import ChannelClient, ChannelServer

logger = logging.getLogger("serve_app")

DISCOVER_FAST_S = 1.0
DISCOVER_SLOW_S = 5.0
POLL_WAIT_S = 1.0
POLL_TIMEOUT_S = 15.0  # a poll unanswered this long means the instance is gone (a hung node)
RESTORE_GRACE_S = 0.2  # states of steps answered just before a crash may still be on their way from gateways


@dataclass(frozen=True, slots=True)
class SequenceModelSpec:
    key: str  # "<name>:<version>"
    name: str
    slots_per_instance: int
    deployments: tuple[tuple[str, str, int], ...]  # (Serve application, deployment name, instances)
    generation: int = 0


class SequenceRouterDeployment(StopsOnShutdown):
    # Ray Serve awaits a deployment's async __init__ (mypy wants __init__ to return None, hence the ignore)
    async def __init__(self, token: bytes, app_name: str = "") -> None:  # type: ignore[misc]
        import ray

        self.core = SequenceRouter()
        self._revision = -1
        self._models: dict[str, SequenceModelSpec] = {}
        self._handles: dict[tuple[str, str], Any] = {}
        self._token = token
        self._watched: dict[str, asyncio.Task[None]] = {}  # instance id -> poll loop
        self._owner: dict[str, str] = {}  # instance id -> model key
        self._clients: dict[str, ChannelClient] = {}  # instance id -> its poll channel (restores go on it too)
        self._restores: set[asyncio.Task[None]] = set()
        self._server = ChannelServer(self.core.handle, token, oneway=self.core.one_way)
        self._address = await self._server.start(ray.util.get_node_ip_address())
        self._discoverer = asyncio.get_running_loop().create_task(self._discover_forever())
        # A router Serve restarted learns the loaded models from the model manager (which pushes later changes).
        self._catch_up = asyncio.get_running_loop().create_task(self._ask_manager(app_name)) if app_name else None

    async def _ask_manager(self, app_name: str) -> None:
        from ray import serve

        while True:
            try:
                handle = serve.get_deployment_handle("model_manager", app_name)
                revision, models = await handle.sequence_models.remote()
                await self.set_models(models, revision)
                return
            except Exception as exc:
                logger.warning("asking the model manager for the sequence models failed: %s", exc)
                await asyncio.sleep(1.0)

    async def address(self) -> tuple[str, int]:
        return self._address

    async def set_models(self, models: tuple[SequenceModelSpec, ...], revision: int = 0) -> None:
        """The loaded sequence models (as of the manager's ``revision``; older news is ignored).  A model
        gone, or back with another generation, loses its live sequences (as an unload ends them in
        Triton); its instances are forgotten."""
        from ray import serve

        if revision < self._revision:
            return
        self._revision = revision
        wanted = {m.key: m for m in models}
        for key, old in list(self._models.items()):
            new = wanted.get(key)
            if new is not None and new == old:
                continue
            why = "its model was unloaded" if new is None else "its model was reloaded"
            for instance, owner in list(self._owner.items()):
                if owner == key:
                    task = self._watched.pop(instance, None)
                    if task is not None:
                        task.cancel()
                    self._owner.pop(instance, None)
                    self.core.instance_down(key, instance, why, restore=False)
            self.core.remove_model(key)
            del self._models[key]
        for key, m in wanted.items():
            if key in self._models:
                continue
            self._models[key] = m
            self.core.add_model(m.key, m.name, m.slots_per_instance)
            for app, name, _ in m.deployments:
                if (app, name) not in self._handles:
                    self._handles[(app, name)] = serve.get_deployment_handle(name, app)
        live = {(a, n) for m in self._models.values() for a, n, _ in m.deployments}
        for ref in set(self._handles) - live:
            del self._handles[ref]

    async def instances(self) -> dict[str, int]:
        """Instances known per model (for tests and status)."""
        return {key: len(self.core.assigner(key).instances()) for key in self._models}

    async def check_health(self) -> None:
        if self._discoverer.done():
            raise RuntimeError("the sequence router stopped discovering instances")

    # -- discovery -----------------------------------------------------------------------
    async def _discover_forever(self) -> None:
        while True:
            complete = True
            for m in list(self._models.values()):
                try:
                    complete &= await self._discover(m)
                except Exception:
                    logger.exception("discovering the instances of %s failed", m.key)
                    complete = False
            self.core.expire_restores(time.monotonic_ns())
            await asyncio.sleep(DISCOVER_SLOW_S if complete else DISCOVER_FAST_S)

    async def _discover(self, model: SequenceModelSpec) -> bool:
        found = 0
        for app, name, _ in model.deployments:
            handle = self._handles.get((app, name))
            if handle is None or self._models.get(model.key) is not model:
                return True  # unloaded meanwhile
            answers = await handle.broadcast("targets", model.key, model.generation, True).results_async(
                return_exceptions=True
            )
            for answer in answers:
                if not isinstance(answer, list):
                    continue
                for instance, host, port, *_ in answer:
                    found += 1
                    if instance not in self._watched and self._models.get(model.key) is model:
                        address = (str(host), int(port))
                        task = asyncio.get_running_loop().create_task(self._watch(model.key, instance, address))
                        self._watched[instance] = task
                        self._owner[instance] = model.key
        return found >= sum(n for _, _, n in model.deployments)

    async def _watch(self, key: str, instance: str, address: tuple[str, int]) -> None:
        client = ChannelClient(address)
        up = False
        reason = "its model instance stopped answering"
        try:
            await client.connect(self._token)
            events: InstanceEvents = await asyncio.wait_for(
                client.call(PollEvents(snapshot=True, instance=instance)), POLL_TIMEOUT_S
            )
            if events.instance != instance:
                # A dead replica's address, still listed by Serve, now used by another process: not that instance.
                logger.warning("model %s: %s:%d answers as %s, not %s", key, *address, events.instance, instance)
                return
            self.core.instance_up(key, instance, address, events.occupied)
            self.core.backed_up(key, events)
            self._clients[instance] = client
            up = True
            logger.info("model %s: sequence instance %s at %s:%d", key, instance, *address)
            self._send_restores(key)
            while True:
                events = await asyncio.wait_for(
                    client.call(PollEvents(wait_s=POLL_WAIT_S, instance=instance)), POLL_TIMEOUT_S
                )
                self.core.released(key, events, time.monotonic_ns())
                self.core.assigner(key).set_draining(instance, events.draining)
                self._send_restores(key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # a client reads it when its sequence is lost: the instance's name, not its address
            reason = f"its model instance '{instance}' failed ({as_serve_error(exc).message})"
        finally:
            client.close()
            if self._clients.get(instance) is client:
                del self._clients[instance]
            if up and self._owner.get(instance) == key:
                self.core.instance_down(key, instance, reason)
                self._send_restores(key)
            if self._owner.get(instance) == key:
                self._watched.pop(instance, None)
                self._owner.pop(instance, None)

    # -- restores -------------------------------------------------------------------------
    def _send_restores(self, key: str) -> None:
        for restore in self.core.take_restores(key):
            task = asyncio.get_running_loop().create_task(self._restore(key, restore))
            self._restores.add(task)
            task.add_done_callback(self._restores.discard)

    async def _restore(self, key: str, restore: Restore) -> None:
        await asyncio.sleep(RESTORE_GRACE_S)
        target = restore.assignment
        client = self._clients.get(target.instance)
        ok, reason = False, f"instance {target.instance} is not reachable"
        record = self.core.backup_of(key, restore.corr_id)  # may be newer than when the slot was given
        states, no = (record.states, record.no) if record is not None else (restore.states, restore.no)
        if client is not None:
            message = RestoreSequence(target.slot, restore.corr_id, target.slot_token, states, no, target.instance)
            try:
                ok = bool(await asyncio.wait_for(client.call(message), POLL_TIMEOUT_S))
                reason = "its new instance refused it"
            except Exception as exc:
                reason = as_serve_error(exc).message
        if ok:
            logger.info(
                "model %s: sequence %s restored in slot %d of instance %s",
                key,
                restore.corr_id,
                target.slot,
                target.instance,
            )
        self.core.restored(key, restore, ok, reason)
        self._send_restores(key)  # a failed restore may have freed a slot for another

    async def stop_once(self) -> None:
        self._discoverer.cancel()
        for task in self._watched.values():
            task.cancel()
        self._server.close()
