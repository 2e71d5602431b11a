"""The server under test.  In process (the default) the integration tests' models, the sequence models, an
ensemble, a dynamic batcher with priorities and a classification model are served from a temporary repository
by the real service and front ends without Ray (HTTP through httpx's ASGI transport, gRPC on a free loopback
port), with small request limits so that limit cases stay cheap.  Remote: a running server, whose models the
cases never load or unload."""

from __future__ import annotations

import contextlib
import pathlib
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx

from serve_app.limits import RequestLimits

# Small limits for the in-process server: limit cases stay cheap.
IN_PROCESS_LIMITS = RequestLimits(
    max_body_bytes=2 * 2**20, max_tensor_elements=2**18, max_json_depth=32, max_inputs=32, max_outputs=32
)


@dataclass
class Targets:
    http: httpx.AsyncClient
    channel: grpc.aio.Channel
    strict: bool  # in process every model is ready: 503 only where the case allows it
    timeout_s: float


def build_fuzz_repository(repo: pathlib.Path) -> pathlib.Path:
    """The integration tests' models, the sequence models, and a few more that reach other code paths."""
    from scripts import example_models
    from tests.support.repos import build_repository
    from tests.support.sequence_repository import build_sequence_repository

    build_repository(repo)
    build_sequence_repository(repo)
    for datatype in ("BOOL", "INT8", "UINT64", "FP16", "INT64"):
        example_models.identity(repo, datatype)
    example_models.add_sub(
        repo,
        name="add_sub_queue",
        dynamic_batching=False,
        extra_config=(
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 max_queue_delay_microseconds: 100 "
            "default_queue_policy { allow_timeout_override: true max_queue_size: 64 } }"
        ),
    )
    example_models.add_sub_ensemble(repo)
    d = example_models.identity(repo, "FP32", name="scores")
    (d / "labels.txt").write_text("zero\none\ntwo\nthree\n")
    config = d / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "OUTPUT0"', 'name: "OUTPUT0" label_filename: "labels.txt"'))
    return repo


class AcceptingControl:
    """Model control that accepts every well-formed load and unload and changes nothing."""

    def __init__(self, service: Any) -> None:
        self._service = service

    async def index(self, ready_only: bool) -> list[Any]:
        return self._service.repository_index(ready_only)

    async def load(self, name: str, params: Any) -> None:
        return None

    async def unload(self, name: str, unload_dependents: bool) -> None:
        return None


@contextlib.asynccontextmanager
async def in_process(
    limits: RequestLimits = IN_PROCESS_LIMITS, timeout_s: float = 10.0, repo: pathlib.Path | None = None
) -> AsyncIterator[tuple[Targets, Any]]:
    """The real service and front ends over a temporary repository, without Ray; yields (targets, service)."""
    from serve_app.grpc_server import start_grpc_server
    from serve_app.http_server import build_http_app
    from serve_app.local.service import LocalService
    from tests.support.net import free_port

    with contextlib.ExitStack() as stack:
        if repo is None:
            repo = build_fuzz_repository(pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory())))
        host = LocalService.from_repository(repo)
        service = host.service
        service.repository = AcceptingControl(service)
        port = free_port()
        server = await start_grpc_server(service, "127.0.0.1", port, limits=limits)
        transport = httpx.ASGITransport(app=build_http_app(service, limits=limits))
        try:
            async with (
                httpx.AsyncClient(transport=transport, base_url="http://fuzz") as client,
                grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
            ):
                yield Targets(client, channel, strict=True, timeout_s=timeout_s), service
        finally:
            await server.stop(grace=None)
            host.close()


@contextlib.asynccontextmanager
async def remote(http: str, grpc_address: str, timeout_s: float) -> AsyncIterator[tuple[Targets, None]]:
    async with (
        httpx.AsyncClient(base_url=f"http://{http}", timeout=timeout_s) as client,
        grpc.aio.insecure_channel(grpc_address) as channel,
    ):
        yield Targets(client, channel, strict=False, timeout_s=timeout_s), None
