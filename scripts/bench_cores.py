#!/usr/bin/env python3
"""How serve_app's throughput follows the gateways it runs on a machine with many cores, beside Triton's on
the same models and the same cores, in one bounded run.

    python -m scripts.bench_cores [--gateways 1,2,4,8] [--seconds 3] [--client-cpus 4] [--out F.json]
    python -m scripts.bench_cores --triton DIR [--only triton]   # Triton's rows (DIR: triton.tar.xz unpacked)
    python -m scripts.bench_cores --dry-run                      # the steps, short, on any machine

The yardstick's models (the Triton side-by-side's): ``py_add_sub`` (Triton's Python add_sub, FP32 [16],
``max_batch_size: 8``, one CPU instance), ``py_add_sub_db`` (the same with ``dynamic_batching``) and
serve_app's ONNX ``add_sub``. The load generator's processes run on the last ``--client-cpus`` cores and
the server on the others (``sched_setaffinity``, as ``taskset`` does), so the two don't share a core.
serve_app runs once per ``--gateways`` value (``--gateway-replicas``): concurrency 1 and the higher
concurrency with one gateway, the higher one alone with more. One table: requests/s, p50, p99 and the
ratio to Triton's row at the same concurrency.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from scripts import example_models, python_models
from scripts.load_clients import run_load
from tests.support.net import free_port

PY_MODELS = ("py_add_sub", "py_add_sub_db")
ONNX = "add_sub"
INPUTS = ("INPUT0", "INPUT1")
OUTPUTS = ["OUTPUT0", "OUTPUT1"]
ONE_CPU_INSTANCE = "instance_group [ { count: 1 kind: KIND_CPU } ]\n"


@dataclass
class Row:
    server: str  # "serve_app gN" or "triton"
    model: str
    protocol: str
    concurrency: int
    per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    error: str = ""


def build(repo: pathlib.Path) -> None:
    """The yardstick's three models: Triton's add_sub Python model with and without the batcher, and ONNX."""
    for name in PY_MODELS:
        extra = "dynamic_batching { }\n" if name.endswith("_db") else ""
        python_models.add_sub(repo, name, max_batch_size=8, extra=extra)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace("instance_group [ { kind: KIND_CPU } ]", ONE_CPU_INSTANCE))
    example_models.add_sub(repo, name=ONNX)


def server_cpus(client_cpus: int) -> tuple[list[int], list[int]]:
    """(the server's cores, the load generator's): the last ``client_cpus`` cores for the clients."""
    cores = sorted(os.sched_getaffinity(0))
    if client_cpus <= 0 or len(cores) <= client_cpus:
        return cores, []
    return cores[:-client_cpus], cores[-client_cpus:]


def measure(row: Row, port: int, args: argparse.Namespace, clients: list[int]) -> None:
    rng = np.random.default_rng(row.concurrency)
    inputs = {n: rng.standard_normal((1, 16)).astype(np.float32) for n in INPUTS}
    try:
        load = run_load(port, row.protocol, row.model, inputs, OUTPUTS, row.concurrency, args.seconds,
                        procs=args.client_procs, warmup_s=args.warmup, cpus=clients)  # fmt: skip
        row.per_s, row.p50_ms, row.p99_ms = load.per_s, load.percentile(0.5), load.percentile(0.99)
        row.error = load.errors[0] if load.errors else ""
    except Exception as exc:
        row.error = repr(exc)[:300]
    print(f"  {row.server:<12} {row.model:<14} {row.protocol:<4} c={row.concurrency:<3} {row.per_s:9,.0f}/s"
          f"{'  ' + row.error if row.error else ''}", flush=True)  # fmt: skip


def serve_rows(
    start: Callable[[], subprocess.Popen[bytes]],
    stop: Callable[[subprocess.Popen[bytes]], None],
    rows: list[Row],
    ports: tuple[int, int, int],
    cores: list[int],
    clients: list[int],
    args: argparse.Namespace,
) -> None:
    """Start a server on ``cores`` (it and every process it starts inherit them), measure ``rows`` from the
    ``clients`` cores, stop it."""
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cores))
    try:
        proc = start()
    finally:
        os.sched_setaffinity(0, own)
    try:
        for row in rows:
            measure(row, ports[0] if row.protocol == "http" else ports[1], args, clients)
    finally:
        stop(proc)


def run_serve_app(gateways: int, repo: pathlib.Path, args: argparse.Namespace, log_dir: pathlib.Path) -> list[Row]:
    from scripts.bench import start_server, stop_server

    cores, clients = server_cpus(args.client_cpus)
    first = gateways == min(int(x) for x in args.gateways.split(","))
    concurrency = [1, args.concurrency] if first else [args.concurrency]
    rows = [Row(f"serve_app g{gateways}", m, p, c) for m in (*PY_MODELS, ONNX) for p in ("http", "grpc")
            for c in concurrency]  # fmt: skip
    ports = (free_port(), free_port(), free_port())
    extra = ["--gateway-replicas", str(gateways), "--num-cpus", str(len(cores)),
             "--object-store-memory", str(512 * 2**20)]  # fmt: skip
    log = log_dir / f"server-cores-g{gateways}.log"
    serve_rows(lambda: start_server(repo, ports, log, extra), stop_server, rows, ports, cores, clients, args)
    return rows


def run_triton(triton: pathlib.Path, repo: pathlib.Path, args: argparse.Namespace, log_dir: pathlib.Path) -> list[Row]:
    from scripts.triton_server import start_triton, stop_triton

    cores, clients = server_cpus(args.client_cpus)
    rows = [Row("triton", m, p, c) for m in PY_MODELS for p in ("http", "grpc") for c in (1, args.concurrency)]
    py_repo = repo.parent / "triton_repo"  # Triton's wheel has no onnxruntime backend: its Python models
    py_repo.mkdir(exist_ok=True)
    for m in PY_MODELS:
        if not (py_repo / m).exists():
            (py_repo / m).symlink_to(repo / m)
    ports = (free_port(), free_port(), free_port())
    log = log_dir / "server-cores-triton.log"
    serve_rows(lambda: start_triton(triton, py_repo, ports, log), stop_triton, rows, ports, cores, clients, args)
    return rows


def report(rows: list[Row], cores: int, elapsed: float, dry_run: bool) -> None:
    triton = {(r.model, r.protocol, r.concurrency): r.per_s for r in rows if r.server == "triton" and not r.error}
    print(f"\n{cores} cores; requests/s (ratio to Triton at the same concurrency)")
    head = f"{'server':<12} {'model':<14} {'proto':<5} {'conc':>4} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7}"
    print(head + f" {'/Triton':>8}")
    for r in rows:
        if r.error:
            print(f"{r.server:<12} {r.model:<14} {r.protocol:<5} {r.concurrency:>4}  failed: {r.error}")
            continue
        t = triton.get((r.model, r.protocol, r.concurrency))
        ratio = f"{r.per_s / t:8.2f}" if t and r.server != "triton" else f"{'':>8}"
        print(f"{r.server:<12} {r.model:<14} {r.protocol:<5} {r.concurrency:>4} {r.per_s:9,.0f} {r.p50_ms:7.2f} "
              f"{r.p99_ms:7.2f} {ratio}")  # fmt: skip
    print(f"done in {elapsed:.0f}s{' (dry run: not figures)' if dry_run else ''}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateways", default="1,2,4,8", help="--gateway-replicas values, one server each")
    ap.add_argument("--concurrency", type=int, default=64, help="the higher concurrency")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--client-cpus", type=int, default=4, help="cores kept for the load generator")
    ap.add_argument("--client-procs", type=int, default=4, help="load generator processes (0: threads here)")
    ap.add_argument("--triton", type=pathlib.Path, help="unpacked triton.tar.xz: Triton's rows too")
    ap.add_argument("--only", choices=("serve_app", "triton"))
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--log-dir", type=pathlib.Path)
    ap.add_argument("--dry-run", action="store_true", help="one gateway count, short windows: the steps run")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.gateways, args.seconds, args.warmup, args.client_procs, args.concurrency = "2", 0.3, 0.1, 0, 4
        args.client_cpus = 0 if len(os.sched_getaffinity(0)) < 4 else 1
    started = time.monotonic()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp) / "repo"
        build(repo)
        log_dir = args.log_dir or pathlib.Path(tmp)
        if args.only in (None, "triton") and args.triton:
            try:
                rows += run_triton(args.triton, repo, args, log_dir)
            except SystemExit as exc:
                rows.append(Row("triton", "-", "-", 0, error=str(exc)[-300:]))
        if args.only in (None, "serve_app"):
            for g in (int(x) for x in args.gateways.split(",")):
                rows += run_serve_app(g, repo, args, log_dir)
    report(rows, len(os.sched_getaffinity(0)), time.monotonic() - started, args.dry_run)
    if args.out:
        args.out.write_text(json.dumps({"cores": len(os.sched_getaffinity(0)), "dry_run": args.dry_run,
                                        "rows": [asdict(r) for r in rows]}, indent=2))  # fmt: skip
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
