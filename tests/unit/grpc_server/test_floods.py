"""Floods on one connection end with GOAWAY ENHANCE_YOUR_CALM while a normal client stays served.

Each flood is raw frames on a loopback socket; a grpcio client calls Echo on its own connection from
before the flood until after it, and every one of its calls must be answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from serve_app.grpc_server import flood, frames as f
from tests.unit.grpc_server.h2_support import ECHO, RawClient, Served, message, normal_calls, serve

FLOOD = 3000  # frames: past every bucket's burst


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    served = await serve()
    yield served
    await served.server.stop()


def _pings(client: RawClient) -> None:
    client.writer.write(f.frame(f.PING, 0, 0, b"12345678") * 10)


def _rapid_reset(client: RawClient) -> None:
    for _ in range(FLOOD):
        sid = client.open()
        client.writer.write(f.rst_stream(sid, f.CANCEL))


def _reset_after_body(client: RawClient) -> None:
    for _ in range(FLOOD):
        sid = client.open()
        client.writer.write(f.frame(f.DATA, f.END_STREAM, sid, message(b"x" * 100)) + f.rst_stream(sid, f.CANCEL))


def _empty_continuation(client: RawClient) -> None:
    sid = client.next_id
    client.writer.write(f.frame(f.HEADERS, 0, sid, b"") + f.frame(f.CONTINUATION, 0, sid) * FLOOD)


def _empty_data(client: RawClient) -> None:
    sid = client.open()
    client.writer.write(f.frame(f.DATA, 0, sid) * FLOOD)


def _settings(client: RawClient) -> None:
    client.writer.write(f.settings_frame({f.MAX_FRAME_SIZE: 16384}) * FLOOD)


def _priority(client: RawClient) -> None:
    client.writer.write(f.frame(f.PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10") * FLOOD)


FLOODS: dict[str, tuple[Callable[[RawClient], None], bytes]] = {
    "pings": (_pings, b"too_many_pings"),
    "rapid reset": (_rapid_reset, b"too many streams reset"),
    "reset after the body": (_reset_after_body, b"too many streams reset"),
    "empty CONTINUATION": (_empty_continuation, b"too many CONTINUATION frames"),
    "empty DATA": (_empty_data, b"too many frames without content"),
    "SETTINGS": (_settings, b"too many frames without content"),
    "PRIORITY": (_priority, b"too many frames without content"),
}


@pytest.mark.parametrize("name", FLOODS)
async def test_a_flood_gets_goaway_while_others_are_served(served: Served, name: str) -> None:
    attack, debug = FLOODS[name]
    stop = asyncio.Event()
    normal = asyncio.get_running_loop().create_task(normal_calls(served.port, stop))
    client = await RawClient.connect(served.port)
    attack(client)
    code, data = await asyncio.wait_for(client.goaway(), 60)
    assert (code, data) == (f.ENHANCE_YOUR_CALM, debug)
    stop.set()
    answers = await asyncio.wait_for(normal, 60)
    assert answers and set(answers) == {b"normal"}
    client.close()
    for _ in range(1000):  # the flooder's connection goes; nothing it opened stays
        if len(served.connections) <= 1:
            break
        await asyncio.sleep(0.01)
    assert served.state.budget.parked == 0


async def test_what_a_client_may_do_is_not_a_flood(served: Served) -> None:
    """A ping after each answer (grpc-core's BDP probes), a few SETTINGS, calls cancelled now and then."""
    client = await RawClient.connect(served.port)
    for i in range(20):
        sid = client.call(ECHO, b"%d" % i)
        async for kind, flags, stream, _ in client.frames():
            if kind == f.HEADERS and stream == sid and flags & f.END_STREAM:
                break
        client.writer.write(f.frame(f.PING, 0, 0, b"12345678"))
        if i % 5 == 0:
            client.writer.write(f.settings_frame({}))
            client.writer.write(f.rst_stream(client.open(), f.CANCEL))
    sid = client.call(ECHO, b"last")
    async for kind, flags, stream, headers in client.frames():
        if kind == f.GOAWAY:
            raise AssertionError(f"GOAWAY {headers!r}")
        if kind == f.HEADERS and stream == sid and flags & f.END_STREAM:
            assert headers[b"grpc-status"] == b"0"
            break
    client.close()


def test_ping_strikes_are_grpc_cores() -> None:
    guard = flood.FloodGuard(now=0.0)
    guard.on_ping(0.0)
    for second in range(1, 1 + flood.MAX_PING_STRIKES):
        guard.on_ping(float(second))
    with pytest.raises(flood.Abuse, match="too_many_pings"):
        guard.on_ping(10.0)
    guard = flood.FloodGuard(now=0.0)
    for second in range(100):  # answers sent between pings: no strike
        guard.on_ping(float(second))
        guard.on_sent_data()
    guard.on_ping(1000.0)
    guard.on_ping(1000.0 + flood.PING_INTERVAL_S)  # a keepalive no sooner than grpc-core allows


def test_the_reset_bucket_refills_at_nghttp2s_rate() -> None:
    guard = flood.FloodGuard(now=0.0)
    for _ in range(flood.RESET_BURST):
        guard.on_reset(0.0)
    with pytest.raises(flood.Abuse):
        guard.on_reset(0.0)
    guard = flood.FloodGuard(now=0.0)
    for i in range(flood.RESET_BURST + 10 * int(flood.RESET_RATE)):  # then resets at half the rate: allowed
        guard.on_reset(max(0, i - flood.RESET_BURST + 1) * 2 / flood.RESET_RATE)


def test_acknowledgements_of_a_client_that_does_not_read_are_bounded() -> None:
    guard = flood.FloodGuard(now=0.0)
    for _ in range(10 * flood.MAX_QUEUED_ACKS):  # the socket takes them: no bound
        guard.on_ack(socket_backed_up=False)
    for _ in range(flood.MAX_QUEUED_ACKS):
        guard.on_ack(socket_backed_up=True)
    with pytest.raises(flood.Abuse, match="acknowledgements"):
        guard.on_ack(socket_backed_up=True)


def test_the_send_budget() -> None:
    budget = flood.SendBudget(per_connection=10, total=15)
    assert budget.admits(0, 100)  # alone: one answer larger than a cap still waits for its client
    budget.parked = 8
    assert budget.admits(8, 2) and not budget.admits(8, 3)
    assert budget.admits(0, 7) and not budget.admits(0, 8)
