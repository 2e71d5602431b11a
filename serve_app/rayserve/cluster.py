"""What the Ray cluster has: its GPUs and the per-GPU resources its nodes declare."""

from __future__ import annotations

import time
from typing import Any

import ray

from serve_app.placement import DEFAULT_GPU_RESOURCE_PREFIX, ClusterGpus
from serve_app.settings import ServerSettings


def cluster_gpus(prefix: str = DEFAULT_GPU_RESOURCE_PREFIX) -> ClusterGpus:
    """The live nodes' GPUs and the per-GPU resources (``<prefix><index>``) they declare."""
    return ClusterGpus.from_nodes((n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")), prefix)


def live_nodes() -> int:
    """How many nodes the cluster has now (0 when this process has no Ray)."""
    return sum(1 for n in ray.nodes() if n.get("Alive")) if ray.is_initialized() else 0


def cpu_nodes() -> list[str]:
    """The addresses of the live nodes with CPUs (where a pool of CPU hosts puts one host each)."""
    alive = (n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0)
    return sorted({str(n["NodeManagerAddress"]) for n in alive})


def wait_for_gpus(settings: ServerSettings, report: Any = print, poll_s: float = 2.0) -> ClusterGpus:
    """The cluster's GPUs once at least ``settings.wait_for_gpus`` have joined (or the wait ran out)."""
    gpus = cluster_gpus(settings.gpu_resource_prefix)
    if gpus.total >= settings.wait_for_gpus:
        return gpus
    report(f"waiting up to {settings.wait_for_gpus_s:.0f}s for {settings.wait_for_gpus} GPU(s); {gpus.total} joined")
    deadline = time.monotonic() + settings.wait_for_gpus_s
    while gpus.total < settings.wait_for_gpus and time.monotonic() < deadline:
        time.sleep(poll_s)
        gpus = cluster_gpus(settings.gpu_resource_prefix)
    if gpus.total < settings.wait_for_gpus:
        report(f"only {gpus.total} of {settings.wait_for_gpus} GPU(s) joined; planning instances with those")
    return gpus
