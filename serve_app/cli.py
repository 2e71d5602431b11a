"""`python -m serve_app`: start (or join) Ray, deploy a model repository, serve until signalled."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from serve_app.errors import ServeError
from serve_app.settings import ServerSettings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m serve_app", description="Serve a Triton model repository on Ray Serve.")
    p.add_argument("--model-repository", required=True, help="path to a Triton model repository")
    p.add_argument("--host", default="0.0.0.0", help="address the HTTP and gRPC servers bind (default 0.0.0.0)")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument(
        "--address", default=None, help="join this Ray cluster instead of starting one ('auto' finds a local one)"
    )
    p.add_argument("--gateway-replicas", type=int, default=1, help="front-end replicas sharing the ports")
    p.add_argument("--instance-cpus", type=float, default=1.0, help="logical CPUs each model instance reserves")
    p.add_argument(
        "--max-inflight-per-instance",
        type=int,
        default=1,
        help="batches in flight per model instance from each gateway (default 1: a batch is formed only when an "
        "instance is free, as in Triton; 2 also hides the Ray hop behind the previous execution)",
    )
    p.add_argument(
        "--num-cpus",
        type=int,
        default=None,
        help="logical CPUs of a Ray started here (default: max(cores, 16); instances share the cores like Triton's)",
    )
    p.add_argument(
        "--no-direct-channel",
        action="store_true",
        help="send batches to model instances through Ray Serve handles instead of direct channels",
    )
    p.add_argument(
        "--gpu-resource-prefix",
        default="gpu_idx_",
        help="custom Ray resources naming one GPU each, declared by the nodes (default gpu_idx_: "
        'ray start --resources=\'{"gpu_idx_0": 1, "gpu_idx_1": 1}\'); needed for instance groups that list gpus',
    )
    p.add_argument("--dashboard", action="store_true", help="start Ray's dashboard with a Ray started here")
    p.add_argument("--object-store-memory", type=int, default=None, help="object store bytes of a Ray started here")
    p.add_argument(
        "--wait-for-gpus",
        type=int,
        default=0,
        help="wait until the cluster shows this many GPUs before planning instances (GPU nodes joining late)",
    )
    p.add_argument("--wait-for-gpus-s", type=float, default=600.0, help="longest wait for --wait-for-gpus")
    p.add_argument(
        "--model-control-mode",
        choices=("none", "poll", "explicit"),
        default="none",
        help="as Triton's: none loads every model at start; poll also follows the repository's changes; "
        "explicit loads the --load-model models, then the repository API loads and unloads",
    )
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="explicit mode: a model to load at start (repeatable; '*' loads every model)",
    )
    p.add_argument(
        "--repository-poll-secs", type=float, default=15.0, help="poll mode: seconds between repository polls"
    )
    p.add_argument(
        "--autoscaling-file",
        default="",
        help="YAML/JSON file of per-model autoscaling settings, overriding the models' autoscaling.* parameters",
    )
    p.add_argument(
        "--load-timeout-s",
        type=float,
        default=600.0,
        help="longest wait for a model's instances to start before its load fails",
    )
    p.add_argument(
        "--max-queue-size",
        type=int,
        default=4096,
        help="requests a model version may hold queued per gateway before new ones get 503 (0: unbounded)",
    )
    p.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT: stop accepting requests (503), then wait this long for those in progress",
    )
    p.add_argument(
        "--instance-timeout-s",
        type=float,
        default=300.0,
        help="a batch whose model instance doesn't answer this long fails with 503 (0: wait for ever)",
    )
    p.add_argument("--tls-cert", default="", help="PEM certificate: serve HTTP and gRPC over TLS (with --tls-key)")
    p.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    p.add_argument("--tls-ca", default="", help="PEM CA bundle for client certificates")
    p.add_argument(
        "--tls-require-client-cert", action="store_true", help="mutual TLS: clients must present a certificate"
    )
    p.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="CATEGORIES:KEY=VALUE",
        help="as Triton's: these API categories (e.g. model-repository) answer only requests with header "
        "KEY: VALUE, others get 403 (repeatable)",
    )
    p.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="CATEGORIES:KEY=VALUE",
        help="as Triton's: these gRPC categories need metadata triton-grpc-protocol-KEY: VALUE (repeatable)",
    )
    from serve_app.limits import DEFAULT_LIMITS as L

    for flag, default, what in (
        ("--max-body-bytes", L.max_body_bytes, "request body bytes (HTTP) and message bytes (gRPC); more: 413"),
        ("--max-tensor-elements", L.max_tensor_elements, "tensor elements in one request"),
        ("--max-json-depth", L.max_json_depth, "nesting depth of an HTTP JSON body"),
        ("--max-inputs", L.max_inputs, "inputs in one request"),
        ("--max-outputs", L.max_outputs, "requested outputs in one request"),
    ):
        p.add_argument(flag, type=int, default=default, help=f"limit: {what} (default {default})")
    return p


def settings_from(ns: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        model_repository=os.path.abspath(ns.model_repository),
        host=ns.host,
        http_port=ns.http_port,
        grpc_port=ns.grpc_port,
        metrics_port=ns.metrics_port,
        gateway_replicas=ns.gateway_replicas,
        instance_cpus=ns.instance_cpus,
        max_inflight_per_instance=ns.max_inflight_per_instance,
        direct_channel=not ns.no_direct_channel,
        gpu_resource_prefix=ns.gpu_resource_prefix,
        wait_for_gpus=ns.wait_for_gpus,
        wait_for_gpus_s=ns.wait_for_gpus_s,
        model_control_mode=ns.model_control_mode,
        load_model=tuple(ns.load_model),
        repository_poll_secs=ns.repository_poll_secs,
        autoscaling_file=os.path.abspath(ns.autoscaling_file) if ns.autoscaling_file else "",
        load_timeout_s=ns.load_timeout_s,
        max_queue_size=ns.max_queue_size,
        exit_timeout_s=ns.exit_timeout_secs,
        instance_timeout_s=ns.instance_timeout_s,
        tls_cert=os.path.abspath(ns.tls_cert) if ns.tls_cert else "",
        tls_key=os.path.abspath(ns.tls_key) if ns.tls_key else "",
        tls_ca=os.path.abspath(ns.tls_ca) if ns.tls_ca else "",
        tls_require_client_cert=ns.tls_require_client_cert,
        http_restricted_api=tuple(ns.http_restricted_api),
        grpc_restricted_protocol=tuple(ns.grpc_restricted_protocol),
        max_body_bytes=ns.max_body_bytes,
        max_tensor_elements=ns.max_tensor_elements,
        max_json_depth=ns.max_json_depth,
        max_inputs=ns.max_inputs,
        max_outputs=ns.max_outputs,
    )


def drain_gateways(settings: ServerSettings) -> None:
    """Every gateway replica stops accepting and finishes what it holds (bounded by exit_timeout_s)."""
    from ray import serve

    try:
        handle = serve.get_deployment_handle("gateway", settings.app_name)
        left = handle.broadcast("drain", settings.exit_timeout_s).results(timeout_s=settings.exit_timeout_s + 10)
        unfinished = sum(n for n in left if isinstance(n, int))
        if unfinished:
            print(f"{unfinished} request(s) still in progress after {settings.exit_timeout_s:g}s", flush=True)
    except Exception as exc:  # the server goes down either way
        print(f"draining the gateways failed: {exc}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        settings = settings_from(ns)
        tls = settings.tls()
        if tls is not None:
            tls.check()
    except ServeError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    if not os.path.isdir(settings.model_repository):
        print(f"error: model repository '{settings.model_repository}' is not a directory", file=sys.stderr)
        return 2

    import ray
    from ray import serve

    from serve_app.app import local_num_cpus
    from serve_app.rayserve.app_builder import build_application

    started_ray = ns.address is None
    if started_ray:
        ray.init(
            num_cpus=ns.num_cpus or local_num_cpus(),
            include_dashboard=ns.dashboard,
            object_store_memory=ns.object_store_memory,
            namespace="serve",
        )
    else:
        ray.init(address=ns.address, namespace="serve")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(proxy_location="Disabled")
        try:
            app = build_application(settings)
        except ServeError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 2
        t0 = time.monotonic()
        handle = serve.run(app, name=settings.app_name, route_prefix=None)
        for name, version, state, reason in handle.model_states.remote().result():
            suffix = f": {reason}" if reason else ""
            print(f"model '{name}' version {version}: {state}{suffix}", flush=True)
        print(
            f"serve_app ready in {time.monotonic() - t0:.1f}s: HTTP {settings.host}:{settings.http_port}, "
            f"gRPC {settings.host}:{settings.grpc_port}",
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
