"""The trace and logging extensions in process, spoken to by stock tritonclient on both protocols.

Mirrors Triton's qa/L0_trace trace_endpoint_test.py (settings, their fallback and clearing) and
qa/L0_logging; traced requests export to an OTLP receiver of the test.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from serve_app.grpc_server import start_grpc_server
from serve_app.http_server import build_http_app
from serve_app.observability import spans
from serve_app.observability.diagnostics import Diagnostics
from serve_app.observability.log_settings import LogSettings
from serve_app.observability.python_logging import LOGGER, apply
from serve_app.observability.trace_startup import TraceStartup
from serve_app.service import InferenceService
from tests.integration.test_security_tls import EXPECTED, grpc_add_sub, http_add_sub, in_thread, running_uvicorn
from tests.support.net import free_port
from tests.support.otlp import OtlpReceiver, SpanRecord
from tests.support.repos import ADD_SUB

CLIENT_PARENT = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture
def traced(
    service: InferenceService, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> Iterator[InferenceService]:
    """The session's service with trace settings of its own (level OFF, rate 1), exporting to ``receiver``;
    its log settings are restored afterwards."""
    startup = TraceStartup.parse([f"opentelemetry,url={receiver.url}", "rate=1", "opentelemetry,bsp_schedule_delay=20"])
    diagnostics = Diagnostics(startup)
    diagnostics.model_ready = service.model_ready
    monkeypatch.setattr(service, "diagnostics", diagnostics)
    try:
        yield service
    finally:
        apply(LogSettings())


@contextlib.asynccontextmanager
async def servers(service: InferenceService) -> AsyncIterator[tuple[str, str]]:
    """(HTTP, gRPC) addresses of both front ends over ``service``."""
    port = free_port()
    grpc_server = await start_grpc_server(service, "127.0.0.1", port)
    try:
        async with running_uvicorn(build_http_app(service)) as http_port:
            yield f"127.0.0.1:{http_port}", f"127.0.0.1:{port}"
    finally:
        await grpc_server.stop(grace=None)


def raises(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def grpc_settings(client: grpcclient.InferenceServerClient, **kwargs: Any) -> dict[str, list[str]]:
    answer = client.update_trace_settings(**kwargs) if "settings" in kwargs else client.get_trace_settings(**kwargs)
    return {k: v["value"] for k, v in json_format.MessageToDict(answer)["settings"].items()}


INITIAL = {
    "trace_level": ["OFF"],
    "trace_rate": "1",
    "trace_count": "-1",
    "trace_mode": "opentelemetry",
    "bsp_max_queue_size": "2048",
    "bsp_schedule_delay": "20",
    "bsp_max_export_batch_size": "512",
}


async def test_http_settings_follow_tritons_rules(traced: InferenceService, receiver: OtlpReceiver) -> None:
    initial = {**INITIAL, "url": receiver.url}
    async with servers(traced) as (http_url, _):

        def calls() -> None:
            client = httpclient.InferenceServerClient(http_url)
            try:
                assert client.get_trace_settings() == initial
                assert client.get_trace_settings(model_name=ADD_SUB) == initial
                exc = raises(lambda: client.get_trace_settings(model_name="does-not-exist"))
                assert exc.message() == "Request for unknown model : does-not-exist"
                exc = raises(lambda: client.update_trace_settings(model_name=ADD_SUB, settings={"trace_file": "m.log"}))
                assert exc.message() == "trace file location can not be updated through network protocol"
                assert exc.status() == "400"
                # the model's own fields, then the global ones: the model keeps its own
                client.update_trace_settings(model_name=ADD_SUB, settings={"trace_rate": "12", "log_frequency": "34"})
                got = client.update_trace_settings(settings={"trace_rate": "56", "trace_count": "78"})
                assert (got["trace_rate"], got["trace_count"]) == ("56", "78")
                model = client.get_trace_settings(model_name=ADD_SUB)
                assert (model["trace_rate"], model["trace_count"]) == ("12", "78")
                # clearing: back to the global setting, and to the start-up default
                got = client.update_trace_settings(model_name=ADD_SUB, settings={"trace_rate": None})
                assert got["trace_rate"] == "56"
                assert client.update_trace_settings(settings={"trace_rate": None, "trace_count": None}) == initial
                exc = raises(lambda: client.update_trace_settings(settings={"trace_level": ["OFF", "TIMESTAMPS"]}))
                assert exc.message() == "Expect only one trace level 'OFF' is specified"
                exc = raises(lambda: client.update_trace_settings(settings={"trace_rate": 5}))
                assert exc.message() == "attempt to access JSON non-string as string"
                exc = raises(
                    lambda: client.update_trace_settings(settings={"trace_rate": "0", "trace_level": ["TIMESTAMPS"]})
                )
                assert exc.message() == "Attempting to set invalid trace setting :sample rate must be non-zero"
            finally:
                client.close()

        await in_thread(calls)


async def test_grpc_settings_follow_tritons_rules(traced: InferenceService, receiver: OtlpReceiver) -> None:
    initial = {k: v if isinstance(v, list) else [v] for k, v in {**INITIAL, "url": receiver.url}.items()}
    async with servers(traced) as (_, grpc_url):

        def calls() -> None:
            with grpcclient.InferenceServerClient(grpc_url) as client:
                assert grpc_settings(client) == initial
                assert grpc_settings(client, model_name=ADD_SUB) == initial
                got = grpc_settings(client, settings={"trace_level": ["TIMESTAMPS", "TENSORS"]})
                assert got["trace_level"] == ["TIMESTAMPS", "TENSORS"]
                got = grpc_settings(client, model_name=ADD_SUB, settings={"trace_count": "3"})
                assert (got["trace_level"], got["trace_count"]) == (["TIMESTAMPS", "TENSORS"], ["3"])
                assert grpc_settings(client, model_name=ADD_SUB, settings={"trace_count": None}) == grpc_settings(
                    client
                )
                exc = raises(lambda: client.update_trace_settings(settings={"trace_rate": ["1", "2"]}))
                assert exc.message() == "expect only 1 value for 'trace_rate'"
                assert exc.status() == "StatusCode.INVALID_ARGUMENT"
                exc = raises(lambda: client.update_trace_settings(settings={"trace_file": "x"}))
                assert exc.status() == "StatusCode.UNIMPLEMENTED"
                exc = raises(lambda: client.get_trace_settings(model_name="does-not-exist"))
                assert exc.message() == "Request for unknown model : does-not-exist"

        await in_thread(calls)


def by_name(found: list[SpanRecord], trace_id: str) -> dict[str, SpanRecord]:
    return {s.name: s for s in found if s.trace_id == trace_id}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_a_traced_request_is_one_trace_under_the_clients_span(
    traced: InferenceService, receiver: OtlpReceiver, protocol: str
) -> None:
    trace_id, parent_span = CLIENT_PARENT.split("-")[1:3]
    async with servers(traced) as (http_url, grpc_url):

        def calls() -> None:
            headers = {"traceparent": CLIENT_PARENT}
            if protocol == "http":
                client = httpclient.InferenceServerClient(http_url)
                try:
                    assert client.get_trace_settings()["trace_level"] == ["OFF"]
                    assert (http_add_sub(client, headers=headers) == EXPECTED).all()  # OFF: not traced
                    client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1000"})
                    assert (http_add_sub(client, headers=headers) == EXPECTED).all()  # its context: traced
                    assert (http_add_sub(client) == EXPECTED).all()  # 1 of 1000 requests: not traced
                finally:
                    client.close()
            else:
                with grpcclient.InferenceServerClient(grpc_url) as client:
                    assert (grpc_add_sub(client, headers=headers) == EXPECTED).all()
                    client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1000"})
                    assert (grpc_add_sub(client, headers=headers) == EXPECTED).all()
                    assert (grpc_add_sub(client) == EXPECTED).all()

        await in_thread(calls)
    spans.flush()
    found = await in_thread(lambda: receiver.wait_for(lambda s: len(by_name(s, trace_id)) >= 3, 10))
    assert {s.trace_id for s in found} == {trace_id}  # one trace: the client's
    mine = by_name(found, trace_id)
    assert len(found) == 3
    root, model, compute = mine["InferRequest"], mine[ADD_SUB], mine["compute"]
    assert root.parent_span_id == parent_span
    assert model.parent_span_id == root.span_id and compute.parent_span_id == model.span_id
    wire = "HTTP" if protocol == "http" else "GRPC"
    recv = ("HTTP_RECV_START", "HTTP_RECV_END") if wire == "HTTP" else ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END")
    assert root.events == (*recv, "INFER_RESPONSE_COMPLETE", f"{wire}_SEND_START", f"{wire}_SEND_END")
    assert model.events == ("REQUEST_START", "QUEUE_START", "REQUEST_END")
    assert compute.events == ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")
    assert model.attributes == {"triton.model_name": ADD_SUB, "triton.model_version": 1}
    assert root.resource["service.name"] == "triton-inference-server"


async def test_rate_and_count_pick_the_traced_requests(traced: InferenceService, receiver: OtlpReceiver) -> None:
    async with servers(traced) as (http_url, _):

        def calls() -> None:
            client = httpclient.InferenceServerClient(http_url)
            try:
                client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "2"})
                got = client.update_trace_settings(model_name=ADD_SUB, settings={"trace_count": "2"})
                assert got["trace_count"] == "2"
                for _ in range(6):
                    http_add_sub(client)
                assert client.get_trace_settings(model_name=ADD_SUB)["trace_count"] == "0"  # what is left
            finally:
                client.close()

        await in_thread(calls)
    spans.flush()
    found = await in_thread(lambda: receiver.wait_for(lambda s: len(s) >= 6, 10))
    assert sorted(s.name for s in found if s.name == "InferRequest") == ["InferRequest"] * 2
    assert all(s.parent_span_id == "" for s in found if s.name == "InferRequest")


async def test_log_settings_on_both_protocols(traced: InferenceService) -> None:
    defaults = {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    async with servers(traced) as (http_url, grpc_url):

        def calls() -> None:
            client = httpclient.InferenceServerClient(http_url)
            try:
                assert client.get_log_settings() == defaults
                got = client.update_log_settings({"log_warning": False, "log_verbose_level": 1})
                assert got == {**defaults, "log_warning": False, "log_verbose_level": 1}
                exc = raises(lambda: client.update_log_settings({"log_file": "x.log"}))
                assert exc.message() == "log file location can not be updated through network protocol"
                exc = raises(lambda: client.update_log_settings({"log_format": "xml"}))
                assert exc.message() == "invalid argument for --log_format, got: xml"
            finally:
                client.close()
            with grpcclient.InferenceServerClient(grpc_url) as grpc_client:
                got = grpc_client.get_log_settings(as_json=True)["settings"]
                assert got["log_warning"] == {"bool_param": False}
                assert got["log_verbose_level"] == {"uint32_param": 1}
                got = grpc_client.update_log_settings({"log_format": "ISO8601", "log_warning": True}, as_json=True)
                assert got["settings"]["log_format"] == {"string_param": "ISO8601"}
                exc = raises(lambda: grpc_client.update_log_settings({"log_format": "xml"}))
                assert exc.message() == "invalid argument for log_format, got: xml"

        await in_thread(calls)
    gate = next(f for f in logging.getLogger(LOGGER).filters if hasattr(f, "settings"))
    assert gate.settings == LogSettings(log_verbose_level=1, log_format="ISO8601")  # applied to Python's logging


async def test_server_metadata_lists_both_extensions(traced: InferenceService) -> None:
    assert {"trace", "logging"} <= set(traced.server_metadata().extensions)
