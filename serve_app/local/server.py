"""``python -m serve_app --local``: serve a repository from this one process, without Ray.

The same service, schedulers and front ends as the Ray gateway, with every
model instance in this process (:class:`~serve_app.local.service.LocalService`).
It is for development and tests: the repository is loaded once (model
control mode none), and nothing scales or moves.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

from serve_app.front_ends import start_front_ends
from serve_app.local.service import LocalService
from serve_app.observability import python_logging, spans
from serve_app.observability.diagnostics import Diagnostics
from serve_app.service.model_table import LOAD_FAILED, failed_to_load, model_table
from serve_app.settings import ServerSettings
from serve_app.shared_memory import MemoryStore, SharedMemory


async def serve(settings: ServerSettings, stop: asyncio.Event) -> None:
    """Load the repository, serve it until ``stop`` is set, then drain."""
    t0 = time.monotonic()
    python_logging.install(settings.log_settings())
    local = await asyncio.to_thread(
        LocalService.from_repository,
        settings.model_repository,
        model_config_name=settings.model_config_name,
        max_queued=settings.max_queue_size,
        metrics=settings.metrics_options(),
        cache=settings.response_cache(),
        rate_limits=settings.rate_limit_resources(),
        server_name=settings.server_name,
        shared_memory=SharedMemory(MemoryStore()) if settings.allow_client_shm else None,
        diagnostics=Diagnostics(settings.trace_startup(), settings.log_settings()),  # changed in this process
        strict_readiness=settings.strict_readiness,
        complete_config=not settings.strict_model_config,
    )
    try:
        rows = [(e.name, e.version, e.state, e.reason) for e in local.service.repository_index()]
        print(model_table(rows), flush=True)
        if settings.exit_on_error and failed_to_load(rows):
            raise StartupFailed(LOAD_FAILED)
        front = await start_front_ends(local.service, settings)
        print(
            f"serve_app (local, no Ray) ready in {time.monotonic() - t0:.1f}s: HTTP {settings.host}:"
            f"{settings.http_port}, gRPC {settings.host}:{settings.grpc_port}"
            f"{f', OpenAI {settings.host}:{settings.openai_port}' if settings.openai_port else ''}",
            flush=True,
        )
        try:
            await stop.wait()
            print(f"shutting down: waiting up to {settings.exit_timeout_s:g}s for requests in progress", flush=True)
            left = await local.service.drain(settings.exit_timeout_s)
            if left:
                print(f"{left} request(s) still in progress after {settings.exit_timeout_s:g}s", flush=True)
        finally:
            await front.stop()
    finally:
        local.close()
        spans.flush()  # the traces of the last requests


class StartupFailed(Exception):
    """The server stops before serving (a model failed to load under --exit-on-error)."""


def serve_locally(settings: ServerSettings) -> int:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop)

    try:
        asyncio.run(main())
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StartupFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0
