"""In-process integration: the real repository, backends, service and both front ends, without Ray.

``local_service(repo_dir)`` serves a repository as the Ray gateway does (registry,
service, schedulers) but runs every model instance in this process (:class:`LocalService`).
The HTTP app is driven through httpx's ASGI transport; the gRPC server binds a
free loopback port and is stopped after each test.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Iterator

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2_grpc

from serve_app.grpc_server import start_grpc_server
from serve_app.http_server import build_http_app
from serve_app.inference.types import InferRequest, InferResponse
from serve_app.keys import ModelKey
from serve_app.local.service import LocalService
from serve_app.runtime import ModelInstance
from serve_app.service import InferenceService
from tests.support.net import free_port
from tests.support.repos import (
    build_repository,
)


def local_service(repo_dir: str | pathlib.Path) -> LocalService:
    """Every model of ``repo_dir`` served in this process (:class:`LocalService`)."""
    return LocalService.from_repository(repo_dir)


async def infer(service: InferenceService, request: InferRequest) -> InferResponse:
    """A decoded request through the service as a front end sends it: resolve its model, then infer."""
    return await service.infer(service.model(request.model_name, request.model_version), request)


@pytest.fixture(scope="session")
def repo_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return build_repository(tmp_path_factory.mktemp("integration_repo"))


@pytest.fixture(scope="session")
def loaded(repo_dir: pathlib.Path) -> Iterator[tuple[InferenceService, dict[ModelKey, ModelInstance]]]:
    host = local_service(repo_dir)
    yield host.service, host.instances
    host.close()


@pytest.fixture(scope="session")
def service(loaded: tuple[InferenceService, dict]) -> InferenceService:
    """One service for the session.  Tests that change it use ``monkeypatch`` so it is restored."""
    return loaded[0]


@pytest.fixture(scope="session")
def instances(loaded: tuple[InferenceService, dict]) -> dict[ModelKey, ModelInstance]:
    """The in-process ModelInstance of each served (model, version), e.g. to patch a backend."""
    return loaded[1]


@pytest.fixture
async def http(service: InferenceService) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=build_http_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


@pytest.fixture
async def grpc_stub(service: InferenceService) -> AsyncIterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    """tritonclient's own stub over a grpc.aio channel to our server on a free port."""
    port = free_port()
    server = await start_grpc_server(service, "127.0.0.1", port)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        await server.stop(grace=None)
