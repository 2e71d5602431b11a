"""The HTTP request head is bounded over a real socket: a long request line gets 414, too many headers or too
many header bytes 431 (Triton's JSON error body), a head that never completes is closed after the head
timeout; a normal request on the same server still answers.  uvicorn serves the app on a free loopback port,
as in the gateway; the client writes raw bytes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from serve_app import limits
from serve_app.http_server import build_http_app
from serve_app.http_server.server import reuse_port_socket, serve_http
from serve_app.service import InferenceService
from tests.integration.test_http_framing import exchange, parse
from tests.support.net import free_port


@pytest.fixture
async def port(service: InferenceService) -> AsyncIterator[int]:
    sock = reuse_port_socket("127.0.0.1", free_port())
    server, task = serve_http(build_http_app(service), sock)
    while not server.started:
        await asyncio.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    await task


async def refused(port: int, data: bytes) -> tuple[int, str]:
    status, headers, body = parse(await exchange(port, data))
    assert headers["connection"] == "close" and headers["content-type"] == "application/json"
    return status, json.loads(body)["error"]


async def test_a_normal_request_answers(port: int) -> None:
    raw = await exchange(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert parse(raw)[0] == 200


async def test_a_request_line_over_the_limit_gets_414(port: int) -> None:
    # exactly one byte over, and no more: the server has read all of it when it answers (no reset)
    url = b"/" + b"a" * limits.MAX_REQUEST_LINE_BYTES
    status, error = await refused(port, b"GET " + url)
    assert status == 414 and f"over {limits.MAX_REQUEST_LINE_BYTES} bytes" in error


async def test_too_many_headers_get_431(port: int) -> None:
    headers = b"".join(b"x-h%d: v\r\n" % i for i in range(limits.MAX_HEADERS + 1))
    status, error = await refused(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert status == 431 and f"more than {limits.MAX_HEADERS} headers" in error


async def test_a_head_over_the_limit_gets_431(port: int) -> None:
    big = b"x-big: " + b"v" * (limits.MAX_HEAD_BYTES) + b"\r\n"  # one header, not yet complete head
    status, error = await refused(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + big)
    assert status == 431 and f"over {limits.MAX_HEAD_BYTES} bytes" in error


@pytest.mark.parametrize("sent", [b"", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"], ids=["silent", "partial"])
async def test_a_head_that_does_not_complete_is_closed(port: int, monkeypatch: pytest.MonkeyPatch, sent: bytes) -> None:
    monkeypatch.setattr(limits, "HEAD_TIMEOUT_S", 0.2)
    assert await exchange(port, sent) == b""  # closed without an answer (exchange waits up to 10 s)


async def test_the_head_timeout_does_not_cut_a_kept_alive_connection(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "HEAD_TIMEOUT_S", 0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(2):  # two requests on one connection, the second after longer than the head timeout
            # (between requests uvicorn's keep-alive timeout applies)
            writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200")
            length = int(
                next(
                    v
                    for k, v in (h.split(b": ", 1) for h in head.split(b"\r\n")[1:-2])
                    if k.lower() == b"content-length"
                )
            )
            await reader.readexactly(length)
            await asyncio.sleep(0.5)
    finally:
        writer.close()


async def test_a_head_over_the_limit_completed_in_one_write_gets_431(port: int) -> None:
    # the read that crosses the limit also completes the head: its headers' own bytes are counted
    big = b"x-big: " + b"v" * (limits.MAX_HEAD_BYTES + 5000) + b"\r\n\r\n"
    status, error = await refused(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + big)
    assert status == 431 and f"over {limits.MAX_HEAD_BYTES} bytes" in error
