"""The infer route answered by the connection's protocol (``serve_http(..., infer=app)``), over a real socket.

Every answer is compared with the one the ASGI route gives the same bytes (one server each, on free
loopback ports): status, body and headers but the date.  Then what only a connection shows: keep-alive,
pipelining, ``Connection: close``, ``Expect: 100-continue``, a restricted infer route, and stock tritonclient.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from serve_app.http_server import build_http_app
from serve_app.http_server.restricted import restrict_http_app
from serve_app.http_server.server import reuse_port_socket, serve_http
from serve_app.limits import RequestLimits
from serve_app.security.restricted import RestrictedApis
from serve_app.service import InferenceService
from tests.integration.test_http_framing import BODY, chunked, parse, request
from tests.integration.test_security_tls import EXPECTED, http_add_sub, in_thread
from tests.support.net import free_port
from tests.support.repos import ADD_SUB

LIMIT = 4096
BINARY = json.dumps(
    {
        "inputs": json.loads(BODY)["inputs"],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}],
    }
).encode()


@contextlib.asynccontextmanager
async def serving(
    service: InferenceService, *, direct: bool, restricted: RestrictedApis | None = None
) -> AsyncIterator[int]:
    app = build_http_app(service, limits=RequestLimits(max_body_bytes=LIMIT))
    sock = reuse_port_socket("127.0.0.1", free_port())
    outer = restrict_http_app(app, restricted or RestrictedApis())
    server, task = serve_http(outer, sock, infer=app if direct else None, restricted=restricted)
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def ports(service: InferenceService) -> AsyncIterator[tuple[int, int]]:
    """(the direct server's port, the ASGI server's port)."""
    async with serving(service, direct=True) as direct, serving(service, direct=False) as asgi:
        yield direct, asgi


async def read_response(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
    return head + await asyncio.wait_for(reader.readexactly(length), 10)


async def one(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await read_response(reader)
    finally:
        writer.close()


def without_date(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    status, headers, body = parse(raw)
    headers.pop("date", None)
    return status, headers, body


CASES = {
    "json": request(BODY, f"Content-Length: {len(BODY)}"),
    "binary output": request(BINARY, f"Content-Length: {len(BINARY)}"),
    "chunked body": request(chunked(BODY), "Transfer-Encoding: chunked"),
    "versioned path": request(BODY, f"Content-Length: {len(BODY)}", path=f"/v2/models/{ADD_SUB}/versions/1/infer"),
    "unknown model": request(BODY, f"Content-Length: {len(BODY)}", path="/v2/models/nope/infer"),
    "unknown version": request(BODY, f"Content-Length: {len(BODY)}", path=f"/v2/models/{ADD_SUB}/versions/9/infer"),
    "not JSON": request(b"{nope", "Content-Length: 5"),
    "wrong shape": request(BODY.replace(b"[1, 16]", b"[1, 15]", 1), f"Content-Length: {len(BODY)}"),
    "declared over the limit": request(b"", f"Content-Length: {LIMIT + 1}"),
}


@pytest.mark.parametrize("case", CASES)
async def test_each_answer_is_the_asgi_routes(ports: tuple[int, int], case: str) -> None:
    direct, asgi = [without_date(await one(port, CASES[case])) for port in ports]
    assert direct == asgi
    if case in ("json", "binary output", "chunked body", "versioned path"):
        assert direct[0] == 200
    else:
        assert direct[0] >= 400 and "error" in json.loads(direct[2])


async def test_a_connection_serves_requests_in_turn_and_pipelined(ports: tuple[int, int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", ports[0])
    try:
        single = request(BODY, f"Content-Length: {len(BODY)}")
        for _ in range(3):
            writer.write(single)
            assert parse(await read_response(reader))[0] == 200
        ready = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        writer.write(single + CASES["unknown model"] + ready + single)  # four requests in one write
        answers = [parse(await read_response(reader))[0] for _ in range(4)]
        assert answers == [200, 404, 200, 200]
    finally:
        writer.close()


async def test_connection_close_and_http_1_0_close_after_the_response(ports: tuple[int, int]) -> None:
    for data in (
        request(BODY, f"Content-Length: {len(BODY)}", "Connection: close"),
        request(BODY, f"Content-Length: {len(BODY)}").replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", ports[0])
        try:
            writer.write(data)
            raw = await asyncio.wait_for(reader.read(), 10)  # to EOF: the server closed
        finally:
            writer.close()
        status, headers, _ = parse(raw)
        assert status == 200 and headers["connection"] == "close"


async def test_expect_100_continue_is_answered_before_the_body(ports: tuple[int, int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", ports[0])
    try:
        head, body = request(BODY, f"Content-Length: {len(BODY)}", "Expect: 100-continue").split(b"\r\n\r\n", 1)
        writer.write(head + b"\r\n\r\n")
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        assert parse(await read_response(reader))[0] == 200
    finally:
        writer.close()


async def test_a_client_gone_before_its_body_leaves_the_server_serving(ports: tuple[int, int]) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", ports[0])
    writer.write(request(BODY[:10], f"Content-Length: {len(BODY)}"))
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    assert parse(await one(ports[0], CASES["json"]))[0] == 200


async def test_a_restricted_infer_route_with_tritonclient(service: InferenceService) -> None:
    restricted = RestrictedApis.parse(["inference:infer-key=infer-value"])
    async with serving(service, direct=True, restricted=restricted) as port:

        def calls() -> None:
            client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
            try:
                with pytest.raises(Exception, match="This API is restricted, expecting header 'infer-key'"):
                    http_add_sub(client, headers={"test": "1"})
                np.testing.assert_array_equal(http_add_sub(client, headers={"infer-key": "infer-value"}), EXPECTED)
                np.testing.assert_array_equal(http_add_sub(client, headers={"Infer-Key": "infer-value"}), EXPECTED)
            finally:
                client.close()

        await in_thread(calls)
