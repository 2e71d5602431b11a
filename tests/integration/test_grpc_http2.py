"""The HTTP/2 layer of the gRPC server against grpcio's own client, with handlers of the test's.

What the servicer tests cannot show: deadlines and cancellation reach the handler, responses larger than
the peer's flow-control window, compressed and oversized requests, metadata, streams, and a graceful stop.
The frames grpcio's client never sends (padding, CONTINUATION, a tiny window, broken frames) come from the
``h2`` library's client state machine over a plain socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from serve_app.errors import NotFound
from serve_app.grpc_server.calls import CallContext, GrpcAbort
from serve_app.grpc_server.http2 import GrpcConnection, Method, ServerState
from serve_app.grpc_server.server import GrpcServer, listening_socket
from tests.support.net import free_port

MAX_BYTES = 1 << 20


def _same(data: bytes) -> bytes:
    return data


class Handlers:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()
        self.waiting = 0  # calls of Slow that wait for release

    async def echo(self, request: bytes, context: CallContext) -> bytes:
        return request

    async def metadata(self, request: bytes, context: CallContext) -> bytes:
        return repr(sorted(context.invocation_metadata())).encode()

    async def big(self, request: bytes, context: CallContext) -> bytes:
        return bytes(range(256)) * (int(request) // 256)

    async def slow(self, request: bytes, context: CallContext) -> bytes:
        self.waiting += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b"done"

    async def fail(self, request: bytes, context: CallContext) -> bytes:
        if request == b"abort":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "état: 100% wrong")
        raise NotFound("no such thing")

    async def stream(self, requests: AsyncIterator[bytes], context: CallContext) -> AsyncIterator[bytes]:
        async for request in requests:
            if request == b"stop":
                raise GrpcAbort(grpc.StatusCode.ABORTED, "stopped")
            yield request.upper()


def _table(h: Handlers) -> dict[bytes, Method]:
    unary: dict[str, Callable[[bytes, CallContext], Awaitable[bytes]]] = {
        "Echo": h.echo, "Metadata": h.metadata, "Big": h.big, "Slow": h.slow, "Fail": h.fail,
    }  # fmt: skip
    table = {f"/t.T/{n}".encode(): Method(n, _same, _same, fn, False) for n, fn in unary.items()}
    table[b"/t.T/Stream"] = Method("Stream", _same, _same, h.stream, True)
    return table


class CountedConnection(GrpcConnection):
    """A connection that counts its writes to the socket."""

    writes = 0

    def _flush(self) -> None:
        if self._out and self.transport is not None:
            CountedConnection.writes += 1
        super()._flush()


@pytest.fixture
async def server() -> AsyncIterator[tuple[Handlers, int, GrpcServer]]:
    handlers = Handlers()
    state = ServerState(_table(handlers), MAX_BYTES, None)
    port = free_port()
    connections: set[GrpcConnection] = set()
    sock = listening_socket("127.0.0.1", port)
    listening = await asyncio.get_running_loop().create_server(lambda: CountedConnection(state, connections), sock=sock)
    grpc_server = GrpcServer(listening, connections)
    yield handlers, port, grpc_server
    await grpc_server.stop()


@pytest.fixture
async def served(
    server: tuple[Handlers, int, GrpcServer],
) -> AsyncIterator[tuple[Handlers, grpc.aio.Channel, GrpcServer]]:
    handlers, port, grpc_server = server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield handlers, channel, grpc_server


def _unary(channel: grpc.aio.Channel, name: str) -> Any:
    return channel.unary_unary(f"/t.T/{name}", request_serializer=_same, response_deserializer=_same)


async def test_unary_calls_many_at_once(served: tuple[Handlers, grpc.aio.Channel, GrpcServer]) -> None:
    _, channel, _ = served
    echo = _unary(channel, "Echo")
    answers = await asyncio.gather(*(echo(str(i).encode()) for i in range(300)))
    assert answers == [str(i).encode() for i in range(300)]
    assert await echo(b"") == b""


async def test_metadata_reaches_the_handler(served: tuple[Handlers, grpc.aio.Channel, GrpcServer]) -> None:
    _, channel, _ = served
    answer = await _unary(channel, "Metadata")(b"", metadata=(("traceparent", "00-1"), ("key-bin", b"\x00\xff")))
    assert answer == repr(sorted([("key-bin", b"\x00\xff"), ("traceparent", "00-1")])).encode()


async def test_a_response_larger_than_the_flow_control_window(
    served: tuple[Handlers, grpc.aio.Channel, GrpcServer],
) -> None:
    _, channel, _ = served
    size = 3 * MAX_BYTES  # under the client's 4 MiB limit, over its flow-control window
    answer = await _unary(channel, "Big")(str(size).encode())
    assert answer == bytes(range(256)) * (size // 256)


async def test_compressed_and_oversized_requests(served: tuple[Handlers, grpc.aio.Channel, GrpcServer]) -> None:
    _, channel, _ = served
    echo = _unary(channel, "Echo")
    payload = b"abc" * 100_000
    assert await echo(payload, compression=grpc.Compression.Gzip) == payload
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await echo(b"x" * (MAX_BYTES + 1))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in (info.value.details() or "")
    assert await echo(b"still serving") == b"still serving"


async def test_errors_become_statuses(served: tuple[Handlers, grpc.aio.Channel, GrpcServer]) -> None:
    _, channel, _ = served
    fail = _unary(channel, "Fail")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await fail(b"abort")
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION, "état: 100% wrong")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await fail(b"")
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.NOT_FOUND, "no such thing")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _unary(channel, "Nothing")(b"")
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_deadline_cancels_the_handler(served: tuple[Handlers, grpc.aio.Channel, GrpcServer]) -> None:
    handlers, channel, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _unary(channel, "Slow")(b"", timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(handlers.cancelled.wait(), 30)


async def test_client_cancel_reaches_the_handler(served: tuple[Handlers, grpc.aio.Channel, GrpcServer]) -> None:
    handlers, channel, _ = served
    call = _unary(channel, "Slow")(b"")
    await asyncio.sleep(0.2)
    call.cancel()
    await asyncio.wait_for(handlers.cancelled.wait(), 30)
    assert await _unary(channel, "Echo")(b"after") == b"after"


async def test_bidirectional_stream(served: tuple[Handlers, grpc.aio.Channel, GrpcServer]) -> None:
    _, channel, _ = served
    stream = channel.stream_stream("/t.T/Stream", request_serializer=_same, response_deserializer=_same)
    call = stream()
    for word in (b"one", b"two", b"three"):
        await call.write(word)
        assert await call.read() == word.upper()
    await call.write(b"stop")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.ABORTED
    call = stream()
    await call.write(b"x")
    await call.done_writing()
    assert [m async for m in call] == [b"X"]
    assert await call.code() == grpc.StatusCode.OK


async def test_stop_lets_calls_under_way_finish(served: tuple[Handlers, grpc.aio.Channel, GrpcServer]) -> None:
    handlers, channel, server = served
    call = _unary(channel, "Slow")(b"")
    await asyncio.sleep(0.2)
    stopping = asyncio.get_running_loop().create_task(server.stop(grace=30))
    await asyncio.sleep(0.1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _unary(channel, "Echo")(b"refused while stopping")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    handlers.release.set()
    assert await call == b"done"
    await stopping


# ------------------------------------------------------------------------------------------ raw frames


class RawClient:
    """An HTTP/2 client connection of the ``h2`` library over a socket, for frames grpcio never sends."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, window: int | None) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        if window is not None:
            self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.send()
        self.events: list[h2.events.Event] = []

    @classmethod
    async def connect(cls, port: int, window: int | None = None) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, window)

    def send(self) -> None:
        self.writer.write(self.h2.data_to_send())

    def call(
        self, name: str, message: bytes, *, extra: tuple[tuple[str, str], ...] = (), pad: int | None = None
    ) -> int:
        sid = self.h2.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "http"), (":path", f"/t.T/{name}"), (":authority", "x"),
                   ("content-type", "application/grpc"), ("te", "trailers"), *extra]  # fmt: skip
        self.h2.send_headers(sid, headers)
        self.h2.send_data(sid, b"\x00" + len(message).to_bytes(4, "big") + message, end_stream=True, pad_length=pad)
        self.send()
        return sid

    async def until(self, done: Any) -> list[h2.events.Event]:
        while not done(self.events):
            data = await asyncio.wait_for(self.reader.read(65536), 30)
            if not data:
                break
            for event in self.h2.receive_data(data):
                self.events.append(event)
                if isinstance(event, h2.events.DataReceived):
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            self.send()
        return self.events

    def body_and_status(self, sid: int) -> tuple[bytes, bytes]:
        body = b"".join(e.data for e in self.events if isinstance(e, h2.events.DataReceived) and e.stream_id == sid)
        trailers = [e for e in self.events if isinstance(e, h2.events.TrailersReceived) and e.stream_id == sid]
        return body[5:], dict(trailers[-1].headers)[b"grpc-status"] if trailers else b""

    def close(self) -> None:
        self.writer.close()


def _ended(sid: int) -> Any:
    return lambda events: any(isinstance(e, h2.events.StreamEnded) and e.stream_id == sid for e in events)


async def test_ping_padding_and_continuation(server: tuple[Handlers, int, GrpcServer]) -> None:
    _, port, _ = server
    client = await RawClient.connect(port)
    client.h2.ping(b"12345678")
    client.send()
    await client.until(lambda events: any(isinstance(e, h2.events.PingAckReceived) for e in events))
    sid = client.call("Echo", b"padded", pad=20)
    await client.until(_ended(sid))
    assert client.body_and_status(sid) == (b"padded", b"0")
    big = "v" * 40_000  # a header block over one frame: HEADERS then CONTINUATION
    sid = client.call("Metadata", b"", extra=(("x-big", big),))
    await client.until(_ended(sid))
    body, status = client.body_and_status(sid)
    assert status == b"0" and big.encode() in body
    client.close()


async def test_a_response_waits_for_a_small_client_window(server: tuple[Handlers, int, GrpcServer]) -> None:
    _, port, _ = server
    client = await RawClient.connect(port, window=100)
    sid = client.call("Big", b"5120")
    await client.until(_ended(sid))
    assert client.body_and_status(sid) == (bytes(range(256)) * 20, b"0")
    client.close()


async def test_answers_ready_in_one_loop_turn_leave_in_one_write(server: tuple[Handlers, int, GrpcServer]) -> None:
    handlers, port, _ = server
    client = await RawClient.connect(port)
    sids = [client.call("Slow", str(i).encode()) for i in range(5)]
    while handlers.waiting < len(sids):
        await asyncio.sleep(0.01)
    before = CountedConnection.writes
    handlers.release.set()  # the five calls end in the same loop turn, as a batch's requests do
    await client.until(lambda events: all(_ended(sid)(events) for sid in sids))
    assert [client.body_and_status(sid) for sid in sids] == [(b"done", b"0")] * len(sids)
    assert CountedConnection.writes - before == 1
    sid = client.call("Echo", b"alone")  # the connection's only call: written at once
    await client.until(_ended(sid))
    assert client.body_and_status(sid) == (b"alone", b"0")
    client.close()


async def test_broken_frames_end_the_connection_with_goaway(server: tuple[Handlers, int, GrpcServer]) -> None:
    _, port, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 30)  # our SETTINGS, a GOAWAY, then the end of the connection
    kinds = []
    while answer:
        kinds.append(answer[3])
        answer = answer[9 + int.from_bytes(answer[:3], "big") :]
    assert kinds[-1] == 7
    writer.close()
    client = await RawClient.connect(port)
    client.writer.write(b"\x00\x00\x01\x00\x00\x00\x00\x00\x09x")  # DATA on a stream never opened
    events = await client.until(lambda events: any(isinstance(e, h2.events.ConnectionTerminated) for e in events))
    terminated = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    assert terminated and terminated[0].error_code == 1  # PROTOCOL_ERROR
    client.close()
