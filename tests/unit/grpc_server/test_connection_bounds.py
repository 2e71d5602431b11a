"""What one connection may hold: answers waiting for a shut window are capped and freed with the
connection; frames are handled in slices; reading pauses while its unanswered work is over its bound."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import AsyncIterator

import hpack
import pytest

from serve_app.grpc_server import frames as f, http2
from serve_app.grpc_server.http2 import GrpcConnection, ServerState
from tests.unit.grpc_server.h2_support import (
    ECHO,
    FakeTransport,
    Handlers,
    RawClient,
    Served,
    message,
    normal_calls,
    request_headers,
    serve,
    table,
    written_frames,
)

ANSWER = 1 << 20
CALLS = 20


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    served = await serve()
    yield served
    await served.server.stop()


async def _zero_window_calls(port: int) -> tuple[RawClient, int, int]:
    """CALLS answers of ANSWER bytes to a client whose window is 0: (client, answers waiting, refused)."""
    client = await RawClient.connect(port, {f.INITIAL_WINDOW_SIZE: 0})
    sids = {client.call(b"/t.T/Big", b"%d" % ANSWER) for _ in range(CALLS)}
    waiting = refused = 0
    async for kind, flags, sid, headers in client.frames():
        if kind == f.HEADERS and sid in sids:
            if not flags & f.END_STREAM:
                waiting += 1
            elif headers.get(b"grpc-status") == b"8":  # RESOURCE_EXHAUSTED
                refused += 1
            if waiting + refused == CALLS:
                break
    return client, waiting, refused


async def _until(condition: object) -> None:
    for _ in range(3000):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_zero_window_answers_are_capped_and_freed_with_their_connection(served: Served) -> None:
    budget = served.state.budget
    framed = ANSWER + 5  # the message's prefix
    budget.per_connection, budget.total = 4 * framed, 6 * framed
    gc.disable()  # what the connection held must go by reference counting alone, not by a later collection
    tracemalloc.start()
    try:
        stop = asyncio.Event()
        normal = asyncio.get_running_loop().create_task(normal_calls(served.port, stop))
        await _until(lambda: served.connections)
        retained = []
        for _ in range(2):
            baseline = tracemalloc.get_traced_memory()[0]
            first, waiting_1, refused_1 = await _zero_window_calls(served.port)
            second, waiting_2, refused_2 = await _zero_window_calls(served.port)
            assert (waiting_1, refused_1) == (4, CALLS - 4)  # the connection's cap
            assert (waiting_2, refused_2) == (2, CALLS - 2)  # the server's cap
            assert budget.parked == 6 * framed
            first.close()
            second.close()
            await _until(lambda: budget.parked == 0 and len(served.connections) == 1)
            await asyncio.sleep(0)
            retained.append(tracemalloc.get_traced_memory()[0] - baseline)
        stop.set()
        answers = await normal
        assert answers and set(answers) == {b"normal"}
        assert all(r < 2 * ANSWER for r in retained), retained  # six answers were held each time
    finally:
        tracemalloc.stop()
        gc.enable()


def _connection(monkeypatch: pytest.MonkeyPatch) -> tuple[GrpcConnection, FakeTransport, Handlers]:
    handlers = Handlers()
    connection = GrpcConnection(ServerState(table(handlers), 1 << 20, None), set())
    transport = FakeTransport()
    connection.connection_made(transport)
    return connection, transport, handlers


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_frames_are_handled_in_slices_with_reading_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    connection, transport, _ = _connection(monkeypatch)
    frames = f.window_update(0, 1) * (5 * http2.SLICE_FRAMES)
    connection.data_received(f.PREFACE + f.settings_frame({}) + frames)
    window = connection._send_window
    assert not transport.is_reading()  # the rest waits for the next loop turn: other connections go first
    assert window == f.DEFAULT_WINDOW + http2.SLICE_FRAMES - 1
    await _turns()
    assert connection._send_window == f.DEFAULT_WINDOW + 5 * http2.SLICE_FRAMES
    assert transport.is_reading()


async def test_reading_pauses_while_the_connections_work_is_over_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http2, "MAX_UNANSWERED_CALLS", 5)
    connection, transport, handlers = _connection(monkeypatch)
    encoder = hpack.Encoder()
    data = bytearray(f.PREFACE + f.settings_frame({}))
    for i in range(20):
        sid = 2 * i + 1
        data += f.frame(f.HEADERS, f.END_HEADERS, sid, request_headers(encoder, b"/t.T/Slow"))
        data += f.frame(f.DATA, f.END_STREAM, sid, message(b"%d" % i))
    connection.data_received(bytes(data))
    await _turns()
    assert handlers.waiting == 6 and not transport.is_reading()  # past the bound, the rest of the frames wait
    handlers.release.set()
    await _turns(200)
    ends = [fr for fr in written_frames(transport.written) if fr[0] == f.HEADERS and fr[1] & f.END_STREAM]
    assert len(ends) == 20 and handlers.waiting == 20 and transport.is_reading()
    assert connection._working == 0 and connection._held == 0


async def test_a_closed_connection_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    connection, _, handlers = _connection(monkeypatch)
    encoder = hpack.Encoder()
    data = bytearray(f.PREFACE + f.settings_frame({}))
    for sid in (1, 3, 5):
        data += f.frame(f.HEADERS, f.END_HEADERS, sid, request_headers(encoder, b"/t.T/Slow"))
        data += f.frame(f.DATA, f.END_STREAM, sid, message(b"x"))
    data += f.frame(f.HEADERS, f.END_HEADERS, 7, request_headers(encoder, ECHO))  # its body never comes
    connection.data_received(bytes(data))
    await _turns()
    assert handlers.waiting == 3
    connection.connection_lost(None)
    await _turns()
    assert not connection.calls and connection._working == 0 and connection._held == 0
    assert not connection._waiters and connection.state.budget.parked == 0


async def test_an_answer_waiting_for_the_window_ends_at_its_deadline(served: Served) -> None:
    client = await RawClient.connect(served.port, {f.INITIAL_WINDOW_SIZE: 0})
    sid = client.call(b"/t.T/Big", b"%d" % ANSWER, extra=((b"grpc-timeout", b"200m"),))
    async for kind, flags, stream, headers in client.frames():
        if kind == f.HEADERS and stream == sid and flags & f.END_STREAM:
            assert headers[b"grpc-status"] == b"4"  # DEADLINE_EXCEEDED, after the response headers
            break
    client.close()
    await _until(lambda: served.state.budget.parked == 0)


async def test_reading_pauses_while_the_socket_does_not_take_our_output(monkeypatch: pytest.MonkeyPatch) -> None:
    connection, transport, _ = _connection(monkeypatch)
    connection.data_received(f.PREFACE + f.settings_frame({}))
    connection.pause_writing()  # the socket's buffer passed its high-water mark
    assert not transport.is_reading()
    connection.resume_writing()
    assert transport.is_reading()
