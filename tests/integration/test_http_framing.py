"""Request framing over a real socket: a body the client chunk-encodes itself, sent with its own
``Transfer-Encoding: chunked`` and a ``Content-Length`` its library added, is read by its chunks (RFC 9112 §6.3,
as Triton does), within the body limit, and the connection closes after the response.  The HTTP app runs under
uvicorn on a free loopback port, as the gateway runs it; the client writes raw bytes."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest

from serve_app.http_server import build_http_app
from serve_app.http_server.server import reuse_port_socket, serve_http
from serve_app.limits import RequestLimits
from serve_app.service import InferenceService
from tests.support.net import free_port
from tests.support.repos import ADD_SUB

LIMIT = 4096
A = [float(i) for i in range(16)]
B = [0.5] * 16
BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": A},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": B},
        ]
    }
).encode()
PATH = f"/v2/models/{ADD_SUB}/infer"


@pytest.fixture(params=["direct", "asgi"])
async def port(service: InferenceService, request: pytest.FixtureRequest) -> AsyncIterator[int]:
    """Served as the gateway serves it (the infer route answered by the protocol), and by the ASGI route."""
    sock = reuse_port_socket("127.0.0.1", free_port())
    app = build_http_app(service, limits=RequestLimits(max_body_bytes=LIMIT))
    server, task = serve_http(app, sock, infer=app if request.param == "direct" else None)
    while not server.started:
        await asyncio.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    await task


def chunked(body: bytes, size: int = 100) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


def request(body: bytes, *headers: str, path: str = PATH) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, then read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10)  # EOF: the server closed the connection
    finally:
        writer.close()


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            body, rest = body + rest[:size], rest[size + 2 :]
        return int(status_line.split()[1]), headers, body
    return int(status_line.split()[1]), headers, rest[: int(headers["content-length"])]


def outputs(body: bytes) -> dict[str, list[float]]:
    return {o["name"]: o["data"] for o in json.loads(body)["outputs"]}


@pytest.mark.parametrize("order", ["te-first", "cl-first"])
async def test_a_chunked_body_with_a_content_length_is_read_by_its_chunks(port: int, order: str) -> None:
    encoded = chunked(BODY)
    te, cl = "Transfer-Encoding: chunked", f"Content-Length: {len(encoded)}"  # what requests sends
    raw = await exchange(port, request(encoded, *((te, cl) if order == "te-first" else (cl, te))))
    status, headers, body = parse(raw)
    assert status == 200, body
    got = outputs(body)
    assert got["OUTPUT0"] == [a + b for a, b in zip(A, B, strict=True)]
    assert got["OUTPUT1"] == [a - b for a, b in zip(A, B, strict=True)]
    assert headers["connection"] == "close"  # and the connection closed: exchange read to EOF


async def test_the_content_length_of_such_a_body_is_not_what_the_limit_checks(port: int) -> None:
    encoded = chunked(BODY)
    raw = await exchange(port, request(encoded, "Transfer-Encoding: chunked", f"Content-Length: {LIMIT * 10}"))
    assert parse(raw)[0] == 200


async def test_an_oversized_chunked_body_with_a_content_length_gets_the_usual_413(port: int) -> None:
    big = b'{"inputs": [' + b" " * (LIMIT * 4) + b"]}"
    raw = await exchange(port, request(chunked(big, 1000), "Transfer-Encoding: chunked", "Content-Length: 10"))
    status, _, body = parse(raw)
    assert status == 413
    assert json.loads(body) == {
        "error": f"request body size exceeds the maximum allowed value of {LIMIT} bytes, the server's "
        "max_body_bytes limit (raise it with --max-body-bytes)"
    }


async def test_what_follows_such_a_body_on_the_connection_is_not_served(port: int) -> None:
    encoded = chunked(BODY)
    smuggled = request(b"", "Content-Length: 0", path="/v2/health/ready")
    raw = await exchange(
        port, request(encoded, "Transfer-Encoding: chunked", f"Content-Length: {len(encoded)}") + smuggled
    )
    assert raw.count(b"HTTP/1.1 ") == 1 and parse(raw)[0] == 200


async def test_other_requests_keep_their_connection(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for framing in ([f"Content-Length: {len(BODY)}"], ["Transfer-Encoding: chunked"]):
            writer.write(request(BODY if framing[0].startswith("Content") else chunked(BODY), *framing))
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
            length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
            assert outputs(await reader.readexactly(length))["OUTPUT0"][1] == 1.5
    finally:
        writer.close()


async def test_accepted_connections_send_without_nagle(service: InferenceService) -> None:
    """A response goes out as two writes (headers, then body): with Nagle on, the body of every request after
    the first on a kept-alive connection would wait for the client's delayed ACK (about 40 ms)."""
    sock = reuse_port_socket("127.0.0.1", free_port())
    assert sock.proto == socket.IPPROTO_TCP  # what asyncio looks at before it sets TCP_NODELAY
    server, task = serve_http(build_http_app(service), sock)
    while not server.started:
        await asyncio.sleep(0.01)
    reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
    try:
        writer.write(request(BODY, f"Content-Length: {len(BODY)}"))
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        (connection,) = server.server_state.connections
        accepted = connection.transport.get_extra_info("socket")
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        writer.close()
        server.should_exit = True
        await task
