"""RayModelExecutor without Ray: _Group objects holding _Targets over fake channel clients, with fake Serve
handles, put straight into the executor; Draining re-sends, timeouts, channel errors, the Serve-handle fallback
(dedicated deployments only), capacity and instance counts, and the refresh of a group's instances."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from serve_app.errors import Draining, InternalError, Unavailable
from serve_app.hosting.messages import ExecuteOn
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.keys import ModelKey
from serve_app.rayserve import executor as executor_module
from serve_app.rayserve.executor import MAX_DRAINING_RETRIES, RayModelExecutor, _Group, _Target
from serve_app.transport.channel import ChannelBroken

KEY = ModelKey("m", 1, 7)
EXECUTIONS = [Execution({"INPUT0": np.zeros((1, 2), np.float32)}, ("OUTPUT0",), 1)]
CHANNEL_RESULT = [ExecutionResult(outputs={"OUTPUT0": np.ones((1, 2), np.float32)})]
SERVE_RESULT = [ExecutionResult(outputs={"OUTPUT0": np.full((1, 2), 2, np.float32)})]


class FakeClient:
    """A ChannelClient (one connection): answers ``CHANNEL_RESULT``, raises ``raises``, or never answers."""

    def __init__(self, *, raises: Exception | None = None, hang: bool = False) -> None:
        self.closed = False
        self.raises = raises
        self.hang = hang
        self.payloads: list[Any] = []

    async def call(self, payload: Any) -> Any:
        self.payloads.append(payload)
        if self.hang:
            await asyncio.Event().wait()
        if self.raises is not None:
            raise self.raises
        return CHANNEL_RESULT

    def send(self, payload: Any, timeout_s: float | None = None) -> asyncio.Future[Any]:
        """As ChannelClient.send: the answer's future, failed with TimeoutError after ``timeout_s``."""
        return asyncio.ensure_future(asyncio.wait_for(self.call(payload), timeout_s))

    def close(self) -> None:
        self.closed = True


def target(instance: str, *, inflight: int = 0, closed: bool = False, **client: Any) -> _Target:
    t = _Target(instance, client=FakeClient(**client), inflight=inflight)  # type: ignore[arg-type]
    t.client.closed = closed
    return t


def calls(t: _Target) -> list[Any]:
    return t.client.payloads  # type: ignore[attr-defined,no-any-return]


class FakeHandle:
    """A Serve deployment handle: ``execute.remote(...)`` is awaitable and held while ``gate`` is clear;
    ``broadcast(...).results_async()`` answers ``answers``."""

    def __init__(self) -> None:
        self.sent: list[list[Execution]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.answers: list[Any] = []
        self.broadcasts: list[tuple[Any, ...]] = []
        self.execute = SimpleNamespace(remote=self._remote)

    def _remote(self, executions: list[Execution]) -> Any:
        self.sent.append(executions)

        async def answer() -> list[ExecutionResult]:
            await self.gate.wait()
            return SERVE_RESULT

        return answer()

    def broadcast(self, *args: Any) -> Any:
        self.broadcasts.append(args)

        async def results_async(return_exceptions: bool = False) -> list[Any]:
            return list(self.answers)

        return SimpleNamespace(results_async=results_async)


def group(
    *targets: _Target, replicas: int = 2, autoscaled: bool = False, hosted: bool = False, name: str = "g"
) -> _Group:
    g = _Group(name, FakeHandle(), replicas, KEY, autoscaled, hosted)
    g.targets = {t.instance: t for t in targets}
    return g


def handle(g: _Group) -> FakeHandle:
    h: FakeHandle = g.handle
    return h


def make_executor(
    monkeypatch: pytest.MonkeyPatch, *groups: _Group, direct: bool = True, timeout_s: float = 0.0, **kw: Any
) -> tuple[RayModelExecutor, list[str]]:
    """The executor serving ``groups`` as KEY; returns it and the names of the groups it asked to refresh."""
    ex = RayModelExecutor(
        inflight_per_instance=2, channel_token=b"token", direct=direct, call_timeout_s=timeout_s, **kw
    )
    if groups:
        ex._groups[KEY] = list(groups)
    refreshed: list[str] = []

    async def refresh(g: _Group) -> None:
        refreshed.append(g.name)
        g.refreshed_at = time.monotonic()
        g.refreshing = None

    monkeypatch.setattr(ex, "_refresh", refresh)
    return ex, refreshed


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# -- execute over channels --------------------------------------------------------------------------
async def test_the_least_busy_instance_runs_the_batch_named_by_its_id(monkeypatch: pytest.MonkeyPatch) -> None:
    busy, idle = target("i1", inflight=3), target("i2", inflight=1)
    g = group(busy, idle)
    ex, refreshed = make_executor(monkeypatch, g)
    assert await ex.execute(KEY, EXECUTIONS) is CHANNEL_RESULT
    assert calls(busy) == [] and calls(idle) == [ExecuteOn("i2", EXECUTIONS)]
    assert (busy.inflight, idle.inflight) == (3, 1) and handle(g).sent == [] and refreshed == []


async def test_a_draining_instance_hands_the_batch_to_another(monkeypatch: pytest.MonkeyPatch) -> None:
    stopping, other = target("i1", raises=Draining("stopping")), target("i2", inflight=1)
    g = group(stopping, other)
    ex, refreshed = make_executor(monkeypatch, g)
    assert await ex.execute(KEY, EXECUTIONS) is CHANNEL_RESULT
    assert list(g.targets) == ["i2"] and len(calls(stopping)) == len(calls(other)) == 1
    assert not stopping.closed  # its connection may serve other instances of the same host
    assert handle(g).sent == [] and stopping.inflight == 0
    await settle()
    assert refreshed == ["g"]


async def test_when_every_instance_drains_the_serve_handle_runs_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    targets = [target(f"i{n}", inflight=n, raises=Draining("stopping")) for n in range(MAX_DRAINING_RETRIES + 1)]
    g = group(*targets)
    ex, _ = make_executor(monkeypatch, g)
    assert await ex.execute(KEY, EXECUTIONS) is SERVE_RESULT
    assert [len(calls(t)) for t in targets] == [1] * MAX_DRAINING_RETRIES + [0]
    assert list(g.targets) == [targets[-1].instance] and handle(g).sent == [EXECUTIONS]


async def test_a_hung_instance_fails_the_batch_after_the_call_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    hung = target("i1", hang=True)
    g = group(hung)
    ex, refreshed = make_executor(monkeypatch, g, timeout_s=0.05)
    with pytest.raises(Unavailable) as exc:
        await ex.execute(KEY, EXECUTIONS)
    assert str(exc.value) == "model 'm' version 1: its instance did not answer within 0.05s"
    assert not isinstance(exc.value, Draining) and handle(g).sent == [] and hung.inflight == 0
    await settle()
    assert refreshed == ["g"]


async def test_an_unavailable_channel_propagates_and_is_not_rerun(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = ChannelBroken("the channel's peer is unavailable: connection lost")
    a, b = target("i1", raises=broken), target("i2", inflight=1)
    g = group(a, b)
    ex, refreshed = make_executor(monkeypatch, g)
    with pytest.raises(ChannelBroken) as exc:
        await ex.execute(KEY, EXECUTIONS)
    assert str(exc.value) == "model 'm' version 1: instance 'i1': the channel's peer is unavailable: connection lost"
    assert (len(calls(a)), len(calls(b))) == (1, 0) and handle(g).sent == [] and list(g.targets) == ["i1", "i2"]
    await settle()
    assert refreshed == ["g"]


async def test_a_refresh_is_not_asked_again_right_after_one(monkeypatch: pytest.MonkeyPatch) -> None:
    g = group(target("i1", raises=Unavailable("broke")))
    g.refreshed_at = time.monotonic()
    ex, refreshed = make_executor(monkeypatch, g)
    with pytest.raises(Unavailable):
        await ex.execute(KEY, EXECUTIONS)
    await settle()
    assert refreshed == []


# -- without a reachable instance -------------------------------------------------------------------
async def test_without_an_open_channel_the_serve_handle_runs_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    closed = target("i1", closed=True)
    g = group(closed)
    handle(g).gate.clear()
    ex, refreshed = make_executor(monkeypatch, g)
    task = asyncio.create_task(ex.execute(KEY, EXECUTIONS))
    await settle()
    assert g.serve_inflight == 1 and g.load() == 0.5
    handle(g).gate.set()
    assert await task is SERVE_RESULT
    assert g.serve_inflight == 0 and handle(g).sent == [EXECUTIONS] and calls(closed) == []
    assert refreshed == ["g"]


async def test_a_hosted_group_without_a_reachable_instance_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    g = group(target("i1", closed=True), hosted=True)
    ex, refreshed = make_executor(monkeypatch, g)
    with pytest.raises(Unavailable, match=r"^model 'm' version 1: none of its instances is reachable now$"):
        await ex.execute(KEY, EXECUTIONS)
    assert handle(g).sent == []  # a host serves many models: its Serve handle can't run this one's batch
    await settle()
    assert refreshed == ["g"]


async def test_without_direct_channels_only_the_serve_handle_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    t = target("i1")
    g = group(t)
    ex, refreshed = make_executor(monkeypatch, g, direct=False)
    assert await ex.execute(KEY, EXECUTIONS) is SERVE_RESULT
    await settle()
    assert calls(t) == [] and refreshed == []


async def test_a_serve_handle_call_past_the_timeout_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    g = group()
    handle(g).gate.clear()
    ex, _ = make_executor(monkeypatch, g, direct=False, timeout_s=0.05)
    with pytest.raises(Unavailable, match=r"^model 'm' version 1: its instance did not answer within 0.05s$"):
        await ex.execute(KEY, EXECUTIONS)
    assert g.serve_inflight == 0


async def test_the_least_loaded_group_takes_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    heavy, light = target("i1", inflight=4), target("i2", inflight=1)
    ex, _ = make_executor(monkeypatch, group(heavy, replicas=1, name="heavy"), group(light, replicas=1, name="light"))
    await ex.execute(KEY, EXECUTIONS)
    assert (len(calls(heavy)), len(calls(light))) == (0, 1)


async def test_a_version_without_deployments_is_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    ex, _ = make_executor(monkeypatch)
    with pytest.raises(InternalError, match=r"^no deployment serves model 'm' version 1$"):
        await ex.execute(KEY, EXECUTIONS)


# -- capacity and instances -------------------------------------------------------------------------
def test_fixed_groups_count_their_planned_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    ex, _ = make_executor(monkeypatch, group(target("i1"), target("i2", closed=True), replicas=3))
    assert (ex.instances(KEY), ex.capacity(KEY)) == (3, 6)


@pytest.mark.parametrize(("autoscaled", "hosted"), [(True, False), (False, True)])
def test_autoscaled_and_hosted_groups_count_their_open_channels(
    monkeypatch: pytest.MonkeyPatch, autoscaled: bool, hosted: bool
) -> None:
    known = group(
        target("i1"), target("i2"), target("i3", closed=True), replicas=1, autoscaled=autoscaled, hosted=hosted
    )
    starting = group(replicas=2, autoscaled=autoscaled, hosted=hosted, name="starting")  # none known yet: its start
    ex, _ = make_executor(monkeypatch, known, starting)
    assert (ex.instances(KEY), ex.capacity(KEY)) == (4, 8)


def test_without_direct_channels_instances_are_the_planned_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    ex, _ = make_executor(monkeypatch, group(replicas=3), group(replicas=0, name="zero"), direct=False)
    assert (ex.instances(KEY), ex.capacity(KEY)) == (4, 8)


def test_unknown_versions_have_no_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    ex, _ = make_executor(monkeypatch)
    assert (ex.instances(KEY), ex.capacity(KEY), ex.handles(KEY)) == (0, 0, [])


def test_remove_version_forgets_its_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    g = group(target("i1"))
    ex, _ = make_executor(monkeypatch, g)
    assert ex.handles(KEY) == [g.handle]
    ex.remove_version(KEY)
    ex.remove_version(KEY)  # twice: nothing left to do
    assert ex.handles(KEY) == [] and ex.instances(KEY) == 0


# -- refreshing a group's instances -----------------------------------------------------------------
async def test_refresh_keeps_live_instances_drops_gone_ones_and_connects_new_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept, gone, dead = target("i1"), target("i4"), target("i2", closed=True)
    g = group(kept, gone, dead)
    handle(g).answers = [[("i1", "h", 1), ("i2", "h", 2)], RuntimeError("a replica died"), [("i3", "h", 13)]]
    ex = RayModelExecutor(inflight_per_instance=1, channel_token=b"token")
    connected: list[tuple[str, int]] = []

    async def get(address: tuple[str, int]) -> FakeClient:
        if address[1] == 13:
            raise ChannelBroken("cannot reach h:13")
        connected.append(address)
        return FakeClient()

    monkeypatch.setattr(ex._pool, "get", get)
    await ex._refresh(g)
    assert handle(g).broadcasts == [("targets", "m:1", 7)]
    assert sorted(g.targets) == ["i1", "i2"] and g.targets["i1"] is kept
    assert g.targets["i2"] is not dead and not g.targets["i2"].closed  # the closed one was replaced
    assert connected == [("h", 2)]
    assert g.refreshing is None and g.refreshed_at > 0


async def test_a_change_in_autoscaled_instances_reports_the_new_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor_module, "AUTOSCALED_REFRESH_S", 0.01)
    reported: list[tuple[ModelKey, int]] = []
    g = group(replicas=1, autoscaled=True)
    ex, _ = make_executor(monkeypatch, g, on_capacity=lambda key, cap: reported.append((key, cap)))

    async def refresh(group: _Group) -> None:
        group.targets = {t.instance: t for t in (target("i1"), target("i2"))}
        group.refreshed_at = time.monotonic()

    monkeypatch.setattr(ex, "_refresh", refresh)
    task = asyncio.create_task(ex._refresh_forever())
    try:
        for _ in range(500):
            if reported:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert reported[0] == (KEY, 4)


# -- instances this process holds ---------------------------------------------------------------------
class FakeHeld:
    """A HostedInstance this gateway holds: executed directly, no channel."""

    def __init__(self, instance_id: str) -> None:
        self.id = instance_id
        self.ran: list[list[Execution]] = []

    async def execute(self, executions: list[Execution], timeout_s: float | None = None) -> list[ExecutionResult]:
        self.ran.append(executions)
        return SERVE_RESULT


async def test_an_instance_held_here_runs_without_a_hop_and_wins_a_tie(monkeypatch: pytest.MonkeyPatch) -> None:
    remote = target("far", inflight=0)
    held = FakeHeld("near")
    local = _Target("near", local=held)  # type: ignore[arg-type]
    g = group(remote, local, hosted=True)
    ex, _ = make_executor(monkeypatch, g)
    assert await ex.execute(KEY, EXECUTIONS) is SERVE_RESULT
    assert held.ran == [EXECUTIONS] and calls(remote) == [] and local.inflight == 0
    local.inflight = 1  # busier than the remote one: the remote one takes the next batch
    assert await ex.execute(KEY, EXECUTIONS) is CHANNEL_RESULT


async def test_refresh_adds_held_instances_and_asks_no_replica_of_its_own_deployment_while_starting() -> None:
    held = FakeHeld("gw1/m:1.7.0.0")
    local_host = SimpleNamespace(of=lambda key: [held] if key == KEY else [])
    ex = RayModelExecutor(inflight_per_instance=1, channel_token=b"token", local=local_host)  # type: ignore[arg-type]
    ex.own = ("gateway", "app")
    g = _Group("gateway", FakeHandle(), 1, KEY, hosted=True, app="app")
    await ex._refresh(g)
    assert handle(g).broadcasts == [] and g.targets[held.id].local is held  # type: ignore[comparison-overlap]
    ex.started = True
    await ex._refresh(g)
    assert handle(g).broadcasts == [("targets", "m:1", 7)] and list(g.targets) == [held.id]


def test_a_gateway_tells_each_instance_process_of_log_settings_once() -> None:
    from serve_app.observability.log_settings import LogSettings
    from serve_app.rayserve.executor import _Target

    target = _Target("i")
    first, changed = LogSettings(), LogSettings(log_info=False)
    assert target._logs(first) == first  # a new connection: told once
    assert target._logs(first) is None
    assert target._logs(changed) == changed
    assert target._logs(None) is None


# -- lanes ------------------------------------------------------------------------------------------
async def test_refresh_connects_the_lanes_of_instances_on_this_node_and_calls_go_over_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    g = group()
    handle(g).answers = [
        [("here", "h", 1, "node-a:/tmp/lane-here.sock"), ("there", "h2", 2, "node-b:/tmp/lane-there.sock")],
        [("plain", "h", 1, ""), ("old", "h", 3)],  # no lane; an answer of three (a replica of an older build)
    ]
    ex = RayModelExecutor(inflight_per_instance=1, channel_token=b"token")
    ex._node = "node-a"
    clients: dict[object, FakeClient] = {}

    async def get(address: object) -> FakeClient:
        return clients.setdefault(address, FakeClient())

    monkeypatch.setattr(ex._pool, "get", get)
    await ex._refresh(g)
    assert sorted(g.targets) == ["here", "old", "plain", "there"]
    assert g.targets["here"].lane is clients["/tmp/lane-here.sock"]
    assert all(g.targets[i].lane is None for i in ("there", "plain", "old"))  # another node's socket: not reachable
    await g.targets["here"].call(EXECUTIONS, None, 30.0)
    assert [type(p) for p in clients["/tmp/lane-here.sock"].payloads] == [ExecuteOn]
    assert clients[("h", 1)].payloads == []  # the channel carried nothing of "here"'s batch


async def test_a_closed_lane_falls_back_to_the_channel_and_is_reconnected_on_refresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lane, channel = FakeClient(), FakeClient()
    t = _Target("i1", client=channel, lane=lane)  # type: ignore[arg-type]
    lane.closed = True
    await t.call(EXECUTIONS, None, 30.0)
    assert channel.payloads and not lane.payloads
    g = group(t)
    handle(g).answers = [[("i1", "h", 1, "node-a:/tmp/lane.sock")]]
    ex = RayModelExecutor(inflight_per_instance=1, channel_token=b"token")
    ex._node = "node-a"
    fresh = FakeClient()

    async def get(address: object) -> FakeClient:
        return fresh

    monkeypatch.setattr(ex._pool, "get", get)
    await ex._refresh(g)
    assert g.targets["i1"] is t and t.lane is fresh
