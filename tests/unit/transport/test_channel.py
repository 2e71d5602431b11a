"""The direct gateway-to-instance channel: framing, authentication, concurrency, failure (no Ray)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import numpy as np
import pytest

from serve_app.errors import ResourceExhausted, Unavailable
from serve_app.inference.cancel import CancelSignal
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.transport import ChannelClient, ChannelServer, channel, handshake
from serve_app.transport.channel import encode, read_message
from serve_app.transport.pool import ChannelPool
from tests.support.net import free_port

TOKEN = b"0123456789abcdef"


async def echo(payload: Any) -> Any:
    return payload


async def start(handler: Any) -> tuple[ChannelServer, tuple[str, int]]:
    server = ChannelServer(handler, TOKEN)
    return server, await server.start("127.0.0.1")


async def test_frames_round_trip_arrays_out_of_band() -> None:
    reader = asyncio.StreamReader()
    big = np.arange(12, dtype=np.float32).reshape(3, 4)
    strided = np.arange(20, dtype=np.int64)[::2]  # not contiguous: travels in band
    frames = encode((7, {"a": big, "b": strided, "s": np.array([b"x", b"yz"], dtype=object)}))
    assert len(frames) == 3  # head, pickle, one out-of-band buffer (big)
    for f in frames:
        reader.feed_data(bytes(f))
    call_id, payload = await read_message(reader)
    assert call_id == 7
    np.testing.assert_array_equal(payload["a"], big)
    assert not payload["a"].flags.writeable  # a zero-copy view of the received bytes
    np.testing.assert_array_equal(payload["b"], strided)
    assert list(payload["s"]) == [b"x", b"yz"]


async def test_executions_round_trip() -> None:
    async def handler(executions: list[Execution]) -> list[ExecutionResult]:
        return [ExecutionResult(outputs={"OUT": e.inputs["IN"] * 2}, compute_infer_ns=5) for e in executions]

    server, addr = await start(handler)
    client = ChannelClient(addr)
    await client.connect(TOKEN)
    x = np.ones((2, 3), np.float32)
    results = await client.call([Execution({"IN": x}, ("OUT",), 2), Execution({"IN": x + 1}, ("OUT",), 2)])
    np.testing.assert_array_equal(results[0].outputs["OUT"], x * 2)
    np.testing.assert_array_equal(results[1].outputs["OUT"], (x + 1) * 2)
    assert results[0].compute_infer_ns == 5
    client.close()
    server.close()


async def test_concurrent_calls_are_answered_by_id() -> None:
    async def handler(payload: tuple[float, str]) -> str:
        delay, tag = payload
        await asyncio.sleep(delay)
        return tag

    server, addr = await start(handler)
    client = ChannelClient(addr)
    await client.connect(TOKEN)
    slow = asyncio.ensure_future(client.call((0.2, "slow")))
    fast = asyncio.ensure_future(client.call((0.0, "fast")))
    assert await fast == "fast"
    assert not slow.done()  # answers come back out of order
    assert await slow == "slow"
    assert client.inflight == 0
    client.close()
    server.close()


async def test_a_call_past_its_timeout_fails_and_its_late_answer_is_dropped() -> None:
    release = asyncio.Event()

    async def handler(payload: str) -> str:
        if payload == "slow":
            await release.wait()
        return payload

    server, addr = await start(handler)
    client = ChannelClient(addr)
    await client.connect(TOKEN)
    with pytest.raises(asyncio.TimeoutError):
        await client.send("slow", 0.05)
    assert client.inflight == 0
    release.set()
    assert await client.send("next", 5.0) == "next"  # the slow call's answer came first, for no one
    assert client.inflight == 0
    client.close()
    server.close()


async def test_wrong_token_is_dropped() -> None:
    async def handler(payload: Any) -> Any:
        return payload

    server, addr = await start(handler)
    client = ChannelClient(addr)
    with pytest.raises(Unavailable, match="failed the handshake"):
        await client.connect(b"wrong-token-0000")
    assert client._writer is None  # nothing could be sent
    server.close()


async def test_lost_connection_fails_pending_calls() -> None:
    started = asyncio.Event()

    async def handler(payload: Any) -> Any:
        started.set()
        await asyncio.sleep(30)
        return payload

    server, addr = await start(handler)
    client = ChannelClient(addr)
    await client.connect(TOKEN)
    call = asyncio.ensure_future(client.call("never answered"))
    await started.wait()
    client._writer.transport.abort()  # type: ignore[union-attr]  # the connection drops, as when a replica dies
    with pytest.raises(Unavailable, match="unavailable") as lost:
        await asyncio.wait_for(call, timeout=5)
    with pytest.raises(Unavailable, match="closed") as closed:
        await client.call("after")
    for err in (lost.value, closed.value):  # a client reads these in a 503: no address, no port
        assert addr[0] not in err.message and str(addr[1]) not in err.message, err.message
    server.close()


async def test_an_unreachable_peer_is_reported_without_its_address() -> None:
    host, port = "127.0.0.1", free_port()  # nothing listens there
    with pytest.raises(Unavailable, match="cannot reach the channel's peer") as err:
        await ChannelPool(TOKEN).get((host, port))
    assert host not in err.value.message and str(port) not in err.value.message, err.value.message


async def test_one_way_messages_reach_the_one_way_handler_in_order_with_calls() -> None:
    seen: list[Any] = []

    async def handler(message: Any) -> Any:
        seen.append(("call", message))
        return message

    def oneway(message: Any) -> None:
        if message == "boom":
            raise RuntimeError("a one-way handler failed")
        seen.append(("post", message))

    server = ChannelServer(handler, TOKEN, oneway=oneway)
    address = await server.start("127.0.0.1")
    client = ChannelClient(address)
    await client.connect(TOKEN)
    try:
        client.post("a")
        client.post("boom")  # logged; the connection stays up
        client.post({"b": np.arange(3)})
        assert await asyncio.wait_for(client.call("c"), 5) == "c"
        assert [kind for kind, _ in seen] == ["post", "post", "call"]
        assert seen[0] == ("post", "a") and seen[1][1]["b"].tolist() == [0, 1, 2]
        assert client.inflight == 0  # nothing waits for an answer to a post
    finally:
        client.close()
        server.close()


async def test_one_way_message_without_a_handler_is_ignored() -> None:
    async def handler(message: Any) -> Any:
        return message

    server = ChannelServer(handler, TOKEN)
    address = await server.start("127.0.0.1")
    client = ChannelClient(address)
    await client.connect(TOKEN)
    try:
        client.post("ignored")
        assert await asyncio.wait_for(client.call("still served"), 5) == "still served"
    finally:
        client.close()
        server.close()


# -- streams ------------------------------------------------------------------------------------------
async def test_a_stream_delivers_each_item_as_it_is_produced_then_ends() -> None:
    produced = asyncio.Event()

    async def handler(n: int) -> Any:
        async def items() -> Any:
            for i in range(n):
                yield {"i": i, "data": np.full(3, i, np.int32)}
                if i == 0:
                    await produced.wait()  # the second item waits until the first was read

        return items()

    server, addr = await start(handler)
    client = ChannelClient(addr)
    await client.connect(TOKEN)
    got = []
    async for item in client.stream(3):
        got.append(item["i"])
        produced.set()
    assert got == [0, 1, 2] and client.inflight == 0
    assert await client.call(0) is None  # an empty stream answered as a call: nothing
    client.close()
    server.close()


async def test_a_stream_that_fails_raises_after_its_items_and_the_connection_stays_up() -> None:
    async def handler(payload: str) -> Any:
        if payload == "plain":
            return "fine"

        async def items() -> Any:
            yield 1
            raise Unavailable("model gave up")

        return items()

    server, addr = await start(handler)
    client = ChannelClient(addr)
    await client.connect(TOKEN)
    got = []
    with pytest.raises(Unavailable, match="model gave up"):
        async for item in client.stream("s"):
            got.append(item)
    assert got == [1] and await client.call("plain") == "fine"
    client.close()
    server.close()


async def test_leaving_a_stream_early_stops_its_producer() -> None:
    stopped = asyncio.Event()

    async def handler(payload: None) -> Any:
        async def items() -> Any:
            try:
                i = 0
                while True:
                    yield i
                    i += 1
                    await asyncio.sleep(0.001)
            finally:
                stopped.set()

        return items()

    server, addr = await start(handler)
    client = ChannelClient(addr)
    await client.connect(TOKEN)
    stream = client.stream(None)
    async for item in stream:
        if item == 2:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(stopped.wait(), 5)
    client.close()
    server.close()


async def test_a_broken_connection_ends_a_stream_with_an_error() -> None:
    async def handler(payload: None) -> Any:
        async def items() -> Any:
            yield 1
            await asyncio.sleep(30)
            yield 2

        return items()

    server, addr = await start(handler)
    client = ChannelClient(addr)
    await client.connect(TOKEN)
    with pytest.raises(Unavailable):
        async for _ in client.stream(None):
            client._fail("test")
    server.close()


async def test_a_server_that_cannot_prove_the_key_gets_no_call() -> None:
    """A process listening where an instance was, without the key: the client sends nothing but its
    handshake response and loads nothing."""
    received = bytearray()
    done = asyncio.Event()

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(handshake.hello(handshake.new_nonce()))
        received.extend(await reader.readexactly(handshake.RESPONSE_BYTES))
        writer.write(bytes(handshake.PROOF_BYTES))  # a proof it can't compute
        received.extend(await reader.read())  # until the client closes
        done.set()

    fake = await asyncio.start_server(impostor, "127.0.0.1", 0)
    port = fake.sockets[0].getsockname()[1]
    client = ChannelClient(("127.0.0.1", port))
    with pytest.raises(Unavailable, match="could not prove") as err:
        await client.connect(TOKEN)
    assert "127.0.0.1" not in err.value.message
    await asyncio.wait_for(done.wait(), timeout=30)
    assert len(received) == handshake.RESPONSE_BYTES and TOKEN not in received
    fake.close()


async def test_a_peer_that_does_not_answer_the_challenge_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel, "HANDSHAKE_TIMEOUT_S", 0.2)
    server, (host, port) = await start(echo)
    reader, writer = await asyncio.open_connection(host, port)
    assert (await reader.readexactly(handshake.HELLO_BYTES)).startswith(handshake.MAGIC)
    assert await asyncio.wait_for(reader.read(), timeout=30) == b""  # closed by the server, nothing sent
    writer.close()
    server.close()


async def test_a_wrong_answer_is_closed_at_once() -> None:
    server, (host, port) = await start(echo)
    reader, writer = await asyncio.open_connection(host, port)
    await reader.readexactly(handshake.HELLO_BYTES)
    writer.write(bytes(handshake.RESPONSE_BYTES))
    assert await asyncio.wait_for(reader.read(), timeout=30) == b""
    writer.close()
    server.close()


async def test_unauthenticated_connections_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel, "MAX_UNAUTHENTICATED", 2)
    server, (host, port) = await start(echo)
    silent = [await asyncio.open_connection(host, port) for _ in range(2)]
    for reader, _ in silent:  # each got its challenge and holds its place
        await reader.readexactly(handshake.HELLO_BYTES)
    reader, writer = await asyncio.open_connection(host, port)
    assert await asyncio.wait_for(reader.read(), timeout=30) == b""  # the third is closed without a challenge
    writer.close()
    for _, w in silent:
        w.close()
    client = ChannelClient((host, port))  # the silent ones gone, a real client gets in
    for _ in range(200):
        if server.unauthenticated == 0:
            break
        await asyncio.sleep(0.05)
    await client.connect(TOKEN)
    assert await client.call("hi") == "hi"
    client.close()
    server.close()


async def test_a_frame_over_the_limit_is_refused_before_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel, "MAX_FRAME_BYTES", 1024)
    reader = asyncio.StreamReader()
    reader.feed_data(channel._HEAD.pack(2000, 0))  # announces 2000 bytes; none follow
    with pytest.raises(channel.FrameTooLarge):
        await read_message(reader)
    with pytest.raises(ResourceExhausted):
        encode(("x" * 2000,))


async def test_a_call_over_the_limit_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    server, addr = await start(echo)
    client = ChannelClient(addr)
    await client.connect(TOKEN)
    monkeypatch.setattr(channel, "MAX_FRAME_BYTES", 4096)
    with pytest.raises(ResourceExhausted):
        await client.call(b"x" * 8192)
    assert await client.call(b"small") == b"small" and not client.closed
    client.close()
    server.close()


class _Cancellable:
    """A stream payload with cancel signals (as a decoupled execution's requests have)."""

    def __init__(self, count: int) -> None:
        self.signals = tuple(CancelSignal() for _ in range(count))

    def cancel_signals(self) -> tuple[CancelSignal, ...]:
        return self.signals


async def test_a_payloads_cancel_signal_reaches_the_server_and_the_stream_goes_on() -> None:
    fired: asyncio.Queue[int] = asyncio.Queue()

    async def handler(payload: Any) -> Any:
        if not isinstance(payload, _Cancellable):
            return payload
        for n, signal in enumerate(payload.signals):
            signal.listen(functools.partial(fired.put_nowait, n))

        async def items() -> Any:
            yield "first"
            yield f"cancelled {await fired.get()}"  # the stream answers after the cancel, as a model does
            yield "final"

        return items()

    server, addr = await start(handler)
    client = ChannelClient(addr)
    await client.connect(TOKEN)
    payload = _Cancellable(2)
    got = []
    async for item in client.stream(payload):
        got.append(item)
        if item == "first":
            payload.signals[1].fire()  # from the caller's side: only the second request
    assert got == ["first", "cancelled 1", "final"] and fired.empty()
    payload.signals[0].fire()  # after the stream ended: nothing is sent, nothing fails
    assert await client.call("still up") == "still up"
    client.close()
    server.close()


async def test_a_calls_cancel_signal_reaches_the_server_while_the_call_runs() -> None:
    """A non-decoupled execution's requests: a caller that goes away fires its signal on the instance's side."""
    fired: asyncio.Queue[int] = asyncio.Queue()
    running = asyncio.Event()

    async def handler(payload: Any) -> Any:
        if not isinstance(payload, _Cancellable):
            return payload
        for n, signal in enumerate(payload.signals):
            signal.listen(functools.partial(fired.put_nowait, n))
        running.set()
        return f"cancelled {await fired.get()}"  # answers once the cancel came, as a model that checks does

    server, addr = await start(handler)
    client = ChannelClient(addr)
    await client.connect(TOKEN)
    payload = _Cancellable(3)
    answer = asyncio.ensure_future(client.call(payload))
    await running.wait()  # the call runs on the server's side
    payload.signals[2].fire()
    assert await answer == "cancelled 2"
    payload.signals[0].fire()  # after the answer: nothing is sent, nothing fails
    assert await client.call("still up") == "still up"
    client.close()
    server.close()
