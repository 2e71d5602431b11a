"""Abuse over real sockets, where the request limits act before any framework sees a request: bad HTTP request
heads (an oversized request line, too many headers, an oversized head, a head that never completes, garbage),
oversized, deeply nested and empty-object bodies, and on the gRPC port messages over the size limit, messages of
empty inputs, deeply nested groups, garbage and random HTTP/2 frames.

Oracle: no answer is a 5xx or INTERNAL / UNKNOWN / DATA_LOSS, each case ends within the timeout (an answer, or
the server closing the connection), the server is healthy afterwards, and after the run, once the process has
collected its garbage, its resident memory is back within 5% of what it was after a warm-up round of the same
cases.  The clients (``tests/support/raw_clients.py``) are blocking, in threads; the servers are the gateway's
own (uvicorn with the bounded head, the event-loop HTTP/2 gRPC server) on free loopback ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import random
import struct
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from serve_app import limits as head_limits
from serve_app.limits import RequestLimits
from serve_app.protos import grpc_service_pb2 as pb
from serve_app.service import InferenceService
from tests.support.raw_clients import grpc_call, grpc_frame, http_exchange, http_status

_GET = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"  # a head to make too large
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
BAD_GRPC = {2: "UNKNOWN", 13: "INTERNAL", 15: "DATA_LOSS"}
MAX_CASE_BYTES = 16 * 2**20  # the largest body a case sends (the server's limit may be larger)
HEAD_TIMEOUT_S = 0.5  # the server's head timeout while the cases run: a partial head costs this long


@dataclass
class SocketCase:
    kind: str
    protocol: str  # "http" or "grpc"
    parts: tuple[bytes, ...]  # what the client sends, in order
    # the server may close without an answer: a garbled or incomplete request, or one refused while the client
    # still writes (its answer may be lost in the reset)
    closed_ok: bool
    expect: frozenset[int]  # the HTTP status or gRPC code an answer must have (empty: any but a 5xx)


@dataclass
class SocketOutcome:
    case: SocketCase
    answer: str  # "400", "grpc 3", "closed"
    seconds: float
    problem: str = ""


def _head(path: str, *headers: str, method: str = "POST") -> bytes:
    return ("\r\n".join([f"{method} {path} HTTP/1.1", "Host: x", "Connection: close", *headers]) + "\r\n\r\n").encode()


def _post(model: str, body: bytes, *headers: str) -> bytes:
    return _head(
        f"/v2/models/{model}/infer", "Content-Type: application/json", f"Content-Length: {len(body)}", *headers
    )


def _case(kind: str, protocol: str, *parts: bytes, closed_ok: bool = False, expect: tuple[int, ...] = ()) -> SocketCase:
    return SocketCase(kind, protocol, parts, closed_ok, frozenset(expect))


def http_case(rng: random.Random, model: str, limits: RequestLimits) -> SocketCase:
    """One HTTP case.  A refusal while the client still sends may reach it as a reset: ``closed_ok``."""
    line_max, head_max = head_limits.MAX_REQUEST_LINE_BYTES, head_limits.MAX_HEAD_BYTES
    kind = rng.choice(["long-line", "many-headers", "big-head", "partial-head", "garbage", "big-body",
                       "nested-body", "empty-objects"])  # fmt: skip
    if kind == "long-line":
        url = b"/" + b"a" * rng.randint(line_max, 4 * line_max)
        return _case(kind, "http", b"GET " + url + b" HTTP/1.1\r\nHost: x\r\n\r\n", closed_ok=True, expect=(414,))
    if kind == "many-headers":
        n = rng.randint(head_limits.MAX_HEADERS + 1, 8 * head_limits.MAX_HEADERS)
        headers = b"".join(b"x-h%d: v\r\n" % i for i in range(n))
        return _case(kind, "http", _GET + headers + b"\r\n", closed_ok=True, expect=(431,))
    if kind == "big-head":
        value = b"v" * rng.randint(head_max, 4 * head_max)
        return _case(kind, "http", _GET + b"x-big: " + value + b"\r\n\r\n", closed_ok=True, expect=(431,))
    if kind == "partial-head":  # closed after the head timeout
        full = _head("/v2/health/live", method="GET")
        return _case(kind, "http", full[: rng.randint(0, len(full) - 3)], closed_ok=True)
    if kind == "garbage":
        return _case(kind, "http", rng.randbytes(rng.randint(1, 4096)) + b"\r\n\r\n", closed_ok=True)
    if kind == "big-body":  # refused from its Content-Length, which the client never sends in full
        declared = rng.randint(limits.max_body_bytes + 1, 4 * limits.max_body_bytes)
        head = _post(model, b"").replace(b"Content-Length: 0", b"Content-Length: %d" % declared)
        return _case(kind, "http", head, b"[" * min(declared, 1 << 20), closed_ok=True, expect=(413,))
    if kind == "nested-body":
        depth = rng.randint(limits.max_json_depth + 10, 200_000)
        body = b'{"inputs":' + b"[" * depth + b"]" * depth + b"}"
        return _case(kind, "http", _post(model, body), body, expect=(400,))
    n = rng.randint(4 * (limits.max_inputs + limits.max_outputs), min(limits.max_body_bytes, MAX_CASE_BYTES) // 3 - 20)
    body = b'{"inputs":[' + b"{}," * (n - 1) + b"{}]}"  # empty objects
    return _case(kind, "http", _post(model, body), body, expect=(400,))


def grpc_case(rng: random.Random, model: str, limits: RequestLimits) -> SocketCase:
    """One case on the gRPC port: a call (``grpc``) or bytes straight on the connection (``grpc-raw``)."""
    kind = rng.choice(["over-limit", "empty-inputs", "empty-outputs", "deep-groups", "h2-garbage", "h2-frames"])
    name = pb.ModelInferRequest(model_name=model).SerializeToString()
    if kind == "over-limit":  # the prefix declares more than the limit; a part of it follows
        length = rng.randint(limits.max_body_bytes + 1, 2**32 - 1)
        return _case(kind, "grpc", b"\x00" + struct.pack(">I", length) + rng.randbytes(1000), expect=(8,))
    if kind in ("empty-inputs", "empty-outputs"):
        tag = b"\x2a\x00" if kind == "empty-inputs" else b"\x32\x00"
        n = rng.randint(limits.max_inputs + 1, (min(limits.max_body_bytes, MAX_CASE_BYTES) - len(name)) // 2)
        return _case(kind, "grpc", grpc_frame(name + tag * n), expect=(3,))
    if kind == "deep-groups":  # unknown field 20 as nested groups: protobuf's recursion limit refuses it
        depth = rng.randint(200, 100_000)
        return _case(kind, "grpc", grpc_frame(name + b"\xa3\x01" * depth + b"\xa4\x01" * depth), expect=(3,))
    if kind == "h2-garbage":
        prefix = H2_PREFACE if rng.random() < 0.5 else b""
        return _case(kind, "grpc-raw", prefix + rng.randbytes(rng.randint(1, 8192)), closed_ok=True)
    frames = [H2_PREFACE, b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"]  # the preface and an empty SETTINGS
    for _ in range(rng.randint(1, 20)):
        payload = rng.randbytes(rng.randint(0, 64))
        length = len(payload) if rng.random() < 0.8 else rng.randint(0, 2**24 - 1)
        frame_type, flags, stream = rng.randint(0, 12), rng.randint(0, 255), rng.choice([0, 1, 3, rng.getrandbits(31)])
        frames.append(length.to_bytes(3, "big") + bytes([frame_type, flags]) + stream.to_bytes(4, "big") + payload)
    return _case(kind, "grpc-raw", b"".join(frames), closed_ok=True)


def run_case(
    case: SocketCase, http_port: int, grpc_port: int, timeout: float, *, end_partial_heads: bool = False
) -> SocketOutcome:
    """``end_partial_heads``: the client ends its sending after an incomplete head (a server whose head timeout
    is long then closes at once instead of after it)."""
    start = time.monotonic()
    if end_partial_heads and case.kind == "partial-head":
        http_exchange(http_port, *case.parts, timeout=timeout, half_close=True)
        return SocketOutcome(case, "closed", time.monotonic() - start)
    try:
        return _run(case, http_port, grpc_port, timeout, start)
    except TimeoutError:
        return SocketOutcome(case, "hang", time.monotonic() - start, f"{case.kind}: no end in {timeout} s")


def _run(case: SocketCase, http_port: int, grpc_port: int, timeout: float, start: float) -> SocketOutcome:
    if case.protocol == "http":
        status = http_status(http_exchange(http_port, *case.parts, timeout=timeout))
        answer = "closed" if status is None else str(status)
        bad = (status is None and not case.closed_ok) or (status is not None and status >= 500)
        bad = bad or (status is not None and bool(case.expect) and status not in case.expect)
    elif case.protocol == "grpc":
        code = grpc_call(grpc_port, case.parts[0], timeout=timeout)
        answer = "closed" if code is None else f"grpc {code}"
        bad = (code is None and not case.closed_ok) or code in BAD_GRPC
        bad = bad or (code is not None and bool(case.expect) and code not in case.expect)
    else:  # bytes straight on the gRPC port, then the client's end of sending: any ending but a hang
        http_exchange(grpc_port, *case.parts, timeout=timeout, half_close=True)
        answer, bad = "closed", False
    return SocketOutcome(case, answer, time.monotonic() - start, f"{case.kind}: {answer}" if bad else "")


def settle() -> int:
    """Resident bytes once garbage is collected and glibc has handed its free pages back (``malloc_trim``): what
    is still held, not what the allocator keeps for reuse (after large bodies glibc raises its mmap threshold
    and keeps freed blocks up to 32 MiB in its arenas)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return int(next(x for x in f if x.startswith("VmRSS:")).split()[1]) * 1024


@dataclass
class SocketReport:
    cases: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    slowest: float = 0.0
    rss_before: int = 0
    rss_after: int = 0
    rss_untrimmed: int = 0  # after the run, before malloc_trim
    rss_peak: int = 0
    healthy: bool = True
    elapsed_s: float = 0.0

    @property
    def memory_growth(self) -> float:
        return (self.rss_after - self.rss_before) / self.rss_before if self.rss_before else 0.0

    @property
    def ok(self) -> bool:
        return not self.problems and self.healthy and self.memory_growth <= 0.05

    def summary(self) -> str:
        answers = "  ".join(f"{a}: {n}" for a, n in sorted(self.answers.items(), key=lambda kv: -kv[1]))
        mib = 2**20
        return (
            f"sockets {self.cases} cases in {self.elapsed_s:.1f} s, {len(self.problems)} failures, healthy "
            f"{self.healthy}; {answers}; slowest {self.slowest * 1000:.0f} ms; RSS {self.rss_before / mib:.0f} -> "
            f"peak {self.rss_peak / mib:.0f} -> {self.rss_untrimmed / mib:.0f}, trimmed {self.rss_after / mib:.0f} MiB "
            f"({self.memory_growth:+.1%})"
        )


@contextlib.asynccontextmanager
async def serving(service: InferenceService, limits: RequestLimits) -> AsyncIterator[tuple[int, int]]:
    """The gateway's HTTP and gRPC servers for ``service`` on free loopback ports, the head timeout short."""
    from serve_app.grpc_server import start_grpc_server
    from serve_app.http_server import build_http_app
    from serve_app.http_server.server import reuse_port_socket, serve_http
    from tests.support.net import free_port

    saved, head_limits.HEAD_TIMEOUT_S = head_limits.HEAD_TIMEOUT_S, HEAD_TIMEOUT_S
    sock = reuse_port_socket("127.0.0.1", free_port())
    http, task = serve_http(build_http_app(service, limits=limits), sock)
    grpc_port = free_port()
    grpc = await start_grpc_server(service, "127.0.0.1", grpc_port, limits=limits)
    try:
        while not http.started:
            await asyncio.sleep(0.01)
        yield sock.getsockname()[1], grpc_port
    finally:
        http.should_exit = True
        await task
        await grpc.stop()
        head_limits.HEAD_TIMEOUT_S = saved


def abuse_ports(
    http_port: int, grpc_port: int, limits: RequestLimits, *, model: str, cases: int, seed: int,
    concurrency: int = 4, timeout_s: float = 60.0,
) -> SocketReport:  # fmt: skip
    """The same cases against a running server's ports (its limits as given; its head timeout is not this
    process's to shorten, so a client with an incomplete head ends its sending): answers and health, no memory
    figures (the caller has the server's processes)."""
    from concurrent.futures import ThreadPoolExecutor

    report = SocketReport()
    start = time.monotonic()

    def one(i: int) -> SocketOutcome:
        rng = random.Random(f"{seed}:sockets:{i}")
        case = (http_case if i % 2 == 0 else grpc_case)(rng, model, limits)
        return run_case(case, http_port, grpc_port, timeout_s, end_partial_heads=True)

    with ThreadPoolExecutor(concurrency) as pool:
        for i, outcome in enumerate(pool.map(one, range(cases))):
            report.cases += 1
            report.answers[f"{outcome.case.protocol} {outcome.answer}"] += 1
            report.slowest = max(report.slowest, outcome.seconds)
            if outcome.problem:
                report.problems.append(f"case {i} {outcome.problem}")
    report.healthy = _healthy(http_port, timeout_s)
    report.elapsed_s = time.monotonic() - start
    return report


def _healthy(http_port: int, timeout: float) -> bool:
    return http_status(http_exchange(http_port, _head("/v2/health/ready", method="GET"), timeout=timeout)) == 200


async def abuse(
    service: InferenceService,
    limits: RequestLimits,
    *,
    model: str,
    cases: int,
    seed: int,
    concurrency: int = 4,
    timeout_s: float = 30.0,
    progress: Callable[[str], None] | None = None,
) -> SocketReport:
    """``cases`` seeded cases (half per protocol), after a warm-up round of the first 32.  ``concurrency``
    workers take the cases in turn: a task per case made up front would itself leave this process's memory
    larger (pymalloc keeps the arenas thousands of waiting tasks held)."""
    report = SocketReport()

    def make(i: int) -> SocketCase:
        rng = random.Random(f"{seed}:sockets:{i}")
        return (http_case if i % 2 == 0 else grpc_case)(rng, model, limits)

    async with serving(service, limits) as (http_port, grpc_port):

        async def one(i: int, record: bool) -> None:
            case = make(i)
            outcome = await asyncio.to_thread(run_case, case, http_port, grpc_port, timeout_s)
            del case
            report.rss_peak = max(report.rss_peak, rss_bytes())
            if not record:
                return
            report.cases += 1
            report.answers[f"{outcome.case.protocol} {outcome.answer}"] += 1
            report.slowest = max(report.slowest, outcome.seconds)
            if outcome.problem:
                report.problems.append(f"case {i} {outcome.problem}")
            if progress is not None and report.cases % 200 == 0:
                progress(f"{report.cases} cases, {len(report.problems)} failures, RSS {rss_bytes() / 2**20:.0f} MiB")

        async def run(count: int, record: bool) -> None:
            cases = iter(range(count))

            async def worker() -> None:
                for i in cases:
                    await one(i, record)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

        start = time.monotonic()
        await run(32, False)  # allocator and caches warm
        report.rss_before = settle()
        await run(cases, True)
        report.healthy = await asyncio.to_thread(_healthy, http_port, timeout_s)
        gc.collect()
        report.rss_untrimmed = rss_bytes()
        report.rss_after = settle()
        report.elapsed_s = time.monotonic() - start
    return report
