#!/usr/bin/env python3
"""More models than fit: load on demand under a per-node budget, with requests spread by a Zipf law.

    python -m scripts.bench_on_demand [--models 1000] [--python-share 0.2] [--budget 50] [--requests 10000]
                                      [--zipf 1.1] [--concurrency 16] [--min-resident-s 1] [--nodes 1]
                                      [--server-arg=...]

Builds a repository of ``--models`` small models (ONNX ``add_sub``, and a ``--python-share`` of them the
Python backend's), starts `python -m serve_app` (its own Ray) in explicit mode with ``--load-on-demand`` and
``--max-loaded-models-per-node --budget``, loads nothing at start, then sends ``--requests`` inferences from
``--concurrency`` clients, each to a model drawn by a Zipf law (rank k with weight 1/k^s, ranks shuffled over
the models, fixed seed).  A background reader of the repository index tells which models are loaded, so each
request is counted as cold (its model was not loaded as it was sent) or loaded.  Reports errors, requests per
second, p50 of requests to loaded models, p99 of cold ones, loads and evictions (the metrics port), and the
peak resident memory of each node's processes.

``--nodes N`` (N > 1, root) runs it on the multi-node tests' cluster instead (``tests/multinode``: network
namespaces on this machine, Ray on each, the server's driver on the first, a gateway on each); the clients
send each request to the next node's gateway in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from scripts import example_models, python_models
from tests.support.net import free_port
from tests.support.soak import mib, pct, process_rss_kib, rss_by_group, server_ready, session_processes

ROW = [float(i) for i in range(16)]
ON_CPU = "instance_group [ { kind: KIND_CPU count: 1 } ]\n"  # the cluster's nodes declare GPUs they don't have


@dataclass
class Tally:
    warm_s: list[float] = field(default_factory=list)
    cold_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def build(repo: pathlib.Path, models: int, python_share: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    names = []
    for i in range(models):
        name = f"od_{i:04d}"
        if rng.random() < python_share:
            python_models.add_sub(repo, name=name)  # KIND_CPU already
        else:
            example_models.add_sub(repo, name=name, extra_config=ON_CPU)
        names.append(name)
    return names


def zipf_draws(names: list[str], count: int, s: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    ranked = list(names)
    rng.shuffle(ranked)
    weights = [1.0 / (k**s) for k in range(1, len(ranked) + 1)]
    return rng.choices(ranked, weights=weights, k=count)


@dataclass
class Running:
    """A server started for the run: its gateways' HTTP addresses, its metrics, each node's resident KiB."""

    http: list[str]  # "host:port", one per node
    metrics: str
    rss_kib: Callable[[], dict[str, int]]


def infer(http: str, model: str, batched: bool) -> None:
    shape = [1, 16] if batched else [16]
    inputs = [{"name": n, "shape": shape, "datatype": "FP32", "data": ROW} for n in ("INPUT0", "INPUT1")]
    body = json.dumps({"inputs": inputs}).encode()
    req = urllib.request.Request(f"http://{http}/v2/models/{model}/infer", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()


def loaded_models(http: str) -> set[str]:
    req = urllib.request.Request(f"http://{http}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return {e["name"] for e in json.load(r) if e.get("state") == "READY"}


def metric_totals(metrics: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(r'^(nv_model_on_demand_\w+?)\{model="[^"]*"\} (\S+)$', text, re.MULTILINE):
        out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


def server_args(repo: pathlib.Path, args: argparse.Namespace) -> list[str]:
    return [
        "--model-repository", str(repo), "--model-control-mode", "explicit", "--load-on-demand",
        "--max-loaded-models-per-node", str(args.budget), "--on-demand-min-resident-s", str(args.min_resident_s),
        "--on-demand-wait-s", "600", *args.server_arg,
    ]  # fmt: skip


def pids_rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += process_rss_kib(pid)
        except OSError:  # gone meanwhile
            pass
    return total


@contextmanager
def one_node(repo: pathlib.Path, args: argparse.Namespace, log: pathlib.Path) -> Iterator[Running]:
    """`python -m serve_app` with its own Ray on this machine."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = [sys.executable, "-m", "serve_app", *server_args(repo, args), "--host", "127.0.0.1",
           "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        t0 = time.monotonic()
        while not (server_ready(f"127.0.0.1:{http}") and b"serve_app ready" in log.read_bytes()):
            if proc.poll() is not None or time.monotonic() - t0 > args.timeout_s:
                raise RuntimeError(f"server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)

        def rss() -> dict[str, int]:
            return {"this machine": sum(kib for _, kib in rss_by_group(session_processes(proc.pid)).values())}

        yield Running([f"127.0.0.1:{http}"], f"127.0.0.1:{metrics}", rss)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextmanager
def cluster(repo: pathlib.Path, args: argparse.Namespace) -> Iterator[Running]:
    """The multi-node tests' cluster of ``--nodes`` nodes, the server on it (the repository is copied in)."""
    import shutil

    from tests.multinode import conftest as mn

    with mn.cluster_of(args.nodes) as nodes:
        shutil.copytree(repo, nodes.repo)
        mn.start_server(nodes, server_args(nodes.repo, args)[2:])
        print(f"cluster: {len(nodes.nodes)} nodes, logs in {nodes.tmp}", flush=True)

        def rss() -> dict[str, int]:
            return {n.name: pids_rss_kib(nodes.net.pids(n)) for n in nodes.nodes}

        http = [f"{n.address}:{mn.HTTP_PORT}" for n in nodes.nodes]
        yield Running(http, f"{nodes.head.address}:{mn.METRICS_PORT}", rss)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--python-share", type=float, default=0.2, help="share of the models that are Python models")
    ap.add_argument("--budget", type=int, default=50, help="--max-loaded-models-per-node")
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--zipf", type=float, default=1.1, help="the Zipf exponent s")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--min-resident-s", type=float, default=1.0, help="--on-demand-min-resident-s")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout-s", type=float, default=300.0, help="longest wait for the server to be ready")
    ap.add_argument("--server-arg", action="append", default=[], help="an extra flag for the server (repeatable)")
    ap.add_argument("--keep-log", type=pathlib.Path, help="keep the server's log here (one node)")
    ap.add_argument("--nodes", type=int, default=1, help="more than 1: on the multi-node tests' cluster")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp) / "models"
        names = build(repo, args.models, args.python_share, args.seed)
        python = {n for n in names if (repo / n / "1" / "model.py").exists()}
        draws = zipf_draws(names, args.requests, args.zipf, args.seed)
        log = args.keep_log or pathlib.Path(tmp) / "server.log"
        started = cluster(repo, args) if args.nodes > 1 else one_node(repo, args, log)
        with started as server:
            return run(server, names, python, draws, args)


def run(server: Running, names: list[str], python: set[str], draws: list[str], args: argparse.Namespace) -> int:
    drawn = len(set(draws))
    print(f"{len(names)} models ({len(python)} Python), budget {args.budget}/node on {len(server.http)} node(s), "
          f"{args.requests} requests, Zipf s={args.zipf}, {drawn} distinct models drawn", flush=True)  # fmt: skip
    head = server.http[0]
    done = threading.Event()
    snapshot: list[set[str]] = [set()]
    peak: dict[str, int] = {}

    def watch() -> None:
        while not done.is_set():
            try:
                snapshot[0] = loaded_models(head)
                for node, kib in server.rss_kib().items():
                    peak[node] = max(peak.get(node, 0), kib)
            except Exception:
                pass
            done.wait(0.25)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    tally = Tally()

    def one(item: tuple[int, str]) -> None:
        i, model = item
        cold = model not in snapshot[0]
        start = time.perf_counter()
        try:
            infer(server.http[i % len(server.http)], model, model not in python)
        except urllib.error.HTTPError as exc:
            key = f"{exc.code} {exc.read()[:120].decode(errors='replace')}"
            with tally.lock:
                tally.errors[key] = tally.errors.get(key, 0) + 1
            return
        except Exception as exc:
            with tally.lock:
                tally.errors[type(exc).__name__] = tally.errors.get(type(exc).__name__, 0) + 1
            return
        took = time.perf_counter() - start
        with tally.lock:
            (tally.cold_s if cold else tally.warm_s).append(took)

    before = metric_totals(server.metrics)
    t1 = time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(one, enumerate(draws)))
    elapsed = time.monotonic() - t1
    done.set()
    watcher.join()
    after = metric_totals(server.metrics)

    def delta(name: str) -> int:
        return int(after.get(name, 0.0) - before.get(name, 0.0))

    errors = sum(tally.errors.values())
    warm, cold = tally.warm_s, tally.cold_s  # pct() answers in ms
    print(f"errors: {errors} {dict(sorted(tally.errors.items())[:5]) if errors else ''}")
    print(f"throughput: {args.requests / elapsed:.1f} req/s over {elapsed:.1f} s")
    print(f"loaded: {len(warm)} requests, p50 {pct(warm, 50):.1f} ms" if warm else "loaded: none")
    print(f"cold: {len(cold)} requests, p99 {pct(cold, 99):.0f} ms" if cold else "cold: none")
    print(f"loads: {delta('nv_model_on_demand_loads_total')}, "
          f"evictions: {delta('nv_model_on_demand_evictions_total')}, "
          f"failed loads: {delta('nv_model_on_demand_load_failures_total')}, "
          f"requests that waited: {delta('nv_model_on_demand_waited_requests_total')}")  # fmt: skip
    memory = ", ".join(f"{node} {mib(kib):,.0f}" for node, kib in sorted(peak.items()))
    print(f"peak resident memory by node, MiB: {memory}")
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
