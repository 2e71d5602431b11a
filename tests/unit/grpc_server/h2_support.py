"""A gRPC server of test handlers on a loopback port, a raw HTTP/2 client, and a transport without a socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import hpack

from serve_app.grpc_server import frames as f
from serve_app.grpc_server.calls import CallContext
from serve_app.grpc_server.http2 import GrpcConnection, Method, ServerState
from serve_app.grpc_server.server import GrpcServer, listening_socket
from tests.support.net import free_port

MAX_BYTES = 1 << 20
ECHO = b"/t.T/Echo"


def _same(data: bytes) -> bytes:
    return data


@dataclass
class Handlers:
    release: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: int = 0

    async def echo(self, request: bytes, context: CallContext) -> bytes:
        return request

    async def big(self, request: bytes, context: CallContext) -> bytes:
        return b"b" * int(request)

    async def slow(self, request: bytes, context: CallContext) -> bytes:
        self.waiting += 1
        await self.release.wait()
        return request


def table(h: Handlers) -> dict[bytes, Method]:
    return {
        ECHO: Method("Echo", _same, _same, h.echo, False),
        b"/t.T/Big": Method("Big", _same, _same, h.big, False),
        b"/t.T/Slow": Method("Slow", _same, _same, h.slow, False),
    }


@dataclass
class Served:
    handlers: Handlers
    port: int
    server: GrpcServer
    connections: set[GrpcConnection]
    state: ServerState


async def serve() -> Served:
    handlers = Handlers()
    state = ServerState(table(handlers), MAX_BYTES, None)
    connections: set[GrpcConnection] = set()
    sock = listening_socket("127.0.0.1", free_port())
    port = sock.getsockname()[1]
    listening = await asyncio.get_running_loop().create_server(lambda: GrpcConnection(state, connections), sock=sock)
    return Served(handlers, port, GrpcServer(listening, connections), connections, state)


async def normal_calls(port: int, stop: asyncio.Event) -> list[bytes]:
    """A well-behaved client on its own connection: calls Echo until ``stop``; its answers."""
    answers: list[bytes] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        echo = channel.unary_unary(ECHO.decode(), request_serializer=_same, response_deserializer=_same)
        while not stop.is_set():
            answers.append(await echo(b"normal", timeout=60))
            await asyncio.sleep(0)
    return answers


def request_headers(encoder: hpack.Encoder, path: bytes = ECHO, extra: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    fixed = [(b":authority", b"x"), (b"content-type", b"application/grpc"), (b"te", b"trailers"), *extra]
    return encoder.encode([(b":method", b"POST"), (b":scheme", b"http"), (b":path", path), *fixed])


def message(data: bytes) -> bytes:
    return b"\x00" + len(data).to_bytes(4, "big") + data


class RawClient:
    """Frames written as they are; frames read back with header blocks decoded."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.next_id = 1

    @classmethod
    async def connect(cls, port: int, settings: dict[int, int] | None = None) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        writer.write(f.PREFACE + f.settings_frame(settings or {}))
        return client

    def open(self, path: bytes = ECHO, *, end_stream: bool = False, extra: tuple[tuple[bytes, bytes], ...] = ()) -> int:
        sid, self.next_id = self.next_id, self.next_id + 2
        flags = f.END_HEADERS | (f.END_STREAM if end_stream else 0)
        self.writer.write(f.frame(f.HEADERS, flags, sid, request_headers(self.encoder, path, extra)))
        return sid

    def call(self, path: bytes, data: bytes, extra: tuple[tuple[bytes, bytes], ...] = ()) -> int:
        sid = self.open(path, extra=extra)
        self.writer.write(f.frame(f.DATA, f.END_STREAM, sid, message(data)))
        return sid

    async def frames(self) -> AsyncIterator[tuple[int, int, int, Any]]:
        """(kind, flags, stream, payload or decoded headers) until the connection ends."""
        while True:
            try:
                head = await self.reader.readexactly(f.HEADER_BYTES)
                payload = await self.reader.readexactly(int.from_bytes(head[:3], "big"))
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            kind, flags, sid = head[3], head[4], int.from_bytes(head[5:9], "big")
            if kind == f.HEADERS:
                yield kind, flags, sid, dict(self.decoder.decode(payload, raw=True))
            else:
                yield kind, flags, sid, payload

    async def goaway(self) -> tuple[int, bytes]:
        """The GOAWAY's code and debug data (the connection must end with one)."""
        async for kind, _, _, payload in self.frames():
            if kind == f.GOAWAY:
                return int.from_bytes(payload[4:8], "big"), payload[8:]
        raise AssertionError("the connection ended without GOAWAY")

    def close(self) -> None:
        self.writer.close()


class FakeTransport(asyncio.Transport):
    """Writes kept in memory; reading paused and resumed as the protocol asks."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.paused = False
        self.closing = False
        self.buffered = 0  # what get_write_buffer_size reports
        self.eof = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_reading(self) -> bool:
        return not self.paused

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def abort(self) -> None:
        self.closing = True


def written_frames(data: bytes | bytearray) -> list[tuple[int, int, int, bytes]]:
    out = []
    pos = 0
    while pos + f.HEADER_BYTES <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        head = data[pos : pos + f.HEADER_BYTES]
        out.append((head[3], head[4], int.from_bytes(head[5:9], "big"), bytes(data[pos + 9 : pos + 9 + length])))
        pos += f.HEADER_BYTES + length
    return out
