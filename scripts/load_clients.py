"""Closed-loop load from client processes, for the device benchmarks (no tritonclient on that machine).

Each process runs ``threads`` loops over one keep-alive connection each (``tests/support/kserve_client``)
from a shared start time to its end, optionally on CPUs of its own (``cpus``: the load generator kept
apart from the server it measures), and returns what completed inside the window.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

SPAWN_S = 2.0  # time for the client processes to start, before the warmup


@dataclass
class Load:
    """What one load run measured."""

    completed: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    first: dict[str, list[float]] = field(default_factory=dict)  # one answer's outputs (flattened)
    errors: list[str] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        return self.completed / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        lat = sorted(self.latencies_ms)
        return lat[min(len(lat) - 1, int(len(lat) * q))] if lat else 0.0


def client_process(
    port: int,
    protocol: str,
    model: str,
    inputs: dict[str, np.ndarray],
    outputs: Sequence[str],
    threads: int,
    start: float,
    seconds: float,
    cpus: Sequence[int] = (),
) -> tuple[int, list[float], dict[str, list[float]], list[str]]:
    """One process's loops: (completed in the window, their latencies in ms, one answer, errors)."""
    from tests.support.kserve_client import GrpcClient, HttpClient

    if cpus:
        os.sched_setaffinity(0, set(cpus))
    stop = start + seconds
    lock = threading.Lock()
    latencies: list[float] = []
    first: dict[str, list[float]] = {}
    errors: list[str] = []

    def loop() -> None:
        client = HttpClient(port) if protocol == "http" else GrpcClient(port)
        mine: list[float] = []
        try:
            while True:
                t0 = time.time()
                if t0 >= stop:
                    break
                got = client.infer(model, inputs, list(outputs))
                t1 = time.time()
                if t0 >= start and t1 <= stop:
                    mine.append((t1 - t0) * 1000)
                if not first:
                    with lock:
                        first.update({k: v.ravel().tolist()[:4] for k, v in got.items()})
        except Exception as exc:
            with lock:
                errors.append(repr(exc)[:300])
        finally:
            client.close()
            with lock:
                latencies.extend(mine)

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return len(latencies), latencies, first, errors


def run_load(
    port: int,
    protocol: str,
    model: str,
    inputs: dict[str, np.ndarray],
    outputs: Sequence[str],
    concurrency: int,
    seconds: float,
    *,
    procs: int = 8,
    warmup_s: float = 1.0,
    cpus: Sequence[int] = (),
) -> Load:
    """``concurrency`` loops spread over ``procs`` spawned processes (0: threads in this process)."""
    if procs < 1:
        start = time.time() + warmup_s
        results = [client_process(port, protocol, model, inputs, outputs, concurrency, start, seconds, cpus)]
    else:
        procs = min(procs, concurrency)
        split = [concurrency // procs + (i < concurrency % procs) for i in range(procs)]
        start = time.time() + SPAWN_S + warmup_s
        ctx = multiprocessing.get_context("spawn")  # the parent may hold PyTorch or Ray: start clients clean
        with ProcessPoolExecutor(procs, mp_context=ctx) as pool:
            futures = [
                pool.submit(client_process, port, protocol, model, inputs, outputs, n, start, seconds, cpus)
                for n in split
            ]
            results = [f.result() for f in futures]
    out = Load(seconds=seconds)
    for n, lat, first, errors in results:
        out.completed += n
        out.latencies_ms.extend(lat)
        out.first = out.first or first
        out.errors.extend(errors)
    return out
