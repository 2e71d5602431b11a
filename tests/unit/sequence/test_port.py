"""The gateway's channel port to the sequence router: state backups batched per event-loop turn into one
StateBackups message, and RouterClient.post (fire and forget, dropped when the router can't be reached)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import numpy as np
import pytest

from serve_app.sequence.messages import StateBackup, StateBackups
from serve_app.sequence.port import ChannelSequencePort
from serve_app.transport import ChannelServer
from serve_app.transport.channel import ChannelBroken
from serve_app.transport.pool import ChannelPool
from serve_app.transport.router_client import RouterClient

TOKEN = b"0123456789abcdef"
Address = tuple[str, int]


def backup(corr: int, no: int) -> StateBackup:
    return StateBackup(corr, 0, 1, {"STATE": np.array([no], dtype=np.int32)}, instance="A", no=no)


class FakeRouterClient:
    """Records what the port posts."""

    def __init__(self) -> None:
        self.posts: list[Any] = []

    def post(self, message: Any) -> None:
        self.posts.append(message)


def port(key: str = "m:1") -> tuple[ChannelSequencePort, FakeRouterClient]:
    link = FakeRouterClient()
    return ChannelSequencePort(key, link, ChannelPool(TOKEN)), link  # type: ignore[arg-type]


def posted(link: FakeRouterClient) -> list[tuple[str, list[tuple[int, int]]]]:
    out = []
    for message in link.posts:
        assert isinstance(message, StateBackups)
        assert isinstance(message.backups, tuple)
        out.append((message.model, [(b.corr_id, b.no) for b in message.backups]))
    return out


async def turn() -> None:
    """Let the callbacks scheduled so far run."""
    await asyncio.sleep(0)


# --------------------------------------------------------------------------- ChannelSequencePort.backup


async def test_backups_of_one_turn_travel_as_one_message() -> None:
    p, link = port()
    backups = [backup(7, 1), backup(8, 1), backup(7, 2)]
    for b in backups:
        p.backup(b)
    assert link.posts == []  # nothing is sent while the turn goes on
    await turn()
    assert posted(link) == [("m:1", [(7, 1), (8, 1), (7, 2)])]
    assert all(x is y for x, y in zip(link.posts[0].backups, backups, strict=True))  # as passed, in order
    await turn()
    assert len(link.posts) == 1  # nothing more to send


async def test_backups_of_later_turns_travel_apart() -> None:
    p, link = port()
    p.backup(backup(7, 1))
    await turn()
    p.backup(backup(7, 2))
    p.backup(backup(7, 3))
    await turn()
    p.backup(backup(7, 4))
    await turn()
    assert posted(link) == [("m:1", [(7, 1)]), ("m:1", [(7, 2), (7, 3)]), ("m:1", [(7, 4)])]


async def test_backups_of_steps_answered_together_travel_together() -> None:
    p, link = port()
    answered = asyncio.Event()

    async def step(corr: int) -> None:
        await answered.wait()
        p.backup(backup(corr, 1))

    tasks = [asyncio.create_task(step(corr)) for corr in (1, 2, 3)]
    await turn()
    answered.set()  # the three steps resume in one turn
    await asyncio.gather(*tasks)
    await turn()
    assert posted(link) == [("m:1", [(1, 1), (2, 1), (3, 1)])]


async def test_each_model_version_posts_its_own() -> None:
    link = FakeRouterClient()
    a = ChannelSequencePort("a:1", link, ChannelPool(TOKEN))  # type: ignore[arg-type]
    b = ChannelSequencePort("b:2", link, ChannelPool(TOKEN))  # type: ignore[arg-type]
    a.backup(backup(7, 1))
    b.backup(backup(8, 1))
    a.backup(backup(9, 1))
    await turn()
    assert sorted(posted(link)) == [("a:1", [(7, 1), (9, 1)]), ("b:2", [(8, 1)])]


# --------------------------------------------------------------------------- RouterClient.post over fakes


class FakeClient:
    """A connection to the router; ``answer``: the router answers each message on the next turn."""

    def __init__(self, broken: bool = False) -> None:
        self.sent: list[Any] = []
        self.futures: list[asyncio.Future[Any]] = []
        self.broken = broken
        self.answer = True
        self.closed = False

    def post(self, message: Any) -> None:
        """One-way: no answer comes back."""
        if self.broken:
            raise ChannelBroken("the channel is closed")
        self.sent.append(message)

    def send(self, message: Any) -> asyncio.Future[Any]:
        if self.broken:
            raise ChannelBroken("the channel is closed")
        self.sent.append(message)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        if self.answer:
            asyncio.get_running_loop().call_soon(future.set_result, None)
        return future


class FakePool:
    """``clients``: who answers at each address (none: it can't be reached)."""

    def __init__(self, clients: dict[Address, FakeClient]) -> None:
        self.clients = clients
        self.open: set[Address] = set()
        self.gets: list[Address] = []

    async def get(self, address: Address) -> FakeClient:
        self.gets.append(address)
        await asyncio.sleep(0)
        client = self.clients.get(address)
        if client is None:
            raise ChannelBroken(f"cannot reach {address[0]}:{address[1]}")
        self.open.add(address)
        return client

    def peek(self, address: Address) -> FakeClient | None:
        client = self.clients.get(address) if address in self.open else None
        return client if client is not None and not client.closed else None


class Resolver:
    """The router's address as Serve gives it: ``answers`` in turn (an exception is raised), the last repeated."""

    def __init__(self, *answers: Address | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def __call__(self) -> Address:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        await asyncio.sleep(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def settle(link: RouterClient) -> None:
    for _ in range(20):
        await asyncio.sleep(0)
    assert not link._posts  # every post in the background is done


def link_over(pool: FakePool, resolve: Resolver) -> RouterClient:
    return RouterClient(resolve, pool)  # type: ignore[arg-type]


async def test_post_is_dropped_when_the_router_cannot_be_found(caplog: pytest.LogCaptureFixture) -> None:
    pool = FakePool({})
    resolve = Resolver(RuntimeError("no sequence router is running"))
    link = link_over(pool, resolve)
    link.post("backups")  # neither raises nor waits
    await settle(link)
    assert resolve.calls == 1 and pool.gets == []
    assert "Task exception was never retrieved" not in caplog.text


async def test_post_is_dropped_when_the_router_cannot_be_reached(caplog: pytest.LogCaptureFixture) -> None:
    pool = FakePool({})
    link = link_over(pool, Resolver(("r", 1)))
    link.post("backups")
    await settle(link)
    assert pool.gets == [("r", 1)]
    assert "Task exception was never retrieved" not in caplog.text


async def test_post_connects_then_sends_on_the_open_connection() -> None:
    client = FakeClient()
    pool = FakePool({("r", 1): client})
    resolve = Resolver(("r", 1))
    link = link_over(pool, resolve)
    link.post("first")
    assert client.sent == []  # connecting happens in the background
    await settle(link)
    assert client.sent == ["first"]
    link.post("second")
    assert client.sent == ["first", "second"]  # the connection is open: sent at once
    assert resolve.calls == 1 and pool.gets == [("r", 1)]


async def test_post_on_a_connection_that_breaks_is_dropped_and_the_router_found_again() -> None:
    old, new = FakeClient(), FakeClient()
    pool = FakePool({("r", 1): old, ("r", 2): new})
    resolve = Resolver(("r", 1), ("r", 2))
    link = link_over(pool, resolve)
    link.post("first")
    await settle(link)
    old.broken = True  # the router restarted: writing on its connection fails
    link.post("lost")  # dropped, not raised
    link.post("found")
    await settle(link)
    assert old.sent == ["first"] and new.sent == ["found"]
    assert resolve.calls == 2


async def test_post_after_a_failed_connection_finds_the_router_again() -> None:
    new = FakeClient()
    pool = FakePool({("r", 2): new})  # the router at r:1 is gone (restarted at r:2)
    resolve = Resolver(("r", 1), ("r", 2))
    link = link_over(pool, resolve)
    link.post("lost")  # r:1 can't be reached: dropped
    await settle(link)
    link.post("found")
    await settle(link)
    assert new.sent == ["found"]


# --------------------------------------------------------------------------- RouterClient.post over a real channel


async def test_post_reaches_a_real_router_in_order_with_calls() -> None:
    received: list[Any] = []

    async def handler(message: Any) -> Any:
        received.append(message)
        return ("answer", message)

    server = ChannelServer(handler, TOKEN, oneway=received.append)
    address = await server.start("127.0.0.1")
    pool = ChannelPool(TOKEN)

    async def resolve() -> Address:
        return address

    link = RouterClient(resolve, pool)
    try:
        first = StateBackups("m:1", (backup(7, 1),))
        link.post(first)
        for _ in range(200):
            if received:
                break
            await asyncio.sleep(0.005)
        second = StateBackups("m:1", (backup(7, 2), backup(8, 1)))
        link.post(second)  # on the open connection, ahead of the call
        assert await asyncio.wait_for(link.call("lookup"), 5) == ("answer", "lookup")
        assert [type(m).__name__ for m in received] == ["StateBackups", "StateBackups", "str"]
        assert [(b.corr_id, b.no) for m in received[:2] for b in m.backups] == [(7, 1), (7, 2), (8, 1)]
        assert received[1].backups[0].states["STATE"].tolist() == [2]
    finally:
        pool.close()
        server.close()


async def test_post_to_a_closed_port_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        address = sock.getsockname()

    async def resolve() -> Address:
        return address

    pool = ChannelPool(TOKEN)
    link = RouterClient(resolve, pool)
    link.post(StateBackups("m:1", (backup(7, 1),)))
    for _ in range(200):
        if not link._posts:
            break
        await asyncio.sleep(0.005)
    assert not link._posts
    assert pool.peek(address) is None
    assert "Task exception was never retrieved" not in caplog.text
    pool.close()
