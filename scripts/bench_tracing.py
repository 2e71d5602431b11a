#!/usr/bin/env python3
"""What tracing costs a request: the server with tracing off, then with every request traced.

    python -m scripts.bench_tracing [--requests 3000] [--protocol http|grpc]

Starts ``python -m serve_app --local`` (one process, no Ray: the difference is the tracing, not the
hops) on add_sub twice: with Triton's defaults (trace level OFF), then with ``--trace-config
level=TIMESTAMPS --trace-config rate=1`` exporting every request's spans over OTLP/HTTP to a receiver
in this process. Each time one client sends ``--requests`` sequential requests after a warm-up. Raw
onnxruntime runs add_sub in process last. One table: requests/s, p50 and p99, and each over raw
onnxruntime.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from scripts import example_models
from scripts.bench import raw_onnxruntime, start_server, stop_server
from tests.support.net import free_port
from tests.support.otlp import OtlpReceiver


def drive(protocol: str, url: str, requests: int) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms) of ``requests`` sequential add_sub requests after a warm-up."""
    mod = httpclient if protocol == "http" else grpcclient
    client = mod.InferenceServerClient(url)
    x = np.ones((1, 16), np.float32)
    inputs = [mod.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(x)
    for _ in range(200):
        client.infer("add_sub", inputs)
    lat = np.empty(requests)
    t0 = time.perf_counter()
    for k in range(requests):
        s = time.perf_counter()
        client.infer("add_sub", inputs)
        lat[k] = time.perf_counter() - s
    elapsed = time.perf_counter() - t0
    client.close()
    return requests / elapsed, float(np.percentile(lat, 50) * 1e3), float(np.percentile(lat, 99) * 1e3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--protocol", choices=("http", "grpc"), default="http")
    args = ap.parse_args()
    rows: list[tuple[str, tuple[float, float, float]]] = []
    with tempfile.TemporaryDirectory() as tmp, OtlpReceiver() as receiver:
        repo = pathlib.Path(tmp) / "repo"
        model_dir = example_models.add_sub(repo)
        traced = ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                  "--trace-config", f"opentelemetry,url={receiver.url}"]  # fmt: skip
        for label, extra in (("tracing off", []), ("every request traced", traced)):
            ports = (free_port(), free_port(), free_port())
            log = pathlib.Path(tmp) / "server.log"
            proc = start_server(repo, ports, log, ["--local", *extra], ready=b"ready in")
            try:
                url = f"127.0.0.1:{ports[0] if args.protocol == 'http' else ports[1]}"
                rows.append((label, drive(args.protocol, url, args.requests)))
            finally:
                stop_server(proc)
            print(f"  {label}: {rows[-1][1][0]:,.0f} requests/s", flush=True)
        spans = len(receiver.spans)
        x = np.ones((1, 16), np.float32)
        raw = raw_onnxruntime(model_dir / "1" / "model.onnx", {"INPUT0": x, "INPUT1": x}, batch=1)
    print(f"\nraw onnxruntime in process, add_sub: {raw:,.0f} infer/s; spans the receiver got: {spans:,}")
    print(f"{'':<22} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'/ raw':>7} {'/ off':>7}")
    base = rows[0][1][0]
    for label, (rps, p50, p99) in rows:
        print(f"{label:<22} {rps:>8,.0f} {p50:>7.3f} {p99:>7.3f} {rps / raw:>7.4f} {rps / base:>7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
