#!/usr/bin/env python3
"""What the response cache buys: one model served with and without ``response_cache``, the same traffic.

    python -m scripts.bench_cache [--requests 2000] [--distinct 50] [--matmuls 16] [--local]

Builds ``work`` (an ONNX model of ``--matmuls`` 256-square matrix products, a few milliseconds a request)
twice: ``work_cached`` with ``response_cache { enable: true }`` and ``work`` without, and starts
``python -m serve_app --cache-config local,size=67108864`` (with Ray unless ``--local``). One client
sends ``--requests`` sequential requests to each, their inputs drawn from ``--distinct`` values (so at
most that many misses), after a warm-up of 20 requests of other values. One table: requests/s, p50 and
p99, the cache's hit rate over the measured requests (from the server's statistics), and the cached
model's requests/s over the uncached one's.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient

from scripts.bench import start_server, stop_server
from tests.e2e.models import slow_identity
from tests.support.net import free_port

CACHE_BYTES = 64 * 1024 * 1024


def warm_up(url: str, model: str) -> None:
    client = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("IN", [1, 1], "FP32")
    for k in range(20):
        inp.set_data_from_numpy(np.full((1, 1), -1.0 - k, np.float32))  # values the measured run never sends
        client.infer(model, [inp])
    client.close()


def drive(url: str, model: str, requests: int, values: np.ndarray) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms) of ``requests`` sequential requests whose inputs are drawn from
    ``values`` (the same random order for every model)."""
    client = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("IN", [1, 1], "FP32")
    order = np.random.default_rng(0).choice(values, size=requests)
    lat = np.empty(requests)
    t0 = time.perf_counter()
    for k, v in enumerate(order):
        inp.set_data_from_numpy(np.full((1, 1), v, np.float32))
        s = time.perf_counter()
        client.infer(model, [inp])
        lat[k] = time.perf_counter() - s
    elapsed = time.perf_counter() - t0
    client.close()
    return requests / elapsed, float(np.percentile(lat, 50) * 1e3), float(np.percentile(lat, 99) * 1e3)


def cache_counts(http: int, model: str) -> tuple[int, int]:
    """(hits, misses) in the server's statistics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{model}/stats", timeout=10) as r:
        inf = json.load(r)["model_stats"][0]["inference_stats"]
    return inf["cache_hit"]["count"], inf["cache_miss"]["count"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--distinct", type=int, default=50)
    ap.add_argument("--matmuls", type=int, default=16)
    ap.add_argument("--local", action="store_true", help="serve with --local (one process, no Ray)")
    args = ap.parse_args()
    values = np.arange(args.distinct, dtype=np.float32)
    rows: list[tuple[str, tuple[float, float, float], float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp) / "repo"
        repo.mkdir()
        slow_identity(repo, "work", "", size=256, matmuls=args.matmuls)
        slow_identity(repo, "work_cached", "response_cache { enable: true }\n", size=256, matmuls=args.matmuls)
        ports = (free_port(), free_port(), free_port())
        extra = ["--cache-config", f"local,size={CACHE_BYTES}"]
        if args.local:
            extra.append("--local")
        proc = start_server(repo, ports, pathlib.Path(tmp) / "server.log", extra, ready=b"ready in")
        try:
            for model in ("work", "work_cached"):
                url = f"127.0.0.1:{ports[1]}"
                warm_up(url, model)
                hits0, misses0 = cache_counts(ports[0], model)
                figures = drive(url, model, args.requests, values)
                hits, misses = cache_counts(ports[0], model)
                looked_up = hits - hits0 + misses - misses0
                rows.append((model, figures, (hits - hits0) / looked_up if looked_up else 0.0))
                print(f"  {model}: {figures[0]:,.0f} requests/s", flush=True)
        finally:
            stop_server(proc)
    print(f"\n{args.requests} sequential gRPC requests over {args.distinct} distinct inputs, {args.matmuls} matmuls")
    print(f"{'model':<12} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'hit rate':>9} {'/ uncached':>11}")
    base = rows[0][1][0]
    for model, (rps, p50, p99), rate in rows:
        print(f"{model:<12} {rps:>8,.0f} {p50:>7.3f} {p99:>7.3f} {rate:>9.3f} {rps / base:>11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
