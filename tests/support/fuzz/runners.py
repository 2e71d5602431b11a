"""Sending cases and judging the answers: one case over its protocol (a stream also against its requests
sent alone, a parity case over both), the server's health between batches, and the seeded campaign."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator

import grpc
import httpx

from serve_app.protos import grpc_service_pb2 as pb
from tests.support.fuzz.cases import Case, GrpcCase, HttpCase, ParityCase
from tests.support.fuzz.generator import Generator
from tests.support.fuzz.oracle import GRPC_TO_HTTP, Outcome, Report, grpc_problem, http_problem, is_negative_dimension
from tests.support.fuzz.targets import Targets
from tests.support.fuzz.wire import compact_json, grpc_message, http_doc, infer_path

SERVICE = "/inference.GRPCInferenceService/"


def _grpc_code(exc: grpc.aio.AioRpcError) -> str:
    return exc.code().name


async def chunks(body: bytes, size: int = 65536) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


async def run_http(t: Targets, case: HttpCase) -> tuple[Outcome, httpx.Response | None]:
    start = time.perf_counter()
    try:
        content: bytes | AsyncIterator[bytes] = chunks(case.body) if case.chunked else case.body
        resp = await asyncio.wait_for(
            t.http.request(case.method, case.path, content=content, headers=case.headers), t.timeout_s
        )
    except asyncio.TimeoutError:
        return Outcome("timeout", time.perf_counter() - start, f"no answer in {t.timeout_s} s"), None
    except Exception as exc:
        return Outcome(f"exception:{type(exc).__name__}", time.perf_counter() - start, repr(exc)[:300]), None
    seconds = time.perf_counter() - start
    return Outcome(str(resp.status_code), seconds, http_problem(case, resp, strict=t.strict)), resp


def _grpc_ok(t: Targets, code: str, unavailable_ok: bool) -> str:
    return grpc_problem(code, unavailable_ok, strict=t.strict, timeout_s=t.timeout_s)


async def grpc_unary(t: Targets, rpc: str, payload: bytes) -> tuple[str, str, bytes]:
    """(status name, details, response bytes) of one unary call, payload sent as is."""
    call = t.channel.unary_unary(SERVICE + rpc)
    try:
        resp = await call(payload, timeout=t.timeout_s)
        return "OK", "", resp
    except grpc.aio.AioRpcError as exc:
        return _grpc_code(exc), exc.details() or "", b""


async def run_grpc(t: Targets, case: GrpcCase) -> Outcome:
    start = time.perf_counter()
    try:
        if case.rpc != "ModelStreamInfer":
            code, details, _ = await grpc_unary(t, case.rpc, case.payloads[0])
            problem = _grpc_ok(t, code, case.unavailable_ok)
            return Outcome(code, time.perf_counter() - start, f"{problem}: {details[:300]!r}" if problem else "")
        return await run_stream(t, case, start)
    except Exception as exc:
        return Outcome(f"exception:{type(exc).__name__}", time.perf_counter() - start, repr(exc)[:300])


async def run_stream(t: Targets, case: GrpcCase, start: float) -> Outcome:
    """Each message alone (unary) and then all in one stream: the stream answers each in-band, alike."""
    alone = []
    for payload in case.payloads:
        code, details, _ = await grpc_unary(t, "ModelInfer", payload)
        if problem := _grpc_ok(t, code, case.unavailable_ok):
            return Outcome(code, time.perf_counter() - start, f"{problem} (alone): {details[:300]!r}")
        alone.append(details if code != "OK" else "")
    call = t.channel.stream_stream(SERVICE + "ModelStreamInfer")

    async def requests() -> AsyncIterator[bytes]:
        for payload in case.payloads:
            yield payload

    try:
        answers = [r async for r in call(requests(), timeout=t.timeout_s)]
    except grpc.aio.AioRpcError as exc:
        code = _grpc_code(exc)
        return Outcome(code, time.perf_counter() - start, f"stream ended with {code}: {exc.details()!r}")
    seconds = time.perf_counter() - start
    in_band = sorted(pb.ModelStreamInferResponse.FromString(a).error_message for a in answers)
    if len(answers) != len(case.payloads):
        return Outcome("STREAM", seconds, f"{len(answers)} answers to {len(case.payloads)} requests")
    if in_band != sorted(alone):
        return Outcome("STREAM", seconds, f"in-band {in_band!r} != alone {sorted(alone)!r}"[:600])
    return Outcome("STREAM_OK", seconds)


async def run_parity(t: Targets, case: ParityCase) -> Outcome:
    start = time.perf_counter()
    h, resp = await run_http(t, case.http)
    g = await run_grpc(t, case.grpc)
    seconds = time.perf_counter() - start
    status = f"{h.status}={g.status}"
    if h.problem or g.problem:
        return Outcome(status, seconds, h.problem or g.problem)
    if resp is not None and g.status == "INVALID_ARGUMENT" and is_negative_dimension(resp):
        return Outcome(status, seconds)  # Triton's two front ends differ here: HTTP's parser fails first
    if GRPC_TO_HTTP.get(g.status) != int(h.status):
        return Outcome(status, seconds, f"HTTP {h.status} but gRPC {g.status}")
    if resp is not None and resp.status_code >= 400 and resp.status_code != 413:  # gRPC's 413 is grpc's own
        _, details, _ = await grpc_unary(t, "ModelInfer", case.grpc.payloads[0])
        message = resp.json()["error"]
        if details != message:
            return Outcome(status, seconds, f"messages differ: HTTP {message!r} / gRPC {details!r}"[:600])
    return Outcome(status, seconds)


async def run_case(t: Targets, case: Case) -> Outcome:
    if isinstance(case, HttpCase):
        return (await run_http(t, case))[0]
    if isinstance(case, GrpcCase):
        return await run_grpc(t, case)
    return await run_parity(t, case)


async def health(t: Targets, gen: Generator) -> str:
    """Empty when the server is ready on both protocols and serves a valid request; else what is wrong."""
    try:
        resp = await asyncio.wait_for(t.http.get("/v2/health/ready"), t.timeout_s)
        if resp.status_code != 200:
            return f"HTTP ready answered {resp.status_code}"
        code, details, data = await grpc_unary(t, "ServerReady", pb.ServerReadyRequest().SerializeToString())
        if code != "OK" or not pb.ServerReadyResponse.FromString(data).ready:
            return f"gRPC ServerReady answered {code} {details}"
        candidates = [m for m in gen.ready if not m.sequence] or gen.ready
        model = min(candidates, key=lambda m: (m.name != "add_sub", m.name))
        req = gen.valid(random.Random(0), model)
        doc, _ = http_doc(req, set())
        resp = await asyncio.wait_for(t.http.post(infer_path(model.name, ""), content=compact_json(doc)), t.timeout_s)
        if resp.status_code != 200:
            return f"valid HTTP inference on {model.name} answered {resp.status_code}: {resp.text[:200]}"
        code, details, _ = await grpc_unary(t, "ModelInfer", grpc_message(req, raw=True).SerializeToString())
        if code != "OK":
            return f"valid gRPC inference on {model.name} answered {code}: {details[:200]}"
    except Exception as exc:
        return f"health check failed: {exc!r}"
    return ""


async def fuzz(
    targets: Targets,
    gen: Generator,
    *,
    protocols: tuple[str, ...],
    cases: int,
    seed: int,
    concurrency: int = 8,
    time_limit_s: float = float("inf"),
    check_every: int = 1000,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Run ``cases`` cases of each protocol (interleaved), checking the server's health as it goes."""
    report = Report()
    start = time.monotonic()
    order: Iterator[tuple[str, int]] = ((p, i) for i in range(cases) for p in protocols)
    sem = asyncio.Semaphore(concurrency)
    pending: set[asyncio.Task[None]] = set()

    async def one(protocol: str, index: int) -> None:
        try:
            case = gen.case(protocol, seed, index)
            report.add(protocol, index, case, await run_case(targets, case))
        except Exception as exc:  # the fuzzer's own bug: counted, never silently lost
            report.add(protocol, index, HttpCase("generator", "", ""), Outcome("fuzzer-error", 0.0, repr(exc)))
        finally:
            sem.release()

    for done, (protocol, index) in enumerate(order, 1):
        if time.monotonic() - start > time_limit_s:
            break
        await sem.acquire()
        task = asyncio.create_task(one(protocol, index))
        pending.add(task)
        task.add_done_callback(pending.discard)
        if check_every and done % check_every == 0:
            await asyncio.gather(*pending)
            if problem := await health(targets, gen):
                report.health.append(f"after {done} cases: {problem}")
            if progress:
                progress(f"{done} cases, {len(report.failures)} failures, {time.monotonic() - start:.0f} s")
    await asyncio.gather(*pending)
    if problem := await health(targets, gen):
        report.health.append(f"at the end: {problem}")
    report.elapsed_s = time.monotonic() - start
    return report
