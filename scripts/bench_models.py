#!/usr/bin/env python3
"""What a model costs: time to ready and resident memory as the repository grows, with default settings.

    python -m scripts.bench_models [--counts 1,10,50,100] [--large 2] [--timeout-s 300] [--server-arg=...]

For each N: a repository of N copies of the small ``add_sub`` model plus ``--large`` copies of the
``mlp`` example (a 2048x2048 FP32 weight, 16 MiB each); start `python -m serve_app` (its own Ray, every
setting at its default) on free ports; time until the server is ready and every model answers an
inference; sum the resident memory of every process of the server's session (the server, Ray's own
processes, the Serve replicas); stop it.  Each start is bounded by ``--timeout-s``: a server that is
not ready by then is reported as such, and the run goes on.  The table ends with the memory each
added model costs (the slope between the smallest and largest N).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from scripts import example_models
from tests.support.net import free_port
from tests.support.soak import mib, rss_by_group, session_processes, short


@dataclass
class Result:
    models: int
    ready_s: float | None
    answered: int
    rss_kib: int
    groups: dict[str, tuple[int, int]]  # process group -> (processes, resident KiB)
    note: str = ""


def build(repo: pathlib.Path, small: int, large: int) -> list[str]:
    names = []
    for i in range(small):
        names.append(example_models.add_sub(repo, name=f"add_sub_{i:03d}").name)
    for i in range(large):
        names.append(example_models.mlp(repo, name=f"mlp_{i}").name)
    return names


def ready(http: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def answers(http: int, model: str) -> bool:
    """One inference with zeros for every input of the model (from its metadata)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{model}", timeout=10) as r:
            meta = json.load(r)
        inputs = []
        for t in meta["inputs"]:
            shape = [1 if d < 0 else d for d in t["shape"]]
            count = 1
            for d in shape:
                count *= d
            inputs.append({"name": t["name"], "shape": shape, "datatype": t["datatype"], "data": [0] * count})
        body = json.dumps({"inputs": inputs}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/{model}/infer", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status == 200
    except Exception:
        return False


def run(count: int, large: int, timeout_s: float, extra: list[str], keep: pathlib.Path | None) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp) / "models"
        names = build(repo, count, large)
        http, grpc, metrics = free_port(), free_port(), free_port()
        log = (keep or pathlib.Path(tmp)) / f"server_{count}.log"
        cmd = [sys.executable, "-m", "serve_app", "--model-repository", str(repo), "--host", "127.0.0.1",
               "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics), *extra]  # fmt: skip
        t0 = time.monotonic()
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            ready_s = None
            while time.monotonic() - t0 < timeout_s and proc.poll() is None:
                if ready(http) and b"serve_app ready" in log.read_bytes():
                    ready_s = time.monotonic() - t0
                    break
                time.sleep(0.2)
            answered = 0
            if ready_s is not None:
                with ThreadPoolExecutor(8) as pool:
                    answered = sum(pool.map(lambda m: answers(http, m), names))
                ready_s = time.monotonic() - t0  # ready, and every model answered
            groups = rss_by_group(session_processes(proc.pid))
            rss = sum(kib for _, kib in groups.values())
            note = "" if ready_s is not None else f"not ready after {timeout_s:.0f} s"
            if proc.poll() is not None and ready_s is None:
                note = f"server exited ({proc.returncode})"
            return Result(len(names), ready_s, answered, rss, groups, note)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--counts", default="1,10,50,100", help="small models per run")
    ap.add_argument("--large", type=int, default=2, help="mlp models added to every run")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="longest wait for one server to be ready")
    ap.add_argument("--server-arg", action="append", default=[], help="an extra flag for the server (repeatable)")
    ap.add_argument("--keep-logs", type=pathlib.Path, help="keep each server's log in this directory")
    args = ap.parse_args(argv)
    if args.keep_logs:
        args.keep_logs.mkdir(parents=True, exist_ok=True)
    results = []
    for n in (int(c) for c in args.counts.split(",")):
        r = run(n, args.large, args.timeout_s, args.server_arg, args.keep_logs)
        results.append(r)
        ready = f"{r.ready_s:.1f} s" if r.ready_s is not None else "never"
        biggest = sorted(r.groups.items(), key=lambda item: -item[1][1])[:5]  # group -> (processes, KiB)
        top = ", ".join(f"{short(g)} {mib(kib):.0f}" for g, (_, kib) in biggest)
        print(f"{r.models:>4} models: ready {ready}, {r.answered}/{r.models} answered, "
              f"{mib(r.rss_kib):,.0f} MiB resident ({top}) {r.note}", flush=True)  # fmt: skip
    print("\n| models | ready after (every model answered) | server + Ray resident memory | note |")
    print("| --- | --- | --- | --- |")
    for r in results:
        ready = f"{r.ready_s:.1f} s" if r.ready_s is not None else "never"
        print(f"| {r.models} | {ready} | {mib(r.rss_kib):,.0f} MiB | {r.note} |")
    if len(results) > 1 and results[-1].models > results[0].models:
        per = (results[-1].rss_kib - results[0].rss_kib) / (results[-1].models - results[0].models)
        print(f"\nmemory per added model: {mib(int(per)):.1f} MiB ({results[0].models} to {results[-1].models} models)")
    return 0 if all(r.ready_s is not None and r.answered == r.models for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
