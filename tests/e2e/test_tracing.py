"""Tracing end to end: a server with two gateway replicas exports OTLP to a receiver run by this test.

A request through a two-step ensemble, whose steps run in processes of their own, is one trace: the
gateway's InferRequest and model spans, and a compute span from each step's process, all under the
span the client names in its ``traceparent``.  Trace settings changed through one gateway hold on
every gateway.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from scripts import example_models
from tests.e2e.conftest import Server, start_server, stop_server
from tests.support.otlp import OtlpReceiver, SpanRecord

DEDICATED = 'parameters { key: "dedicated_process" value: { string_value: "true" } }\n'
CLIENT_PARENT = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"


def build_repository(repo: pathlib.Path) -> None:
    for step in ("step_a", "step_b"):
        example_models.add_sub(repo, name=step, extra_config=DEDICATED)
    d = repo / "ens_traced"
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(
        'name: "ens_traced"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN_A" data_type: TYPE_FP32 dims: [ 16 ] }, '
        '{ name: "IN_B" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUT_2A" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        "ensemble_scheduling { step [\n"
        '  { model_name: "step_a" model_version: -1 input_map { key: "INPUT0" value: "IN_A" } '
        'input_map { key: "INPUT1" value: "IN_B" } output_map { key: "OUTPUT0" value: "sum" } '
        'output_map { key: "OUTPUT1" value: "diff" } },\n'
        '  { model_name: "step_b" model_version: -1 input_map { key: "INPUT0" value: "sum" } '
        'input_map { key: "INPUT1" value: "diff" } output_map { key: "OUTPUT0" value: "OUT_2A" } }\n'
        "] }\n"
    )


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def traced_server(tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("trace_repository")
    build_repository(repo)
    flags = [
        "--gateway-replicas", "2",
        "--trace-config", "rate=1",
        "--trace-config", f"opentelemetry,url={receiver.url}",
        "--trace-config", "opentelemetry,bsp_schedule_delay=100",
    ]  # fmt: skip
    started, _ = start_server(tmp_path_factory, repo, flags, "trace")
    yield started
    stop_server(started)


def ensemble_inputs(module: object) -> list[object]:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    infer_input = module.InferInput  # type: ignore[attr-defined]
    inputs = [infer_input("IN_A", [1, 16], "FP32"), infer_input("IN_B", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    return inputs


def one_trace(spans: list[SpanRecord], trace_id: str) -> list[SpanRecord]:
    return [s for s in spans if s.trace_id == trace_id]


def test_settings_changed_on_one_gateway_hold_on_all(traced_server: Server, receiver: OtlpReceiver) -> None:
    client = httpclient.InferenceServerClient(traced_server.http_url)
    try:
        before = client.get_trace_settings()
        assert (before["trace_level"], before["trace_mode"], before["url"]) == (["OFF"], "opentelemetry", receiver.url)
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    finally:
        client.close()
    # new connections land on either gateway (SO_REUSEPORT): every one answers the new level
    for _ in range(8):
        fresh = httpclient.InferenceServerClient(traced_server.http_url)
        try:
            assert fresh.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]
        finally:
            fresh.close()
    with grpcclient.InferenceServerClient(traced_server.grpc_url) as grpc_client:
        assert list(grpc_client.get_trace_settings().settings["trace_level"].value) == ["TIMESTAMPS"]
        assert "trace" in grpc_client.get_server_metadata().extensions


def test_an_ensemble_request_is_one_trace_across_processes(traced_server: Server, receiver: OtlpReceiver) -> None:
    client = httpclient.InferenceServerClient(traced_server.http_url)
    try:
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        result = client.infer("ens_traced", ensemble_inputs(httpclient), headers={"traceparent": CLIENT_PARENT})
        np.testing.assert_array_equal(result.as_numpy("OUT_2A"), 2 * np.arange(16, dtype=np.float32).reshape(1, 16))
    finally:
        client.close()
    trace_id, client_span = CLIENT_PARENT.split("-")[1:3]
    spans = one_trace(receiver.wait_for(lambda s: len(one_trace(s, trace_id)) >= 6), trace_id)
    names = sorted(s.name for s in spans)
    assert names == ["InferRequest", "compute", "compute", "ens_traced", "step_a", "step_b"]
    by_id = {s.span_id: s for s in spans}

    def parent(s: SpanRecord) -> str | None:
        return by_id[s.parent_span_id].name if s.parent_span_id in by_id else None

    assert {(s.name, parent(s)) for s in spans} == {
        ("InferRequest", None),
        ("ens_traced", "InferRequest"),
        ("step_a", "ens_traced"),
        ("step_b", "ens_traced"),
        ("compute", "step_a"),
        ("compute", "step_b"),
    }
    root = next(s for s in spans if s.name == "InferRequest")
    assert root.parent_span_id == client_span
    # the gateway recorded the request's and the models' spans; each step's process its compute span
    gateway = root.resource["process.pid"]
    assert all(s.resource["process.pid"] == gateway for s in spans if s.name != "compute")
    compute = {parent(s): s.resource["process.pid"] for s in spans if s.name == "compute"}
    assert len({gateway, compute["step_a"], compute["step_b"]}) == 3


def test_a_sampled_grpc_request_starts_its_own_trace(traced_server: Server, receiver: OtlpReceiver) -> None:
    with grpcclient.InferenceServerClient(traced_server.grpc_url) as client:
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        client.infer("ens_traced", ensemble_inputs(grpcclient))
        client.update_trace_settings(settings={"trace_level": ["OFF"]})
    roots = receiver.wait_for(lambda s: any(r.name == "InferRequest" and "GRPC_SEND_END" in r.events for r in s), 30)
    root = next(r for r in roots if r.name == "InferRequest" and "GRPC_SEND_END" in r.events)
    assert root.parent_span_id == ""
    mine = receiver.wait_for(lambda s: len(one_trace(s, root.trace_id)) >= 6)
    assert sorted(s.name for s in one_trace(mine, root.trace_id)).count("compute") == 2
