#!/usr/bin/env python3
"""Benchmark serve_app against raw onnxruntime, with and without dynamic batching, in one bounded run.

    scripts/bench [--models add_sub,mlp] [--concurrency 1,4,16] [--protocols http,grpc]
                  [--batching off,on] [--interval-ms 3000] [--server-arg=--max-inflight-per-instance=2]

Builds the models with scripts/example_models.py (``<model>`` without dynamic batching and
``<model>_db`` with ``dynamic_batching {}``), starts `python -m serve_app` on free ports, loads each
model with Triton's perf_analyzer (installed into .pa/ by scripts/install_perf_analyzer.sh when
missing) and reads the server's statistics after each run to learn the batch sizes the batcher
formed.  Raw onnxruntime is then measured in-process (same session options as the server) at batch
1 and at each formed batch size, after the server has stopped, so the two never share the CPU.  One
table: infer/s, p50, p99, the mean batch formed, raw onnxruntime's infer/s at that batch size, and
the ratio between the two.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np

from scripts import example_models
from tests.support.net import free_port
from tests.support.paths import ROOT

PA = ROOT / ".pa" / "perf_analyzer"


@dataclass
class Run:
    model: str
    batching: bool
    protocol: str
    conc: int
    infer_s: float = float("nan")
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    batch: float = 1.0  # mean batch size the server formed
    sizes: dict[int, int] = field(default_factory=dict)  # batch size -> executions
    error: str = ""


def build(repo: pathlib.Path, models: list[str]) -> dict[str, tuple[pathlib.Path, dict[str, np.ndarray]]]:
    """Each model twice: as is, and as ``<name>_db`` with a dynamic batcher."""
    out = {}
    for name in models:
        if name == "add_sub":
            d = example_models.add_sub(repo)
            example_models.add_sub(repo, name="add_sub_db", dynamic_batching=True)
            x = np.ones((1, 16), np.float32)
            out[name] = (d / "1" / "model.onnx", {"INPUT0": x, "INPUT1": x})
        elif name == "mlp":
            d = example_models.mlp(repo)
            example_models.mlp(repo, name="mlp_db", dynamic_batching=True)
            out[name] = (d / "1" / "model.onnx", {"INPUT0": np.ones((1, example_models.MLP_IN_DIM), np.float32)})
        else:
            raise SystemExit(f"unknown model {name}")
    return out


def raw_onnxruntime(model_file: pathlib.Path, feeds: dict[str, np.ndarray], batch: int, seconds: float = 3.0) -> float:
    """In-process inferences per second at ``batch`` (session.run calls x batch): the server's limit."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    feeds = {k: np.repeat(v, batch, axis=0) for k, v in feeds.items()}
    for _ in range(5):
        sess.run(None, feeds)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 5:
        sess.run(None, feeds)
        n += 1
    return n * batch / (time.perf_counter() - t0)


def start_server(
    repo: pathlib.Path,
    ports: tuple[int, int, int],
    log: pathlib.Path,
    extra: list[str],
    ready: bytes = b"serve_app ready",
) -> subprocess.Popen[bytes]:
    """``python -m serve_app`` on ``ports`` (HTTP, gRPC, metrics), once ready and its log says ``ready``."""
    http, grpc, metrics = ports
    cmd = [sys.executable, "-m", "serve_app", "--model-repository", str(repo), "--host", "127.0.0.1",
           "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics), *extra]  # fmt: skip
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as r:
                if r.status == 200 and ready in log.read_bytes():
                    return proc
        except Exception:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("server did not become ready")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def batch_counts(http: int, model: str) -> dict[int, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def perf_analyzer(run: Run, url: str, interval_ms: int, out: pathlib.Path) -> None:
    name = f"{run.model}_db" if run.batching else run.model
    cmd = [str(PA), "-m", name, "-u", url, "-i", run.protocol, "--concurrency-range", f"{run.conc}:{run.conc}",
           "--measurement-interval", str(interval_ms), "-s", "30", "--max-trials", "4", "-f", str(out)]  # fmt: skip
    out.unlink(missing_ok=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if proc.returncode != 0 or not out.exists():
        run.error = (proc.stdout + proc.stderr)[-600:]
        return
    row = next(csv.DictReader(out.open()))
    run.infer_s = float(row["Inferences/Second"])
    run.p50_ms = float(row["p50 latency"]) / 1000
    run.p99_ms = float(row["p99 latency"]) / 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="add_sub,mlp")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--protocols", default="http,grpc")
    ap.add_argument("--batching", default="off,on", help="off, on, or both (the default)")
    ap.add_argument("--interval-ms", type=int, default=3000)
    ap.add_argument("--server-arg", action="append", default=[], help="extra `python -m serve_app` option")
    args = ap.parse_args()
    if not PA.exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "install_perf_analyzer.sh")], check=True, cwd=ROOT)
    models = args.models.split(",")
    modes = [m == "on" for m in args.batching.split(",")]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp) / "repo"
        built = build(repo, models)
        ports = (free_port(), free_port(), free_port())
        proc = start_server(repo, ports, pathlib.Path(tmp) / "server.log", args.server_arg)
        runs: list[Run] = []
        try:
            for m in models:
                for batching in modes:
                    for protocol in args.protocols.split(","):
                        url = f"127.0.0.1:{ports[0] if protocol == 'http' else ports[1]}"
                        for c in (int(x) for x in args.concurrency.split(",")):
                            run = Run(m, batching, protocol, c)
                            name = f"{m}_db" if batching else m
                            before = batch_counts(ports[0], name)
                            perf_analyzer(run, url, args.interval_ms, pathlib.Path(tmp) / "pa.csv")
                            after = batch_counts(ports[0], name)
                            run.sizes = {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}
                            execs = sum(run.sizes.values())
                            run.batch = sum(k * n for k, n in run.sizes.items()) / execs if execs else 1.0
                            runs.append(run)
                            print(f"  {name:<10} {protocol:<4} c={c:<3} {run.infer_s:9,.0f}/s", flush=True)
        finally:
            stop_server(proc)
        # Raw onnxruntime, alone on the machine, at batch 1 and at each batch size the server formed.
        time.sleep(5)  # let Ray's processes finish exiting
        raw: dict[tuple[str, int], float] = {}
        for run in runs:
            for b in {1, max(1, round(run.batch))}:
                if (run.model, b) not in raw:
                    raw[(run.model, b)] = raw_onnxruntime(*built[run.model], batch=b)
    print()
    print("raw onnxruntime in-process (same session options), inferences/s: " + ", ".join(
        f"{m} batch {b}: {v:,.0f}" for (m, b), v in sorted(raw.items())))  # fmt: skip
    head = f"{'model':<8} {'batcher':<7} {'proto':<5} {'conc':>4} {'infer/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
    print(head + f" {'batch':>6} {'raw ORT/s':>10} {'ratio':>6}")
    for r in runs:
        if r.error:
            print(f"{r.model:<8} {'on' if r.batching else 'off':<7} {r.protocol:<5} {r.conc:>4}  failed: {r.error}")
            continue
        b = max(1, round(r.batch))
        limit = raw[(r.model, b)]
        print(
            f"{r.model:<8} {'on' if r.batching else 'off':<7} {r.protocol:<5} {r.conc:>4} {r.infer_s:>9,.0f} "
            f"{r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {r.batch:>6.1f} {limit:>10,.0f} {r.infer_s / limit:>6.3f}"
        )
    print(f"\n(ratio: server infer/s over raw onnxruntime infer/s at the mean batch the server formed; "
          f"{time.monotonic() - started:.0f} s in all)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
