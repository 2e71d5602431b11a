"""16 MiB of empty input objects, the cheapest body to send and the dearest to parse, over real sockets to
the real front ends in this process: the JSON body (HTTP) and a ModelInferRequest of empty inputs (gRPC)
are answered with 400 / INVALID_ARGUMENT, raise this process's peak resident memory by less than 64 MiB,
and a health check keeps answering meanwhile.

The clients (``tests/support/raw_clients.py``) run in threads on blocking sockets, so the event loop
serves only the servers and the bodies are sent from the test's one copy.  The peak is the kernel's
(``VmHWM`` after ``clear_refs``).  What a health check waits for is the event loop's longest busy stretch;
it is measured in the loop thread's CPU time, which a loaded machine does not stretch, and asserted under
the 0.5 s the check must answer within.  The health checks' wall times are only required to answer (a
loaded CI machine may delay any of them)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from serve_app.grpc_server import start_grpc_server
from serve_app.http_server import build_http_app
from serve_app.http_server.server import reuse_port_socket, serve_http
from serve_app.protos import grpc_service_pb2 as pb
from serve_app.service import InferenceService
from tests.support.net import free_port
from tests.support.raw_clients import grpc_call, grpc_frame, http_exchange, http_status
from tests.support.repos import ADD_SUB

MiB = 2**20
BODY = 16 * MiB
EXTRA_RSS = 64 * MiB  # what the abusive request may add to the process's resident memory
LOOP_BUSY_S = 0.5  # how long a health check may wait behind it
TIMEOUT = 120.0


@dataclass
class Ports:
    http: int
    grpc: int


@pytest.fixture
async def ports(service: InferenceService) -> AsyncIterator[Ports]:
    sock = reuse_port_socket("127.0.0.1", free_port())
    http, task = serve_http(build_http_app(service), sock)
    grpc_port = free_port()
    grpc = await start_grpc_server(service, "127.0.0.1", grpc_port)
    while not http.started:
        await asyncio.sleep(0.01)
    try:
        yield Ports(sock.getsockname()[1], grpc_port)
    finally:
        http.should_exit = True
        await task
        await grpc.stop()


def _status(name: str) -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(name + ":"))
    return int(line.split()[1]) * 1024


def http_post(port: int, body: bytes) -> int | None:
    """POST ``body`` to add_sub's infer route; the answer's status."""
    head = (
        f"POST /v2/models/{ADD_SUB}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return http_status(http_exchange(port, head, body, timeout=TIMEOUT))


@dataclass
class Watch:
    """Health checks from a thread and the event loop's busy stretches, while the abuse runs."""

    http_port: int
    waits: list[float] = field(default_factory=list)  # wall seconds of each health check
    statuses: list[int] = field(default_factory=list)
    loop_busy: float = 0.0  # the loop thread's most CPU seconds between two of its ticks
    stop: threading.Event = field(default_factory=threading.Event)

    def checks(self) -> None:
        request = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        while not self.stop.is_set():
            start = time.monotonic()
            self.statuses.append(http_status(http_exchange(self.http_port, request, timeout=TIMEOUT)) or 0)
            self.waits.append(time.monotonic() - start)
            time.sleep(0.02)

    async def ticks(self) -> None:
        while not self.stop.is_set():
            before = time.thread_time()
            await asyncio.sleep(0.005)
            self.loop_busy = max(self.loop_busy, time.thread_time() - before)


async def abuse(http_port: int, send: Callable[[], int | None]) -> tuple[int | None, int, Watch]:
    """Run ``send`` in a thread with health checks beside it: its answer, the peak extra RSS, the watch."""
    watch = Watch(http_port)
    checker = threading.Thread(target=watch.checks, daemon=True)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here on
    before = _status("VmRSS")
    ticker = asyncio.create_task(watch.ticks())
    checker.start()
    try:
        answer = await asyncio.wait_for(asyncio.to_thread(send), TIMEOUT)
        while len(watch.waits) < 3:  # a few checks at least, the last ones after the answer
            await asyncio.sleep(0.02)
    finally:
        watch.stop.set()
        await ticker
        await asyncio.to_thread(checker.join, TIMEOUT)
    return answer, _status("VmHWM") - before, watch


def _assert_bounded(extra: int, watch: Watch) -> None:
    assert extra < EXTRA_RSS, f"peak resident memory grew by {extra / MiB:.0f} MiB"
    assert watch.statuses and set(watch.statuses) == {200}
    assert watch.loop_busy < LOOP_BUSY_S, f"the event loop was busy {watch.loop_busy:.2f} s at a stretch"
    print(
        f"extra RSS {extra / MiB:.1f} MiB, loop busy at most {watch.loop_busy * 1000:.0f} ms CPU, "
        f"{len(watch.waits)} health checks, worst {max(watch.waits) * 1000:.0f} ms"
    )


async def test_http_body_of_empty_objects(ports: Ports) -> None:
    body = b'{"inputs":[' + b"{}," * (BODY // 3 - 5) + b"{}]}"
    status, extra, watch = await abuse(ports.http, lambda: http_post(ports.http, body))
    assert status == 400
    _assert_bounded(extra, watch)


async def test_grpc_message_of_empty_inputs(ports: Ports) -> None:
    message = pb.ModelInferRequest(model_name=ADD_SUB).SerializeToString() + b"\x2a\x00" * (BODY // 2)
    framed = grpc_frame(message)
    del message
    status, extra, watch = await abuse(ports.http, lambda: grpc_call(ports.grpc, framed, timeout=TIMEOUT))
    assert status == 3  # INVALID_ARGUMENT
    _assert_bounded(extra, watch)
