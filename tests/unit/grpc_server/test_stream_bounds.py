"""ModelStreamInfer keeps a bounded number of responses for a client that stops reading (no network)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from serve_app.grpc_server import servicer as servicer_module
from serve_app.grpc_server.servicer import InferenceServicer
from serve_app.protos import grpc_service_pb2 as pb

REQUESTS = 2_000


async def test_a_client_that_stops_reading_stops_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(servicer_module, "MAX_STREAM_INFLIGHT", 4)
    monkeypatch.setattr(servicer_module, "MAX_STREAM_PENDING", 3)
    read = 0

    async def requests() -> AsyncIterator[pb.ModelInferRequest]:
        nonlocal read
        for i in range(REQUESTS):
            read += 1
            yield pb.ModelInferRequest(model_name="m", id=str(i))

    async def answered_at_once(request: Any) -> AsyncIterator[tuple[pb.ModelStreamInferResponse, None]]:
        yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=request.id)), None

    servicer = InferenceServicer(service=None)  # type: ignore[arg-type]  # _stream_responses is replaced
    monkeypatch.setattr(servicer, "_stream_responses", answered_at_once)
    stream = servicer.ModelStreamInfer(requests(), None)
    first = await stream.__anext__()  # then the client reads no more
    assert first.infer_response.id == "0"
    stalled, last = 0, -1
    for _ in range(100_000):  # let the reader and the answers run until nothing moves any more
        await asyncio.sleep(0)
        stalled, last = (stalled + 1, last) if read == last else (0, read)
        if stalled > 200:
            break
    # answered and waiting (pending), being answered (in flight), the one taken and the one waiting for room
    assert read <= 3 + 4 + 2, read
    rest = [r.infer_response.id async for r in stream]  # reading again: every request is answered
    assert len(rest) == REQUESTS - 1 and sorted(map(int, rest)) == list(range(1, REQUESTS))
