"""ModelExecutor for the gateway: one call per batch, to the least busy model instance.

Calls go over the direct channel (serve_app.transport) of the process that
holds the instance, naming the instance (:class:`~serve_app.hosting.ExecuteOn`):
a shared host holds instances of many models behind one connection, a
dedicated replica one.  Without channels a dedicated deployment is called
through its Serve handle.  The gateway learns a version's instances (ids and
addresses) with a Serve broadcast to its deployments when the version is
added, every ``REFRESH_S`` seconds (new or replaced replicas; more often for
autoscaled ones), and soon after a channel fails.  A batch whose channel
breaks mid-call fails with UNAVAILABLE: it is not re-run, as its instance may
have executed it.  A batch a stopping instance refused (``Draining``) never
ran, so it goes to another instance.

Model versions come and go as the model manager loads and unloads them; each
is keyed by (model, version, generation), so a reload's new instances serve
beside the old ones until the old scheduler has drained.

Sequence models always use channels (a step must reach one particular
replica, which a Serve handle call can't name): their ports ask the sequence
router for places and send steps straight to the instances.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from serve_app.errors import Draining, InternalError, Unavailable
from serve_app.hosting import HostedInstance, InstanceHost
from serve_app.hosting.messages import ExecuteOn, StreamOn
from serve_app.inference.execution import Execution, ExecutionResult, PartResult
from serve_app.keys import ModelKey
from serve_app.observability.log_settings import LogSettings
from serve_app.sequence.port import ChannelSequencePort
from serve_app.service.serving_state import DeploymentRef
from serve_app.transport import ChannelClient
from serve_app.transport.channel import ChannelBroken
from serve_app.transport.pool import ChannelPool
from serve_app.transport.router_client import RouterClient

logger = logging.getLogger("serve_app")

REFRESH_S = 10.0
AUTOSCALED_REFRESH_S = 2.0  # replicas come and go: find new ones quickly
RETRY_REFRESH_S = 1.0
MAX_DRAINING_RETRIES = 4


@dataclass(slots=True, eq=False)
class _Target:
    """One instance the gateway can send batches to: its id and the connection to its process, or the
    instance itself when this gateway holds it."""

    instance: str
    client: ChannelClient | None = None
    local: HostedInstance | None = None
    lane: ChannelClient | None = None  # straight to the instance's thread, when it is on this node
    inflight: int = 0
    logs_sent: LogSettings | None = None  # what its process was last told of the log settings

    def _logs(self, current: LogSettings | None) -> LogSettings | None:
        """``current`` when its process has not been told them yet (a new connection starts untold)."""
        if current is None or current == self.logs_sent:
            return None
        self.logs_sent = current
        return current

    @property
    def closed(self) -> bool:
        return self.client is not None and self.client.closed

    def stream(
        self, execution: Execution, logs: LogSettings | None = None
    ) -> AsyncGenerator[tuple[int, PartResult], None]:
        if self.local is not None:
            return self.local.stream(execution)
        assert self.client is not None
        message = StreamOn(self.instance, execution, self._logs(logs))
        stream: AsyncGenerator[tuple[int, PartResult], None] = self.client.stream(message)
        return stream

    def call(
        self, executions: list[Execution], logs: LogSettings | None, timeout_s: float | None
    ) -> Awaitable[list[ExecutionResult]]:
        """The call's results; ``asyncio.TimeoutError`` when they take longer than ``timeout_s`` (None: no limit)."""
        if self.local is not None:
            return self.local.execute(executions, timeout_s)
        # The lane and the channel reach the same process: what one told it, it knows.
        client = self.lane if self.lane is not None and not self.lane.closed else self.client
        assert client is not None
        result: Awaitable[list[ExecutionResult]] = client.send(
            ExecuteOn(self.instance, executions, self._logs(logs)), timeout_s
        )
        return result


def _broken(key: ModelKey, target: _Target, exc: ChannelBroken) -> ChannelBroken:
    """A broken channel as the client reads it: the model and instance, no address."""
    return ChannelBroken(f"model '{key.name}' version {key.version}: instance '{target.instance}': {exc.message}")


class _Group:
    """One Serve deployment serving an instance group of a model version: a dedicated deployment (one
    replica per instance) or a pool of shared hosts; and the instances of the version it holds."""

    def __init__(
        self,
        name: str,
        handle: Any,
        replicas: int,
        key: ModelKey,
        autoscaled: bool = False,
        hosted: bool = False,
        app: str = "",
    ) -> None:
        self.name = name
        self.app = app
        self.handle = handle
        self.key = key
        self.replicas = max(1, replicas)  # the instances it starts with (until they are known)
        self.autoscaled = autoscaled
        self.hosted = hosted
        self.serve_inflight = 0
        self.targets: dict[str, _Target] = {}  # instance id -> target
        self.refreshed_at = 0.0
        self.refreshing: asyncio.Task[None] | None = None

    def load(self) -> float:
        return (self.serve_inflight + sum(t.inflight for t in self.targets.values())) / self.replicas

    def live(self) -> int:
        """Instances it can take batches on now (the starting count until channels are known)."""
        open_targets = sum(1 for t in self.targets.values() if not t.closed)
        return open_targets if (self.autoscaled or self.hosted) and open_targets else self.replicas

    def pick(self) -> _Target | None:
        """The least busy instance (this process's own first, on a tie: no hop)."""
        best: _Target | None = None
        for t in self.targets.values():
            if t.closed or (best is not None and t.inflight > best.inflight):
                continue
            if best is None or t.inflight < best.inflight or (t.local is not None and best.local is None):
                best = t
        return best

    def drop(self, target: _Target) -> None:
        self.targets.pop(target.instance, None)


class RayModelExecutor:
    def __init__(
        self,
        *,
        inflight_per_instance: int,
        channel_token: bytes = b"",
        direct: bool = True,
        router: Any = None,
        on_capacity: Callable[[ModelKey, int], None] | None = None,
        call_timeout_s: float = 0.0,
        local: InstanceHost | None = None,
    ) -> None:
        """``direct``: batches go over channels (else Serve handles); ``router``: the sequence router's
        handle; ``on_capacity``: told when a version's instance count changes (autoscaling); ``local``: the
        instances this process holds itself (a gateway that hosts CPU instances)."""
        self._local = local
        self.own: tuple[str, str] | None = None  # this process's deployment (gateway, app), when it hosts
        self.started = False  # it runs: a broadcast to its own deployment reaches it
        self._groups: dict[ModelKey, list[_Group]] = {}
        self._per_instance = max(1, inflight_per_instance)
        self._token = channel_token if direct else b""
        self._refresher: asyncio.Task[None] | None = None
        self._pool = ChannelPool(channel_token)
        self._router = RouterClient(self._router_address, self._pool) if router is not None else None
        self._router_handle = router
        self._on_capacity = on_capacity
        self._call_timeout = call_timeout_s if call_timeout_s > 0 else None
        # The server's current log settings, passed on to the instances' processes as they change.
        self.logs: Callable[[], LogSettings] | None = None
        self._node: str | None = None

    def _node_id(self) -> str:
        """This gateway's Ray node (an instance's lane is a Unix socket: only reachable on its node)."""
        if self._node is None:
            import ray

            self._node = ray.get_runtime_context().get_node_id()
        return self._node

    async def _router_address(self) -> tuple[str, int]:
        address: tuple[str, int] = await self._router_handle.address.remote()
        return address

    def sequence_port(self, key: ModelKey) -> ChannelSequencePort:
        if self._router is None:
            raise InternalError(f"model '{key.name}' has sequence batching but no sequence router runs")
        return ChannelSequencePort(key.label, self._router, self._pool)

    async def add_version(self, key: ModelKey, refs: tuple[DeploymentRef, ...]) -> None:
        """Serve a model version's deployments: open channels to their replicas."""
        from ray import serve

        groups = [
            _Group(r.name, serve.get_deployment_handle(r.name, r.app), r.replicas, key, r.autoscaled, r.hosted, r.app)
            for r in refs
        ]
        self._groups[key] = groups
        if self._token:
            await asyncio.gather(*(self._refresh(g) for g in groups))
        if self._refresher is None and self._token:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_forever())

    def remove_version(self, key: ModelKey) -> None:
        self._groups.pop(key, None)  # the connections are shared (the pool's): other versions may use them

    def handles(self, key: ModelKey, skip: tuple[str, str] | None = None) -> list[Any]:
        """The deployments holding the version's instances, each once (its groups may share a host pool);
        ``skip``: a (deployment, application) to leave out."""
        groups = [g for g in self._groups.get(key, ()) if (g.name, g.app) != skip]
        return list({g.name: g.handle for g in groups}.values())

    def instances(self, key: ModelKey) -> int:
        """Instances of the version this gateway can reach now (channels; the planned count without)."""
        return sum(g.live() if self._token else g.replicas for g in self._groups.get(key, ()))

    def capacity(self, key: ModelKey) -> int:
        return sum(g.live() for g in self._groups.get(key, ())) * self._per_instance

    async def execute(self, key: ModelKey, executions: list[Execution]) -> list[ExecutionResult]:
        group = self._least_loaded(key)
        for _ in range(MAX_DRAINING_RETRIES):
            target = group.pick() if self._token else None
            if target is None:
                break
            with self._attempt(key, group, target):
                try:
                    logs = self.logs() if self.logs is not None else None
                    result: list[ExecutionResult] = await target.call(executions, logs, self._call_timeout)
                    return result
                except asyncio.TimeoutError:
                    # A hung instance (a dead one breaks its channel at once): its callers don't wait for ever.
                    raise Unavailable(
                        f"model '{key.name}' version {key.version}: its instance did not answer within "
                        f"{self._call_timeout:g}s"
                    ) from None
        if self._token:
            self._refresh_soon(group)
        if group.hosted:
            raise Unavailable(f"model '{key.name}' version {key.version}: none of its instances is reachable now")
        group.serve_inflight += 1
        try:
            result = await asyncio.wait_for(group.handle.execute.remote(executions), self._call_timeout)
            return result
        except asyncio.TimeoutError:
            raise Unavailable(
                f"model '{key.name}' version {key.version}: its instance did not answer within {self._call_timeout:g}s"
            ) from None
        finally:
            group.serve_inflight -= 1

    async def stream(self, key: ModelKey, execution: Execution) -> AsyncGenerator[tuple[int, PartResult], None]:
        """A decoupled execution on the least busy instance, its responses as they come.  Over a channel
        only: each response crosses as it is sent, with the channel's back-pressure."""
        group = self._least_loaded(key)
        for _ in range(MAX_DRAINING_RETRIES):
            target = group.pick() if self._token else None
            if target is None:
                break
            started: list[bool] = []  # a response went out: a Draining after it ends the stream
            with self._attempt(key, group, target, answered=started):
                logs = self.logs() if self.logs is not None else None
                async with contextlib.aclosing(target.stream(execution, logs)) as items:
                    async for item in items:
                        started[:] = [True]
                        yield item
                return
        self._refresh_soon(group)
        raise Unavailable(f"model '{key.name}' version {key.version}: none of its instances is reachable now")

    def _least_loaded(self, key: ModelKey) -> _Group:
        groups = self._groups.get(key)
        if not groups:
            raise InternalError(f"no deployment serves model '{key.name}' version {key.version}")
        return groups[0] if len(groups) == 1 else min(groups, key=_Group.load)

    @contextlib.contextmanager
    def _attempt(
        self, key: ModelKey, group: _Group, target: _Target, answered: list[bool] | None = None
    ) -> Iterator[None]:
        """One try of a call on ``target``: counted in its load; a ``Draining`` refusal (stopping: scaled down,
        reloaded, or its host restarted, before it ran anything) is swallowed so the caller tries another
        instance, unless ``answered`` (a stream's) says a response already went out; a broken channel or an
        unavailable instance ends the call, and the group's instances are looked up again soon."""
        target.inflight += 1
        try:
            yield
        except Draining:
            if answered:
                raise
            group.drop(target)
            self._refresh_soon(group)
        except ChannelBroken as exc:
            self._refresh_soon(group)
            raise _broken(key, target, exc) from None
        except Unavailable:
            self._refresh_soon(group)
            raise
        finally:
            target.inflight -= 1

    # -- channel upkeep -------------------------------------------------------------
    def _refresh_soon(self, group: _Group) -> None:
        if group.refreshing is not None or time.monotonic() - group.refreshed_at < RETRY_REFRESH_S:
            return
        group.refreshing = asyncio.get_running_loop().create_task(self._refresh(group))

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(AUTOSCALED_REFRESH_S)
            now = time.monotonic()
            for key, gs in list(self._groups.items()):
                before = sum(g.live() for g in gs)
                for g in gs:
                    due = AUTOSCALED_REFRESH_S if g.autoscaled else REFRESH_S
                    if now - g.refreshed_at < due or g.refreshing is not None:
                        continue
                    try:
                        await self._refresh(g)
                    except Exception:
                        logger.exception("refreshing the channels of %s failed", g.name)
                after = sum(g.live() for g in gs)
                if after != before and self._on_capacity is not None and key in self._groups:
                    self._on_capacity(key, after * self._per_instance)

    async def _refresh(self, group: _Group) -> None:
        """Learn the instances of the group's model version from its deployment (each replica answers for
        the instances it holds), and connect to their processes."""
        try:
            group.refreshed_at = time.monotonic()
            answers: list[Any] = []
            if (group.name, group.app) != self.own or self.started:  # no broadcast to itself while starting
                try:
                    call = group.handle.broadcast("targets", group.key.label, group.key.generation)
                    answers = await call.results_async(return_exceptions=True)
                except Exception as exc:  # none running (yet): the next refresh asks again
                    logger.info("no instances of %s found in %s yet: %s", group.key.label, group.name, exc)
            found: dict[str, tuple[str, int]] = {}
            lanes: dict[str, str] = {}  # instance id -> its lane's socket, for instances on this node
            for answer in answers:
                if isinstance(answer, list):
                    for instance, host, port, *lane in answer:
                        found[str(instance)] = (str(host), int(port))
                        node, _, path = str(lane[0] if lane else "").partition(":")
                        if path and node == self._node_id():
                            lanes[str(instance)] = path
            local = {i.id: i for i in self._local.of(group.key)} if self._local is not None else {}
            for instance, target in list(group.targets.items()):
                if target.closed or (instance not in found and instance not in local):
                    del group.targets[instance]
            for instance, held in local.items():  # held in this process: called directly, no hop
                if instance not in group.targets:
                    group.targets[instance] = _Target(instance, local=held)
            for instance, address in found.items():
                if instance not in group.targets:
                    try:
                        client = await self._pool.get(address)
                    except ChannelBroken as exc:
                        logger.warning("no channel to %s instance %s at %s: %s", group.name, instance, address, exc)
                        continue
                    group.targets[instance] = _Target(instance, client=client)
                target = group.targets[instance]
                if instance in lanes and (target.lane is None or target.lane.closed):
                    try:
                        target.lane = await self._pool.get(lanes[instance])
                    except ChannelBroken as exc:  # its channel still serves it
                        logger.warning("no lane to %s instance %s: %s", group.name, instance, exc)
        finally:
            group.refreshed_at = time.monotonic()
            group.refreshing = None

    def close(self) -> None:
        self._pool.close()
        if self._refresher is not None:
            self._refresher.cancel()
