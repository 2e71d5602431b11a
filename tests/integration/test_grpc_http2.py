"""The HTTP/2 layer of the gRPC server against grpcio's own client, with handlers of the test's.

What the servicer tests cannot show: deadlines and cancellation reach the handler, responses larger than
the peer's flow-control window, compressed and oversized requests, metadata, streams, and a graceful stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
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

    async def echo(self, request: bytes, context: CallContext) -> bytes:
        return request

    async def metadata(self, request: bytes, context: CallContext) -> bytes:
        return repr(sorted(context.invocation_metadata())).encode()

    async def big(self, request: bytes, context: CallContext) -> bytes:
        return bytes(range(256)) * (int(request) // 256)

    async def slow(self, request: bytes, context: CallContext) -> bytes:
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


@pytest.fixture
async def served() -> AsyncIterator[tuple[Handlers, grpc.aio.Channel, GrpcServer]]:
    handlers = Handlers()
    state = ServerState(_table(handlers), MAX_BYTES, None)
    port = free_port()
    connections: set[GrpcConnection] = set()
    sock = listening_socket("127.0.0.1", port)
    server = await asyncio.get_running_loop().create_server(lambda: GrpcConnection(state, connections), sock=sock)
    grpc_server = GrpcServer(server, connections)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield handlers, channel, grpc_server
    await grpc_server.stop()


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
