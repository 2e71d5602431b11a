#!/usr/bin/env python3
"""What the rate limiter costs a request: one model's scheduler in process, with and without it.

    python -m scripts.bench_rate_limiter [--requests 20000]

Drives :class:`~serve_app.scheduling.model_scheduler.ModelScheduler` with an instance that answers at once
(no network, no model), sequentially, so the difference is the scheduler's own work: with the limiter
each execution asks for its model's resource, gets it, and gives it back.  Prints microseconds per request
for both and the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
from google.protobuf import text_format

from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferTensor
from serve_app.protos import model_config_pb2 as mc
from serve_app.scheduling.model_scheduler import ModelScheduler
from serve_app.scheduling.rate_limiter import RateLimiter

CONFIG = """
name: "m"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 1 } ] } } ]
"""


async def instance(executions: list[Execution]) -> list[ExecutionResult]:
    return [ExecutionResult(outputs={"OUT": e.inputs["IN"]}) for e in executions]


async def per_request_us(limiter: RateLimiter | None, requests: int) -> float:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    sched = ModelScheduler(config, ModelSignature.from_config(config, "1"), instance, capacity=1, limiter=limiter)
    data = np.ones((1, 4), np.float32)
    request = InferRequest("m", inputs=[InferTensor("IN", "FP32", (1, 4), data)])
    options = RequestOptions.parse(request, sched.signature, batch_size=1, sequence_model=False)
    for _ in range(1000):
        await sched.submit(request, options, time.monotonic_ns())
    t0 = time.perf_counter()
    for _ in range(requests):
        await sched.submit(request, options, time.monotonic_ns())
    return (time.perf_counter() - t0) / requests * 1e6


async def run(requests: int) -> None:
    off = min([await per_request_us(None, requests) for _ in range(3)])
    on = min([await per_request_us(RateLimiter(), requests) for _ in range(3)])
    print(f"{requests} sequential requests, best of 3")
    print(f"{'':<18} {'us/request':>10}")
    print(f"{'no rate limiter':<18} {off:>10.1f}")
    print(f"{'rate limiter':<18} {on:>10.1f}")
    print(f"{'difference':<18} {on - off:>10.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000)
    asyncio.run(run(ap.parse_args().requests))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
