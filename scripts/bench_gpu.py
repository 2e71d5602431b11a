#!/usr/bin/env python3
"""TorchScript on CUDA served by the local server, against raw in-process PyTorch, in one bounded run.

    python -m scripts.bench_gpu [--seconds 5] [--concurrency 16] [--protocols http,grpc] [--out FILE.json]
    python -m scripts.bench_gpu --dry-run    # the same steps on the CPU with a small model (no figures)

Builds the MLP of tests/support/gpu_models.py twice, KIND_GPU on GPU 0: ``ts_mlp`` (no batcher) and
``ts_mlp_db`` (``dynamic_batching {}``), starts ``python -m serve_app --local`` on free ports, and loads
it from client processes (threads with one keep-alive connection each): ``ts_mlp`` at concurrency 1,
``ts_mlp_db`` at ``--concurrency``. The server's statistics give the batches the batcher formed. After
the server stops, the same module runs in this process on the GPU (inputs from numpy to the device and
outputs back, as the server does) at batch 1 and at the mean batch formed. One table: infer/s, p50,
p99, the mean batch, raw PyTorch's infer/s at that batch, and served over raw.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pathlib
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from tests.support import gpu_models
from tests.support.kserve_client import GrpcClient, HttpClient, batch_counts
from tests.support.net import free_port

LOCAL_READY = b"serve_app (local, no Ray) ready"
OUTPUTS = ["OUTPUT__0", "DEVICE__1"]
SPAWN_S = 3.0  # time for the client processes to start, before the warmup


@dataclass
class Served:
    model: str
    protocol: str
    concurrency: int
    infer_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    batch: float = 1.0  # mean batch size the server formed
    sizes: dict[int, int] = field(default_factory=dict)
    device: int = -2  # the CUDA ordinal the model reported (-1: the CPU)
    raw_infer_s: float = 0.0  # raw PyTorch at round(batch)
    error: str = ""

    @property
    def ratio(self) -> float:
        return self.infer_s / self.raw_infer_s if self.raw_infer_s else float("nan")


def client_load(
    port: int, protocol: str, model: str, threads: int, start: float, seconds: float
) -> tuple[int, list[float], int]:
    """One client process: ``threads`` closed loops from now until ``start + seconds`` (``time.time()``, the
    same window in every process); (requests completed in the window, their latencies in ms, the device
    the model reported)."""
    import threading

    x = np.random.default_rng(port).standard_normal((1, gpu_models.MLP_IN)).astype(np.float32)
    stop = start + seconds
    lock = threading.Lock()
    latencies: list[float] = []
    devices: set[int] = set()

    def loop() -> None:
        client = HttpClient(port) if protocol == "http" else GrpcClient(port)
        mine: list[float] = []
        try:
            while True:
                t0 = time.time()
                if t0 >= stop and devices:  # every client sends one request at least: the device is known
                    break
                got = client.infer(model, {"INPUT__0": x}, OUTPUTS)
                t1 = time.time()
                if t0 >= start and t1 <= stop:
                    mine.append((t1 - t0) * 1000)
                if not devices:
                    devices.add(int(got["DEVICE__1"].ravel()[0]))
        finally:
            client.close()
            with lock:
                latencies.extend(mine)

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return len(latencies), latencies, next(iter(devices), -2)


def measure(run: Served, port: int, stats: HttpClient, procs: int, warmup_s: float, seconds: float) -> None:
    before = batch_counts(stats.get_json(f"/v2/models/{run.model}/stats")["model_stats"][0])
    if procs < 1:  # the clients' threads in this process (the dry run: no process to start)
        start = time.time() + warmup_s
        results = [client_load(port, run.protocol, run.model, run.concurrency, start, seconds)]
    else:
        procs = min(procs, run.concurrency)
        split = [run.concurrency // procs + (i < run.concurrency % procs) for i in range(procs)]
        start = time.time() + SPAWN_S + warmup_s  # every process loads the server before the window opens
        ctx = multiprocessing.get_context("spawn")  # the parent holds PyTorch: start clients clean
        with ProcessPoolExecutor(procs, mp_context=ctx) as pool:
            futures = [pool.submit(client_load, port, run.protocol, run.model, n, start, seconds) for n in split]
            results = [f.result() for f in futures]
    after = batch_counts(stats.get_json(f"/v2/models/{run.model}/stats")["model_stats"][0])
    latencies = sorted(lat for _, lats, _ in results for lat in lats)
    run.infer_s = sum(n for n, _, _ in results) / seconds
    if latencies:
        run.p50_ms = latencies[len(latencies) // 2]
        run.p99_ms = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    run.device = results[0][2]
    run.sizes = {b: n - before.get(b, 0) for b, n in after.items() if n > before.get(b, 0)}
    executions = sum(run.sizes.values())
    run.batch = sum(b * n for b, n in run.sizes.items()) / executions if executions else 1.0


def raw_torch(model_file: pathlib.Path, batch: int, device: str, seconds: float) -> float:
    """In-process inferences per second at ``batch``: numpy in, to the device, forward, back to numpy."""
    import torch

    module = torch.jit.load(str(model_file), map_location=device).eval()
    x = np.random.default_rng(batch).standard_normal((batch, gpu_models.MLP_IN)).astype(np.float32)

    def once() -> None:
        with torch.inference_mode():
            out = module(torch.from_numpy(x).to(device))
            out[0].cpu().numpy()

    for _ in range(10):
        once()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 10:
        once()
        n += 1
    return n * batch / (time.perf_counter() - t0)


def cuda_device() -> str:
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured window of each run")
    ap.add_argument("--warmup", type=float, default=2.0, help="load before each window, not counted")
    ap.add_argument("--concurrency", type=int, default=16, help="clients on the batched model")
    ap.add_argument("--protocols", default="http,grpc")
    ap.add_argument(
        "--client-procs", type=int, default=8, help="client processes sharing the clients (0: threads here)"
    )
    ap.add_argument("--out", type=pathlib.Path, help="write the figures here as JSON")
    ap.add_argument("--log-dir", type=pathlib.Path, help="keep the server's log here")
    ap.add_argument("--dry-run", action="store_true", help="on the CPU, a small MLP, short windows: no figures")
    args = ap.parse_args(argv)
    from scripts.bench import start_server, stop_server  # imports onnx: kept out of the client processes

    device = cuda_device()
    if args.dry_run:
        args.seconds, args.warmup, args.client_procs = 0.3, 0.1, 0
        args.concurrency = min(args.concurrency, 4)
    elif device == "cpu":
        print("error: PyTorch finds no CUDA GPU here; --dry-run runs the steps on the CPU", file=sys.stderr)
        return 2
    sizes: dict[str, int] = dict(gpu_models.CPU_MLP) if args.dry_run else {}
    started = time.monotonic()
    runs: list[Served] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp) / "repo"
        plain = gpu_models.ts_mlp(repo, "ts_mlp", **sizes)
        gpu_models.ts_mlp(repo, "ts_mlp_db", extra=gpu_models.batching(True), **sizes)
        ports = (free_port(), free_port(), free_port())
        log = (args.log_dir or pathlib.Path(tmp)) / "server-bench.log"
        proc = start_server(repo, ports, log, ["--local"], ready=LOCAL_READY)
        try:
            stats = HttpClient(ports[0])
            for protocol in args.protocols.split(","):
                port = ports[0] if protocol == "http" else ports[1]
                for model, conc in (("ts_mlp", 1), ("ts_mlp_db", args.concurrency)):
                    run = Served(model, protocol, conc)
                    try:
                        measure(run, port, stats, args.client_procs, args.warmup, args.seconds)
                        if not args.dry_run and run.device != 0:
                            run.error = f"the model ran on device {run.device}, not cuda:0"
                    except Exception as exc:
                        run.error = repr(exc)[:400]
                    runs.append(run)
                    print(f"  {model:<10} {protocol:<4} c={conc:<3} {run.infer_s:9,.0f}/s  batch {run.batch:.1f}",
                          flush=True)  # fmt: skip
            stats.close()
        finally:
            stop_server(proc)
        # Raw PyTorch alone on the device, at batch 1 and at each batch the server formed.
        raw: dict[int, float] = {}
        for run in runs:
            b = max(1, round(run.batch))
            if b not in raw:
                raw[b] = raw_torch(plain / "1" / "model.pt", b, device, args.seconds)
            run.raw_infer_s = raw[b]
    report(runs, raw, device, args.dry_run, time.monotonic() - started)
    if args.out:
        args.out.write_text(json.dumps(
            {"device": device, "dry_run": args.dry_run, "raw_infer_s": raw,
             "runs": [asdict(r) | {"ratio": r.ratio} for r in runs]}, indent=2))  # fmt: skip
    return 1 if any(r.error for r in runs) else 0


def report(runs: list[Served], raw: dict[int, float], device: str, dry_run: bool, elapsed: float) -> None:
    print()
    print(f"raw PyTorch in-process on {device}, inferences/s: "
          + ", ".join(f"batch {b}: {v:,.0f}" for b, v in sorted(raw.items())))  # fmt: skip
    head = f"{'model':<10} {'proto':<5} {'conc':>4} {'infer/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'batch':>6}"
    print(head + f" {'raw/s':>9} {'served/raw':>10} {'device':>6}")
    for r in runs:
        if r.error:
            print(f"{r.model:<10} {r.protocol:<5} {r.concurrency:>4}  failed: {r.error}")
            continue
        print(f"{r.model:<10} {r.protocol:<5} {r.concurrency:>4} {r.infer_s:9,.0f} {r.p50_ms:7.2f} {r.p99_ms:7.2f} "
              f"{r.batch:6.1f} {r.raw_infer_s:9,.0f} {r.ratio:10.2f} {r.device:>6}")  # fmt: skip
    for protocol in sorted({r.protocol for r in runs}):
        one = next((r for r in runs if r.protocol == protocol and r.concurrency == 1 and not r.error), None)
        many = next((r for r in runs if r.protocol == protocol and r.concurrency > 1 and not r.error), None)
        if one and many and one.infer_s:
            print(f"{protocol}: the batcher at c={many.concurrency} serves {many.infer_s / one.infer_s:.1f}x "
                  f"batch 1 at c=1")  # fmt: skip
    note = " (dry run on the CPU: not figures)" if dry_run else ""
    print(f"done in {elapsed:.0f}s{note}")


if __name__ == "__main__":
    sys.exit(main())
