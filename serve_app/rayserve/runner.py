"""Running the server on Ray: from the command line (``python -m serve_app``) or from `serve run`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve

from serve_app.errors import ServeError
from serve_app.placement.local_gpus import gpu_resources, visible_gpu_count
from serve_app.rayserve.app_builder import build_application
from serve_app.rayserve.console import quiet_driver, ray_log_level, serve_logging
from serve_app.service.model_table import LOAD_FAILED, failed_to_load, model_table
from serve_app.settings import ServerSettings


@dataclass(frozen=True)
class RayOptions:
    """The Ray the command line starts, or the cluster it joins (``address``)."""

    address: str | None = None
    num_cpus: int | None = None
    dashboard: bool = False
    object_store_memory: int | None = None


def ensure_serve_started(settings: ServerSettings) -> None:
    """Start Serve without Ray's proxy when nothing started it yet.

    `serve run <import path>` calls the builder before it starts Serve, and would
    start Ray's proxy on port 8000, the gateway's port.  A config file sets
    ``proxy_location: Disabled`` itself; on a running Serve this does nothing.
    """
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, namespace="serve")
        else:
            # A local Ray for `serve run`: instances share the cores, as in Triton.
            ray.init(
                namespace="serve",
                num_cpus=local_num_cpus(),
                resources=local_gpu_resources(settings.gpu_resource_prefix),
            )
    serve.start(proxy_location="Disabled", logging_config=serve_logging(settings))


def local_gpu_resources(prefix: str) -> dict[str, float]:
    """One ``<prefix><i>`` per GPU of this machine, for a Ray we start (nobody else declares them here)."""
    lines: list[str] = []
    smi = shutil.which("nvidia-smi")
    if smi is not None and os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
            lines = out.stdout.splitlines() if out.returncode == 0 else []
        except (OSError, subprocess.SubprocessError):
            pass
    return gpu_resources(prefix, visible_gpu_count(os.environ.get("CUDA_VISIBLE_DEVICES"), lines))


def local_num_cpus() -> int:
    """Logical CPUs for a Ray we start here: every instance reserves some, none pins a core."""
    return max(os.cpu_count() or 1, 16)


def drain_gateways(settings: ServerSettings) -> None:
    """Every gateway replica stops accepting and finishes what it holds (bounded by exit_timeout_s)."""
    try:
        handle = serve.get_deployment_handle("gateway", settings.app_name)
        left = handle.broadcast("drain", settings.exit_timeout_s).results(timeout_s=settings.exit_timeout_s + 10)
        unfinished = sum(n for n in left if isinstance(n, int))
        if unfinished:
            print(f"{unfinished} request(s) still in progress after {settings.exit_timeout_s:g}s", flush=True)
    except Exception as exc:  # the server goes down either way
        print(f"draining the gateways failed: {exc}", file=sys.stderr, flush=True)


def _deploy(app: Any, name: str, stop: threading.Event) -> Any:
    """``serve.run`` in a thread, so that SIGINT or SIGTERM while models load stops the server at once
    (the caller shuts Serve and Ray down); the application's handle, or None when stopped first."""
    done: list[Any] = []

    def run() -> None:
        try:
            done.append(serve.run(app, name=name, route_prefix=None))
        except BaseException as exc:
            done.append(exc)

    thread = threading.Thread(target=run, name="serve-run", daemon=True)
    thread.start()
    while thread.is_alive() and not stop.wait(0.2):
        pass
    if not done:
        return None
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


def serve_on_ray(settings: ServerSettings, options: RayOptions) -> int:
    """Start (or join) Ray, deploy the server's application, serve until SIGINT/SIGTERM, drain, stop."""
    started_ray = options.address is None
    quiet_driver(settings)
    level = ray_log_level(settings)
    if started_ray:
        ray.init(
            # "local": a Ray of our own, whatever a `ray start` on this machine left in ray_current_cluster (or
            # RAY_ADDRESS says); joining one is what --address is for
            address="local",
            num_cpus=options.num_cpus or local_num_cpus(),
            include_dashboard=options.dashboard,
            object_store_memory=options.object_store_memory,
            resources=local_gpu_resources(settings.gpu_resource_prefix),
            namespace="serve",
            logging_level=level,
        )
    else:
        ray.init(address=options.address, namespace="serve", logging_level=level)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(proxy_location="Disabled", logging_config=serve_logging(settings))
        try:
            app = build_application(settings)
        except ServeError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 2
        t0 = time.monotonic()
        handle = _deploy(app, settings.app_name, stop)
        if handle is None:
            print("interrupted while starting: shutting down", flush=True)
            return 130
        states = handle.model_states.remote().result()
        rows = [(name, str(version), state, reason) for name, version, state, reason in states]
        print(model_table(rows), flush=True)
        if settings.exit_on_error and failed_to_load(rows):
            print(LOAD_FAILED, file=sys.stderr, flush=True)
            return 1
        print(
            f"serve_app ready in {time.monotonic() - t0:.1f}s: HTTP {settings.host}:{settings.http_port}, "
            f"gRPC {settings.host}:{settings.grpc_port}, metrics {settings.host}:{settings.metrics_port}"
            f"{f', OpenAI {settings.host}:{settings.openai_port}' if settings.openai_port else ''}; "
            f"model repository {settings.model_repository} (model control mode {settings.model_control_mode})",
            flush=True,
        )
        while not stop.wait(0.2):
            pass
        print(
            f"shutting down: no new requests; waiting up to {settings.exit_timeout_s:g}s for those in progress",
            flush=True,
        )
        drain_gateways(settings)
        print("shutting down", flush=True)
        return 0
    finally:
        try:
            serve.shutdown()
        finally:
            if started_ray:
                ray.shutdown()
