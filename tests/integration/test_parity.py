"""HTTP and gRPC answer the same bad request with the same message and the mapped status.

Each case is written once, protocol-neutral (tensors as wire bytes), then sent as
an HTTP binary-extension body and as a gRPC ModelInferRequest with
raw_input_contents.  Equal messages show both front ends go through the one
validation path (InferenceService + validate_request + tensor_codec).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc

from serve_app.keys import ModelKey
from serve_app.runtime import ModelInstance
from serve_app.service import InferenceService, ModelState
from tests.support.repos import ADD_SUB, BROKEN, IDENTITY_BYTES, VERSIONED

# The one mapping: HTTP status <-> gRPC code.
STATUS_PAIRS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    503: grpc.StatusCode.UNAVAILABLE,
    500: grpc.StatusCode.INTERNAL,
}

Params = dict[str, Any]


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes


@dataclass(frozen=True)
class Case:
    id: str
    status: int
    fragment: str
    model: str = ADD_SUB
    version: str = ""
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[tuple[str, Params], ...] = ()
    parameters: Params = field(default_factory=dict)
    setup: Callable[[InferenceService, dict[ModelKey, ModelInstance], pytest.MonkeyPatch], None] | None = None


def fp32(name: str, shape: tuple[int, ...], datatype: str = "FP32", nbytes: int | None = None) -> Tensor:
    count = int(np.prod(shape))
    raw = np.zeros(count, dtype=np.float32).tobytes()
    return Tensor(name, datatype, shape, raw if nbytes is None else raw[:nbytes])


GOOD = (fp32("INPUT0", (1, 16)), fp32("INPUT1", (1, 16)))


def _loading(service: InferenceService, _: Any, mp: pytest.MonkeyPatch) -> None:
    mp.setattr(service.registry.resolve(VERSIONED, "3"), "state", ModelState.LOADING)


def _explode(_: InferenceService, instances: dict[ModelKey, ModelInstance], mp: pytest.MonkeyPatch) -> None:
    def execute(*_: Any) -> dict[str, np.ndarray]:
        raise ValueError("engine fell over")

    mp.setattr(instances[ModelKey(ADD_SUB, 1)].backend, "execute", execute)


CASES = [
    Case("unknown-model", 404, "Request for unknown model: 'nope' is not found", model="nope", inputs=GOOD),
    Case("unknown-version", 404, f"'{ADD_SUB}' version 9 is not found", version="9", inputs=GOOD),
    Case("version-not-served", 404, f"'{VERSIONED}' version 1 is not found", model=VERSIONED, version="1", inputs=GOOD),
    Case(
        "bad-version", 400, "failed to get model version from specified version string 'v1'", version="v1", inputs=GOOD
    ),
    Case("failed-model", 503, f"'{BROKEN}' has no available versions", model=BROKEN, inputs=GOOD),
    Case("loading", 503, "version 3 is not at ready state", model=VERSIONED, inputs=GOOD, setup=_loading),
    Case("missing-input", 400, "missing required input(s) ['INPUT1']", inputs=GOOD[:1]),
    Case("unknown-input", 400, "unexpected inference input 'INPUT7'", inputs=(GOOD[0], fp32("INPUT7", (1, 16)))),
    Case(
        "extra-input",
        400,
        "expected 2 inputs but got 3 inputs for model 'add_sub'. Got input(s) ['INPUT0','INPUT1','INPUT7'], but "
        "missing required input(s) ]. Please provide all required input(s).",
        inputs=(*GOOD, fp32("INPUT7", (1, 16))),
    ),
    Case("duplicate-input", 400, "input 'INPUT0' already exists in request", inputs=(*GOOD, GOOD[0])),
    Case(
        "wrong-datatype",
        400,
        "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'",
        inputs=(fp32("INPUT0", (1, 16), "INT32"), GOOD[1]),
    ),
    Case(
        "unknown-datatype", 400, "invalid datatype 'FP8' for input 'INPUT0'", inputs=(fp32("INPUT0", (1, 16), "FP8"),)
    ),
    Case(
        "wrong-shape",
        400,
        "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,8]",
        inputs=(fp32("INPUT0", (1, 8)), fp32("INPUT1", (1, 8))),
    ),
    Case(
        "batch-too-big",
        400,
        "inference request batch-size must be <= 8 for 'add_sub'",
        inputs=(fp32("INPUT0", (9, 16)), fp32("INPUT1", (9, 16))),
    ),
    Case(
        "batch-mismatch",
        400,
        "input 'INPUT1' batch size does not match other inputs",
        inputs=(fp32("INPUT0", (2, 16)), fp32("INPUT1", (1, 16))),
    ),
    Case(
        "byte-size",
        400,
        "unexpected total byte size 60 for input 'INPUT1', expecting 64",
        inputs=(GOOD[0], fp32("INPUT1", (1, 16), nbytes=60)),
    ),
    Case(
        "bytes-element-overrun",
        400,
        "element 0 of input 'INPUT0' has byte size 5, which exceeds the end of the buffer",
        model=IDENTITY_BYTES,
        inputs=(Tensor("INPUT0", "BYTES", (1, 1), struct.pack("<I", 5) + b"ab"),),
    ),
    Case("unknown-output", 400, "unexpected inference output 'OUTPUT9'", inputs=GOOD, outputs=(("OUTPUT9", {}),)),
    Case(
        "duplicate-output",
        400,
        "output 'OUTPUT0' already exists in request",
        inputs=GOOD,
        outputs=(("OUTPUT0", {}), ("OUTPUT0", {})),
    ),
    Case(
        "output-shared-memory",
        400,
        "system shared memory is not enabled on this server",
        inputs=GOOD,
        outputs=(("OUTPUT0", {"shared_memory_region": "shm0", "shared_memory_byte_size": 64}),),
    ),
    Case("backend-raises", 500, "ValueError: engine fell over", inputs=GOOD, setup=_explode),
]


def http_request(case: Case) -> tuple[str, bytes, dict[str, str]]:
    path = f"/v2/models/{case.model}" + (f"/versions/{case.version}" if case.version else "") + "/infer"
    header: dict[str, Any] = {
        "inputs": [
            {
                "name": t.name,
                "datatype": t.datatype,
                "shape": list(t.shape),
                "parameters": {"binary_data_size": len(t.raw)},
            }
            for t in case.inputs
        ]
    }
    if case.outputs:
        header["outputs"] = [{"name": n, "parameters": p} if p else {"name": n} for n, p in case.outputs]
    if case.parameters:
        header["parameters"] = case.parameters
    head = json.dumps(header).encode()
    body = head + b"".join(t.raw for t in case.inputs)
    return path, body, {"Inference-Header-Content-Length": str(len(head))}


def _set_params(target: Any, params: Params) -> None:
    for key, value in params.items():
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int):
            target[key].int64_param = value
        else:
            target[key].string_param = str(value)


def grpc_request(case: Case) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=case.model, model_version=case.version)
    for t in case.inputs:
        req.inputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        req.raw_input_contents.append(t.raw)
    for name, params in case.outputs:
        _set_params(req.outputs.add(name=name).parameters, params)
    _set_params(req.parameters, case.parameters)
    return req


async def both(
    http: httpx.AsyncClient, stub: service_pb2_grpc.GRPCInferenceServiceStub, case: Case
) -> tuple[tuple[int, str], tuple[grpc.StatusCode, str]]:
    path, body, headers = http_request(case)
    r = await http.post(path, content=body, headers=headers)
    assert r.status_code != 200, f"HTTP accepted {case.id}"
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.ModelInfer(grpc_request(case))
    return (r.status_code, r.json()["error"]), (exc.value.code(), exc.value.details())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_same_error_on_both_protocols(
    http: httpx.AsyncClient,
    grpc_stub: service_pb2_grpc.GRPCInferenceServiceStub,
    service: InferenceService,
    instances: dict[ModelKey, ModelInstance],
    monkeypatch: pytest.MonkeyPatch,
    case: Case,
) -> None:
    if case.setup is not None:
        case.setup(service, instances, monkeypatch)
    (status, http_message), (code, grpc_message) = await both(http, grpc_stub, case)
    assert http_message == grpc_message
    assert case.fragment in http_message
    assert status == case.status
    assert code == STATUS_PAIRS[status]


async def test_good_request_agrees_too(
    http: httpx.AsyncClient, grpc_stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    """The harness itself: a valid case is accepted by both and gives the same bytes."""
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    tensors = (Tensor("INPUT0", "FP32", (2, 16), a.tobytes()), Tensor("INPUT1", "FP32", (2, 16), a.tobytes()))
    case = Case("ok", 200, "", inputs=tensors, parameters={"binary_data_output": True})
    path, body, headers = http_request(case)
    r = await http.post(path, content=body, headers=headers)
    assert r.status_code == 200, r.text
    n = int(r.headers["Inference-Header-Content-Length"])
    resp = await grpc_stub.ModelInfer(grpc_request(case))
    assert r.content[n:] == b"".join(resp.raw_output_contents)
    assert np.array_equal(np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(2, 16), a + a)


@pytest.mark.parametrize(
    "case",
    [
        Case(
            "unknown-model+bad-datatype",
            404,
            "'nope' is not found",
            model="nope",
            inputs=(fp32("INPUT0", (1, 16), "FP8"),),
        ),
        Case(
            "failed-model+reserved-param",
            503,
            f"'{BROKEN}' has no available versions",
            model=BROKEN,
            inputs=GOOD,
            parameters={"triton_x": 1},
        ),
    ],
    ids=lambda c: c.id,
)
async def test_model_is_resolved_before_decoding_on_both_protocols(
    http: httpx.AsyncClient, grpc_stub: service_pb2_grpc.GRPCInferenceServiceStub, case: Case
) -> None:
    (status, http_message), (code, grpc_message) = await both(http, grpc_stub, case)
    assert status == case.status and case.fragment in http_message  # HTTP gets this right today
    assert (code, grpc_message) == (STATUS_PAIRS[status], http_message)


async def test_reserved_parameters_follow_each_front_end(
    http: httpx.AsyncClient, grpc_stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    """As in Triton: HTTP refuses every 'triton_' key; gRPC lists the one it accepts (its streams read it)."""
    case = Case("reserved", 400, "", inputs=GOOD, parameters={"triton_secret": 1})
    (status, http_message), (code, grpc_message) = await both(http, grpc_stub, case)
    assert status == 400 and code == grpc.StatusCode.INVALID_ARGUMENT
    assert http_message == (
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
    )
    assert grpc_message == (
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting "
        "with 'triton_' are allowed: triton_enable_empty_final_response"
    )
