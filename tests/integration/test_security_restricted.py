"""Restricted API categories in process, spoken to by stock tritonclient with its ``headers=`` argument.

Mirrors Triton's own tests (qa/L0_http/http_restricted_api_test.py, qa/L0_grpc/grpc_basic_auth_test and
python_grpc_aio_test's RestrictedProtocolTest): model-repository needs ``admin-key: admin-value``, health
and inference need ``infer-key: infer-value`` (over gRPC with the ``triton-grpc-protocol-`` prefix); the
other categories stay open.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serve_app.grpc_server import start_grpc_server
from serve_app.http_server import build_http_app
from serve_app.http_server.restricted import restrict_http_app
from serve_app.security.restricted import GRPC_HEADER_PREFIX, RestrictedApis
from serve_app.service import InferenceService
from tests.integration.test_security_tls import EXPECTED, grpc_add_sub, http_add_sub, in_thread, running_uvicorn
from tests.support.net import free_port
from tests.support.repos import ADD_SUB

GROUPS = ["model-repository:admin-key=admin-value", "health,inference:infer-key=infer-value"]
ADMIN = {"admin-key": "admin-value"}
INFER = {"infer-key": "infer-value"}
GRPC_ADMIN = {GRPC_HEADER_PREFIX + k: v for k, v in ADMIN.items()}
GRPC_INFER = {GRPC_HEADER_PREFIX + k: v for k, v in INFER.items()}
NOT_EXPLICIT = "explicit model load / unload is not allowed"
# tritonclient.http adds its own entries to a headers dict it is given: pass copies ({**INFER}).


def refused(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as exc:
        call()
    return exc.value


# -------------------------------------------------------------------------------------------------- HTTP


def test_restrict_http_app_is_the_app_itself_when_nothing_is_restricted(service: InferenceService) -> None:
    app = build_http_app(service)
    assert restrict_http_app(app, RestrictedApis()) is app


async def test_http_answer_is_tritons(service: InferenceService) -> None:
    app = restrict_http_app(build_http_app(service), RestrictedApis.parse(GROUPS))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        r = await client.post("/v2/repository/index")
        assert r.status_code == 403
        assert r.headers["content-type"] == "application/json"
        assert r.json() == {"error": "This API is restricted, expecting header 'admin-key'"}
        # before the method is looked at, as in Triton
        assert (await client.get("/v2/repository/index")).status_code == 403
        assert (await client.post("/v2/repository/index", headers={"Admin-Key": "admin-value"})).status_code == 200
        assert (await client.post("/v2/repository/index", headers={"admin-key": "Admin-Value"})).status_code == 403
        r = await client.get(f"/v2/models/{ADD_SUB}/ready")
        assert (r.status_code, r.json()["error"]) == (403, "This API is restricted, expecting header 'infer-key'")
        assert (await client.get(f"/v2/models/{ADD_SUB}/ready", headers=INFER)).status_code == 200
        # open categories and unknown paths are not checked
        assert (await client.get(f"/v2/models/{ADD_SUB}")).status_code == 200
        assert (await client.get(f"/v2/models/{ADD_SUB}/config")).status_code == 200
        assert (await client.get("/v2/models/stats")).status_code == 200
        assert (await client.get("/v2/nope")).status_code == 404


@contextlib.asynccontextmanager
async def restricted_http(service: InferenceService) -> AsyncIterator[str]:
    app = restrict_http_app(build_http_app(service), RestrictedApis.parse(GROUPS))
    async with running_uvicorn(app) as port:
        yield f"127.0.0.1:{port}"


async def test_http_with_tritonclient(service: InferenceService) -> None:
    async with restricted_http(service) as url:

        def calls() -> None:
            client = httpclient.InferenceServerClient(url)
            try:
                # Other unspecified APIs should not be restricted
                client.get_inference_statistics(ADD_SUB)
                client.get_inference_statistics(ADD_SUB, headers={**INFER})
                client.get_model_metadata(ADD_SUB)
                # model repository: the wrong group's header is refused, the right one goes through
                exc = refused(lambda: client.unload_model(ADD_SUB, headers={**INFER}))
                assert (exc.status(), exc.message()) == ("403", "This API is restricted, expecting header 'admin-key'")
                exc = refused(lambda: client.unload_model(ADD_SUB, headers={**ADMIN}))
                assert NOT_EXPLICIT in exc.message()
                assert client.get_model_repository_index(headers={**ADMIN})
                # health and inference
                assert not client.is_server_live()  # tritonclient.http answers a non-200 with False
                assert client.is_server_live(headers={**INFER})
                exc = refused(lambda: http_add_sub(client, headers={"test": "1"}))
                assert exc.status() == "403" and "This API is restricted" in exc.message()
                # the refused request's body was never read: the connection still serves the next one
                np.testing.assert_array_equal(http_add_sub(client, headers={**INFER}), EXPECTED)
                np.testing.assert_array_equal(http_add_sub(client, headers={"Infer-Key": "infer-value"}), EXPECTED)
            finally:
                client.close()

        await in_thread(calls)


# -------------------------------------------------------------------------------------------------- gRPC


@contextlib.asynccontextmanager
async def restricted_grpc(service: InferenceService) -> AsyncIterator[str]:
    port = free_port()
    server = await start_grpc_server(service, "127.0.0.1", port, restricted=RestrictedApis.parse(GROUPS, grpc=True))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


async def test_grpc_with_tritonclient(service: InferenceService) -> None:
    async with restricted_grpc(service) as url:

        def calls() -> None:
            with grpcclient.InferenceServerClient(url) as client:
                client.get_inference_statistics(ADD_SUB)
                client.get_inference_statistics(ADD_SUB, headers=GRPC_INFER)
                client.get_model_config(ADD_SUB)
                exc = refused(lambda: client.unload_model(ADD_SUB, headers=GRPC_INFER))
                assert exc.status() == "StatusCode.UNAVAILABLE"
                assert exc.message() == (
                    "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
                )
                exc = refused(lambda: client.unload_model(ADD_SUB, headers=GRPC_ADMIN))
                assert NOT_EXPLICIT in exc.message()
                assert client.get_model_repository_index(headers=GRPC_ADMIN) is not None
                exc = refused(client.is_server_live)
                assert "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'" in str(exc)
                assert client.is_server_live(headers=GRPC_INFER)
                assert client.is_model_ready(ADD_SUB, headers=GRPC_INFER)
                # the key without Triton's prefix is not the key
                refused(lambda: grpc_add_sub(client, headers=INFER))
                refused(lambda: grpc_add_sub(client, headers={GRPC_HEADER_PREFIX + "infer-key": "wrong"}))
                np.testing.assert_array_equal(grpc_add_sub(client, headers=GRPC_INFER), EXPECTED)

        await in_thread(calls)


async def test_grpc_stream_is_ended_with_the_restriction(service: InferenceService) -> None:
    async with restricted_grpc(service) as url:

        def stream() -> None:
            a = np.arange(16, dtype=np.float32).reshape(1, 16)
            inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            for i in inputs:
                i.set_data_from_numpy(a)
            results: queue.Queue[Any] = queue.Queue()

            def callback(result: Any, error: Any) -> None:
                results.put(error if error is not None else result)

            with grpcclient.InferenceServerClient(url) as client:
                # The stream opens (gRPC can't refuse it before the server reads its metadata), then ends.
                client.start_stream(callback, headers={"test": "1"})
                deadline = time.monotonic() + 10
                while results.empty() and time.monotonic() < deadline:
                    time.sleep(0.05)
                error = results.get(timeout=1)
                assert isinstance(error, InferenceServerException)
                assert "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'" in str(error)
                client.stop_stream()
                client.start_stream(callback, headers=GRPC_INFER)
                client.async_stream_infer(ADD_SUB, inputs)
                result = results.get(timeout=10)
                assert not isinstance(result, InferenceServerException), result
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
                client.stop_stream()

        await in_thread(stream)


async def test_no_interceptor_without_restrictions(service: InferenceService) -> None:
    port = free_port()
    server = await start_grpc_server(service, "127.0.0.1", port, restricted=RestrictedApis())
    try:

        def live() -> bool:
            with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
                return bool(client.is_server_live())

        assert await in_thread(live)
    finally:
        await server.stop(grace=None)
    await asyncio.sleep(0)
