"""The gRPC front end in process, spoken to with tritonclient's own generated stub and messages.

Using ``tritonclient.grpc.service_pb2`` (not our protos) on the client side proves
the server is wire compatible with Triton's ``inference.GRPCInferenceService``.
"""

from __future__ import annotations

import struct
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format, unknown_fields
from tritonclient.grpc import model_config_pb2, service_pb2 as pb, service_pb2_grpc

from serve_app.keys import ModelKey
from serve_app.runtime import ModelInstance
from serve_app.service import InferenceService
from tests.support.repos import ADD_SUB, BROKEN, GENERATED, IDENTITY_BYTES, VERSIONED

Stub = service_pb2_grpc.GRPCInferenceServiceStub


def add_sub_request(
    a: np.ndarray, b: np.ndarray, *, model: str = ADD_SUB, version: str = "", request_id: str = ""
) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        req.inputs.add(name=name, datatype="FP32", shape=list(arr.shape))
        req.raw_input_contents.append(arr.tobytes())
    return req


def operands(batch: int = 1, offset: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(16 * batch, dtype=np.float32).reshape(batch, 16) + offset
    return a, np.full((batch, 16), 2.0, dtype=np.float32)


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    return exc.value


# --------------------------------------------------------------------------- health, metadata, config


async def test_health_and_server_metadata(
    grpc_stub: Stub, service: InferenceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (await grpc_stub.ServerLive(pb.ServerLiveRequest())).live
    assert (await grpc_stub.ServerReady(pb.ServerReadyRequest())).ready
    md = await grpc_stub.ServerMetadata(pb.ServerMetadataRequest())
    assert md.name == "serve_app"
    assert "binary_tensor_data" in md.extensions
    monkeypatch.setattr(service, "accepting", False)
    assert not (await grpc_stub.ServerReady(pb.ServerReadyRequest())).ready
    assert (await grpc_stub.ServerLive(pb.ServerLiveRequest())).live


@pytest.mark.parametrize(
    ("name", "version", "ready"),
    [(ADD_SUB, "", True), (VERSIONED, "2", True), (VERSIONED, "1", False), (BROKEN, "", False), ("nope", "", False)],
)
async def test_model_ready(grpc_stub: Stub, name: str, version: str, ready: bool) -> None:
    assert (await grpc_stub.ModelReady(pb.ModelReadyRequest(name=name, version=version))).ready is ready


async def test_model_metadata(grpc_stub: Stub) -> None:
    md = await grpc_stub.ModelMetadata(pb.ModelMetadataRequest(name=VERSIONED))
    assert (md.name, list(md.versions), md.platform) == (VERSIONED, ["2", "3"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == [
        ("INPUT0", "FP32", [-1, 16]),
        ("INPUT1", "FP32", [-1, 16]),
    ]
    assert [t.name for t in md.outputs] == ["OUTPUT0", "OUTPUT1"]
    md2 = await grpc_stub.ModelMetadata(pb.ModelMetadataRequest(name=VERSIONED, version="2"))
    assert list(md2.versions) == ["2"]


async def test_model_config_generated(grpc_stub: Stub, service: InferenceService) -> None:
    """Our ModelConfig decodes as tritonclient's model_config_pb2.ModelConfig, field for field."""
    resp = await grpc_stub.ModelConfig(pb.ModelConfigRequest(name=GENERATED))
    cfg = resp.config
    assert isinstance(cfg, model_config_pb2.ModelConfig)
    assert (cfg.name, cfg.platform, cfg.backend, cfg.max_batch_size) == (
        GENERATED,
        "onnxruntime_onnx",
        "onnxruntime",
        4,
    )
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4]
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [
        ("INPUT0", model_config_pb2.TYPE_FP32, [16]),
        ("INPUT1", model_config_pb2.TYPE_FP32, [16]),
    ]
    assert cfg.version_policy.latest.num_versions == 1
    # every field is known to tritonclient's proto and decodes to the same values as ours
    assert len(unknown_fields.UnknownFieldSet(cfg)) == 0
    assert json_format.MessageToDict(cfg) == json_format.MessageToDict(service.model_config(GENERATED))


async def test_statistics_and_repository_index(grpc_stub: Stub) -> None:
    stats = await grpc_stub.ModelStatistics(pb.ModelStatisticsRequest(name=VERSIONED, version="2"))
    assert [(s.name, s.version) for s in stats.model_stats] == [(VERSIONED, "2")]
    everything = await grpc_stub.ModelStatistics(pb.ModelStatisticsRequest())
    assert {(VERSIONED, "2"), (VERSIONED, "3"), (ADD_SUB, "1")} <= {(s.name, s.version) for s in everything.model_stats}
    index = (await grpc_stub.RepositoryIndex(pb.RepositoryIndexRequest())).models
    states = {(m.name, m.version): m.state for m in index}
    assert states[(BROKEN, "")] == "UNAVAILABLE"
    assert states[(VERSIONED, "3")] == "READY"
    assert "max_batch_size" in next(m.reason for m in index if m.name == BROKEN)
    ready = (await grpc_stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))).models
    assert [m.name for m in ready] == [m.name for m in index if m.state == "READY"]


async def test_statistics_all_versions_of_one_model(grpc_stub: Stub) -> None:
    stats = await grpc_stub.ModelStatistics(pb.ModelStatisticsRequest(name=VERSIONED))
    assert [(s.name, s.version) for s in stats.model_stats] == [(VERSIONED, "2"), (VERSIONED, "3")]


# --------------------------------------------------------------------------- inference


async def test_infer_raw(grpc_stub: Stub) -> None:
    a, b = operands(batch=4)
    resp = await grpc_stub.ModelInfer(add_sub_request(a, b, request_id="g-1"))
    assert (resp.model_name, resp.model_version, resp.id) == (ADD_SUB, "1", "g-1")
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [
        ("OUTPUT0", "FP32", [4, 16]),
        ("OUTPUT1", "FP32", [4, 16]),
    ]
    result = grpcclient.InferResult(resp)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


async def test_infer_versions_and_requested_output(grpc_stub: Stub) -> None:
    a, b = operands()
    latest = await grpc_stub.ModelInfer(add_sub_request(a, b, model=VERSIONED))
    assert latest.model_version == "3"
    req = add_sub_request(a, b, model=VERSIONED, version="2")
    req.outputs.add(name="OUTPUT1")
    resp = await grpc_stub.ModelInfer(req)
    assert resp.model_version == "2"
    assert [o.name for o in resp.outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(grpcclient.InferResult(resp).as_numpy("OUTPUT1"), a - b)


async def test_infer_typed_contents(grpc_stub: Stub) -> None:
    req = pb.ModelInferRequest(model_name=ADD_SUB)
    for name, value in (("INPUT0", 1.5), ("INPUT1", 0.25)):
        req.inputs.add(name=name, datatype="FP32", shape=[2, 16]).contents.fp32_contents.extend([value] * 32)
    result = grpcclient.InferResult(await grpc_stub.ModelInfer(req))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((2, 16), 1.75, np.float32))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.full((2, 16), 1.25, np.float32))


async def test_infer_bytes_typed_and_raw(grpc_stub: Stub) -> None:
    values = [b"", b"abc", "\u00fc".encode(), b"a\x00b"]
    typed = pb.ModelInferRequest(model_name=IDENTITY_BYTES)
    typed.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 4]).contents.bytes_contents.extend(values)
    raw = pb.ModelInferRequest(model_name=IDENTITY_BYTES)
    raw.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 4])
    raw.raw_input_contents.append(b"".join(struct.pack("<I", len(v)) + v for v in values))
    for req in (typed, raw):
        resp = await grpc_stub.ModelInfer(req)
        assert resp.raw_output_contents[0] == raw.raw_input_contents[0]  # always raw, length-prefixed
        got = grpcclient.InferResult(resp).as_numpy("OUTPUT0")
        assert got.shape == (1, 4)
        assert list(got.ravel()) == values


async def test_non_utf8_bytes_are_not_silently_altered(grpc_stub: Stub) -> None:
    value = b"\x00\xff\xfe"
    req = pb.ModelInferRequest(model_name=IDENTITY_BYTES)
    req.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 1]).contents.bytes_contents.append(value)
    try:
        resp = await grpc_stub.ModelInfer(req)
    except grpc.aio.AioRpcError as exc:  # refusing the data is acceptable too
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        return
    assert list(grpcclient.InferResult(resp).as_numpy("OUTPUT0").ravel()) == [value]


# --------------------------------------------------------------------------- errors


async def test_error_codes(grpc_stub: Stub) -> None:
    a, b = operands()
    err = await rpc_error(grpc_stub.ModelInfer(add_sub_request(a, b, model="nope")))
    assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'nope' is not found")
    err = await rpc_error(grpc_stub.ModelMetadata(pb.ModelMetadataRequest(name=ADD_SUB, version="5")))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert f"'{ADD_SUB}' version 5 is not found" in err.details()
    err = await rpc_error(grpc_stub.ModelConfig(pb.ModelConfigRequest(name=BROKEN)))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    err = await rpc_error(grpc_stub.ModelStatistics(pb.ModelStatisticsRequest(name="nope")))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # Triton: "requested model 'nope' is not available"

    bad = add_sub_request(a[:, :8], b[:, :8])
    err = await rpc_error(grpc_stub.ModelInfer(bad))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Expected [-1,16], got [1,8]" in err.details()

    both = add_sub_request(a, b)
    both.inputs[0].contents.fp32_contents.extend([0.0] * 16)
    err = await rpc_error(grpc_stub.ModelInfer(both))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "contents field must not be specified when using raw_input_contents" in err.details()

    wrong_field = pb.ModelInferRequest(model_name=ADD_SUB)
    for name in ("INPUT0", "INPUT1"):
        wrong_field.inputs.add(name=name, datatype="FP32", shape=[1, 16]).contents.int_contents.extend([1] * 16)
    err = await rpc_error(grpc_stub.ModelInfer(wrong_field))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "of type 'INT32', expected datatype 'FP32'" in err.details()

    # the server is unharmed
    assert (await grpc_stub.ModelInfer(add_sub_request(a, b))).model_version == "1"


async def test_backend_failure_is_internal(
    grpc_stub: Stub, instances: dict[ModelKey, ModelInstance], monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(*_: Any) -> dict[str, np.ndarray]:
        raise RuntimeError("backend exploded")

    monkeypatch.setattr(instances[ModelKey(ADD_SUB, 1)].backend, "execute", explode)
    a, b = operands()
    err = await rpc_error(grpc_stub.ModelInfer(add_sub_request(a, b)))
    assert (err.code(), err.details()) == (grpc.StatusCode.INTERNAL, "RuntimeError: backend exploded")
    monkeypatch.undo()
    result = grpcclient.InferResult(await grpc_stub.ModelInfer(add_sub_request(a, b)))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


# --------------------------------------------------------------------------- streaming


async def test_stream_opened_with_triton_grpc_error_ends_at_its_first_error(grpc_stub: Stub) -> None:
    """Triton's ``triton_grpc_error: true`` header: the first error closes the stream with its gRPC status."""
    a, b = operands()
    call = grpc_stub.ModelStreamInfer(metadata=(("triton_grpc_error", "true"),))
    await call.write(add_sub_request(a, b, request_id="0"))
    first = await call.read()
    assert first.error_message == "" and first.infer_response.id == "0"
    await call.write(add_sub_request(a, b, model="nope", request_id="unknown"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert err.value.details() == "Request for unknown model: 'nope' is not found"


async def test_stream_inband_errors_keep_stream_open(
    grpc_stub: Stub, instances: dict[ModelKey, ModelInstance], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One response per request; validation and backend errors come in-band and the stream goes on."""
    backend = instances[ModelKey(ADD_SUB, 1)].backend
    real_execute = backend.execute

    def poisoned(inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        if float(inputs["INPUT0"].flat[0]) < 0:
            raise RuntimeError("poisoned input")
        return real_execute(inputs, names)

    monkeypatch.setattr(backend, "execute", poisoned)
    a, b = operands()
    missing = pb.ModelInferRequest(model_name=ADD_SUB, id="missing")
    missing.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    missing.raw_input_contents.append(a.tobytes())

    call = grpc_stub.ModelStreamInfer()
    await call.write(add_sub_request(a, b, request_id="0"))
    first = await call.read()
    await call.write(missing)
    await call.write(add_sub_request(a, b, model="nope", request_id="unknown"))
    await call.write(add_sub_request(a - 100, b, request_id="poison"))
    await call.write(add_sub_request(a, b, model=VERSIONED, version="2", request_id="after"))
    rest = [await call.read() for _ in range(4)]
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK

    assert first.error_message == ""
    assert first.infer_response.id == "0"
    np.testing.assert_array_equal(grpcclient.InferResult(first.infer_response).as_numpy("OUTPUT0"), a + b)
    # Responses come as requests complete (as in Triton): match them by id.
    by_id = {r.infer_response.id: r for r in rest}
    assert "missing required input(s) ['INPUT1']" in by_id["missing"].error_message
    assert by_id["unknown"].error_message == "Request for unknown model: 'nope' is not found"
    assert by_id["poison"].error_message == "RuntimeError: poisoned input"
    after = by_id["after"]
    assert after.error_message == ""
    assert (after.infer_response.id, after.infer_response.model_version) == ("after", "2")
    np.testing.assert_array_equal(grpcclient.InferResult(after.infer_response).as_numpy("OUTPUT1"), a - b)
