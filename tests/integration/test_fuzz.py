"""Bad input at scale, in process: scripts/fuzz's generators at CI size, then one regression test per bug they found.

Every malformed request must get a client-error answer (never 500 / INTERNAL / UNKNOWN, never a hang), and
the server must be ready and serve a valid request afterwards.  The server is scripts/fuzz's in-process one:
the real repository, service and both front ends without Ray, with small request limits so limit cases are
cheap (``fuzz.IN_PROCESS_LIMITS``).  To dig into a failure: ``scripts/fuzz --seed SEED --protocols P --case N``.
"""

from __future__ import annotations

import json
import pathlib
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from serve_app.http_server import build_http_app
from serve_app.protocol.http_codec import NEGATIVE_DIMENSION
from serve_app.protos import grpc_service_pb2 as pb
from serve_app.service import InferenceService
from tests.support import fuzz
from tests.support.fuzz import sockets

SEED = 20251123
CASES = 400  # per protocol: about 3 s in all


LIMITS = fuzz.IN_PROCESS_LIMITS
Server = tuple[Any, InferenceService]  # (fuzz.Targets, the service behind them)
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def fuzz_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return fuzz.build_fuzz_repository(tmp_path_factory.mktemp("fuzz_repo"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(fuzz_repo: pathlib.Path) -> AsyncIterator[Server]:
    """One server for the module (its tests run in the module's event loop, where its gRPC server lives)."""
    async with fuzz.in_process(repo=fuzz_repo, timeout_s=10.0) as (targets, service):
        yield targets, service


async def grpc_call(t: Any, rpc: str, message: Any) -> tuple[str, str, bytes]:
    data = message if isinstance(message, bytes) else message.SerializeToString()
    return await fuzz.grpc_unary(t, rpc, data)


def add_sub_json(shape: list[int], data: list[float] | None = None) -> dict[str, Any]:
    n = shape[0] * shape[1] if len(shape) == 2 else 0
    values = [1.0] * max(n, 0) if data is None else data
    return {"inputs": [{"name": f"INPUT{i}", "datatype": "FP32", "shape": shape, "data": values} for i in (0, 1)]}


def add_sub_grpc(shape: list[int], raw: bytes = b"") -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="add_sub")
    for i in (0, 1):
        msg.inputs.add(name=f"INPUT{i}", datatype="FP32", shape=shape)
        msg.raw_input_contents.append(raw)
    return msg


# --------------------------------------------------------------------------- the fuzzer, CI size


@pytest.mark.parametrize("protocol", fuzz.PROTOCOLS)
async def test_fuzz_cases_get_client_errors_and_the_server_stays_ready(server: Server, protocol: str) -> None:
    t, _ = server
    gen = fuzz.Generator(await fuzz.discover(t.http), LIMITS, remote=False)
    start = time.monotonic()
    report = await fuzz.fuzz(t, gen, protocols=(protocol,), cases=CASES, seed=SEED, check_every=100)
    failures = [f"case {i} [{kind}] -> {o.status}: {o.problem}" for _, i, kind, o in report.failures]
    assert not failures, "\n".join(failures[:20])
    assert not report.health, report.health
    assert report.cases[protocol] == CASES
    statuses = report.statuses[protocol]
    assert sum(statuses.values()) == CASES
    # The cases reach both sides: valid requests answered, malformed ones refused.
    good = {"http": "200", "grpc": "OK", "parity": "200=OK"}[protocol]
    bad = {"http": "400", "grpc": "INVALID_ARGUMENT", "parity": "400=INVALID_ARGUMENT"}[protocol]
    assert statuses[good] > CASES // 10 and statuses[bad] > CASES // 3, statuses
    assert await fuzz.health(t, gen) == ""
    assert time.monotonic() - start < 15


async def test_cases_are_reproducible() -> None:
    models = [fuzz.ModelInfo("m", ("1",), True, 4, (fuzz.TensorInfo("X", "FP32", (-1, 2)),), ())]
    gen = fuzz.Generator(models, LIMITS, remote=False)
    for protocol in fuzz.PROTOCOLS:
        assert fuzz.describe(gen.case(protocol, 3, 17)) == fuzz.describe(gen.case(protocol, 3, 17))


# --------------------------------------------------------------------------- regressions: what fuzzing found


@pytest.mark.parametrize(("model", "dims"), [("acc_direct", 1), ("add_sub", 16)])
async def test_empty_batch_is_refused_on_both_protocols(server: Server, model: str, dims: int) -> None:
    """Was 500 IndexError for a sequence model (and an empty answer for others); Triton refuses batch 0."""
    t, _ = server
    names = ["INPUT"] if model == "acc_direct" else ["INPUT0", "INPUT1"]
    dtype = "INT32" if model == "acc_direct" else "FP32"
    params = {"sequence_id": 7, "sequence_start": True, "sequence_end": True} if model == "acc_direct" else {}
    body = {
        "parameters": params,
        "inputs": [{"name": n, "datatype": dtype, "shape": [0, dims], "data": []} for n in names],
    }
    resp = await t.http.post(f"/v2/models/{model}/infer", json=body)
    expected = f"inference request batch-size must be >= 1 for '{model}'"
    assert (resp.status_code, resp.json()) == (400, {"error": expected})
    msg = pb.ModelInferRequest(model_name=model)
    for key, value in params.items():
        fuzz.set_param(msg.parameters, key, value)
    for n in names:
        msg.inputs.add(name=n, datatype=dtype, shape=[0, dims])
        msg.raw_input_contents.append(b"")
    assert (await grpc_call(t, "ModelInfer", msg))[:2] == ("INVALID_ARGUMENT", expected)
    body["inputs"] = [{"name": n, "datatype": dtype, "shape": [1, dims], "data": [1] * dims} for n in names]
    assert (await t.http.post(f"/v2/models/{model}/infer", json=body)).status_code == 200


@pytest.mark.parametrize(
    "path", ["/v2/repository/index", "/v2/repository/models/x/load", "/v2/repository/models/x/unload"]
)
async def test_deeply_nested_repository_bodies_are_400(server: Server, path: str) -> None:
    """The index answered 500 RecursionError to ``[[[[...``."""
    t, _ = server
    resp = await t.http.post(path, content=b"[" * 5000)
    assert resp.status_code == 400
    assert resp.json()["error"].startswith("JSON nesting depth exceeds maximum allowed limit")


@pytest.mark.parametrize("rpc", ["ModelInfer", "ModelMetadata", "RepositoryIndex"])
async def test_bytes_that_are_not_a_message_are_invalid_argument(server: Server, rpc: str) -> None:
    """grpc answered UNKNOWN ("Unexpected <class 'DecodeError'>") when a request did not parse."""
    t, _ = server
    code, details, _ = await grpc_call(t, rpc, b"\x0a\x02\xff\xfe")  # field 1 (a string) holding invalid UTF-8
    assert code == "INVALID_ARGUMENT"
    assert details.startswith("failed to parse the request message: Error parsing message")
    assert (await grpc_call(t, rpc, b"\xff\xff\xff"))[0] == "INVALID_ARGUMENT"


async def test_a_stream_answers_a_message_that_does_not_parse_in_band(server: Server) -> None:
    t, _ = server
    good = add_sub_grpc([1, 16], struct.pack("<16f", *range(16))).SerializeToString()
    call = t.channel.stream_stream(fuzz.SERVICE + "ModelStreamInfer")

    async def requests() -> AsyncIterator[bytes]:
        for payload in (b"\x0a\x02\xff\xfe", good):
            yield payload

    answers = [pb.ModelStreamInferResponse.FromString(a) async for a in call(requests(), timeout=10)]
    errors = sorted(a.error_message for a in answers)
    assert errors[0] == "" and errors[1].startswith("failed to parse the request message: ")


@pytest.mark.parametrize(
    ("method", "path", "status"), [("GET", "/v2/nope", 404), ("GET", "/v2/models/add_sub/infer", 405)]
)
async def test_routing_errors_are_json(server: Server, method: str, path: str, status: int) -> None:
    """Starlette answered unknown routes and wrong methods in plain text, not ``{"error": ...}``."""
    t, _ = server
    resp = await t.http.request(method, path)
    assert resp.status_code == status
    assert resp.json() == {"error": "Not Found" if status == 404 else "Method Not Allowed"}
    if status == 405:
        assert resp.headers["allow"] == "POST"


async def test_negative_dimension_gets_tritons_message_on_each_protocol(server: Server) -> None:
    """HTTP: Triton's front end reads dimensions as unsigned, and its parser answers 500; gRPC carries int64
    dimensions to the core's check."""
    t, _ = server
    resp = await t.http.post("/v2/models/add_sub/infer", json=add_sub_json([-1, 16], []))
    assert (resp.status_code, resp.json()) == (500, {"error": NEGATIVE_DIMENSION})
    expected = "All input dimensions should be specified for input 'INPUT0' for model 'add_sub', got [-1,16]"
    assert (await grpc_call(t, "ModelInfer", add_sub_grpc([-1, 16])))[:2] == ("INVALID_ARGUMENT", expected)


@pytest.mark.parametrize("k", [-1, "2", 1.5, 0])
async def test_classification_of_the_wrong_type_gets_one_message(server: Server, k: object) -> None:
    """HTTP refused it in its codec with its own words; now both protocols share the classification check."""
    t, _ = server
    body = add_sub_json([1, 16])
    body["outputs"] = [{"name": "OUTPUT0", "parameters": {"classification": k}}]
    resp = await t.http.post("/v2/models/add_sub/infer", json=body)
    expected = (
        f"parameter 'classification' of output 'OUTPUT0' for model 'add_sub' must be a positive integer, got {k!r}"
    )
    assert (resp.status_code, resp.json()) == (400, {"error": expected})
    msg = add_sub_grpc([1, 16], bytes(64))
    fuzz.set_param(msg.outputs.add(name="OUTPUT0").parameters, "classification", k)
    assert (await grpc_call(t, "ModelInfer", msg))[:2] == ("INVALID_ARGUMENT", expected)


# --------------------------------------------------------------------------- limits, before allocating


async def test_body_over_the_limit_by_its_content_length_is_413(server: Server) -> None:
    """Refused on the header alone, before a byte of the body is read."""
    t, _ = server
    resp = await t.http.post(
        "/v2/models/add_sub/infer", content=b"{}", headers={"Content-Length": str(LIMITS.max_body_bytes + 1)}
    )
    assert resp.status_code == 413
    assert resp.json()["error"] == (
        f"request body size of {LIMITS.max_body_bytes + 1} bytes exceeds the maximum allowed value of "
        f"{LIMITS.max_body_bytes} bytes, the server's max_body_bytes limit (raise it with --max-body-bytes)"
    )


async def test_chunked_body_over_the_limit_is_413_while_read(server: Server) -> None:
    t, _ = server
    chunk = b" " * 65536
    chunks_sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal chunks_sent
        for _ in range(LIMITS.max_body_bytes // len(chunk) * 4):
            chunks_sent += 1
            yield chunk

    resp = await t.http.post("/v2/repository/index", content=body())
    assert resp.status_code == 413
    assert resp.json()["error"].startswith("request JSON size exceeds the maximum allowed input size")
    total = await t.http.post("/v2/repository/index", content=fuzz.chunks(b" " * (LIMITS.max_body_bytes // 2)))
    assert total.status_code == 200


async def test_a_deeply_nested_ready_gets_tritons_answer_not_the_depth_limit(server: Server) -> None:
    """Triton parses the whole body and then finds 'ready' is no boolean; the answer is the same here."""
    t, _ = server
    depth = 250_000
    body = b'{"ready":' + b"[" * depth + b"true" + b"]" * depth + b"}"
    resp = await t.http.post("/v2/repository/index", content=body)
    assert (resp.status_code, resp.json()) == (400, {"error": "Invalid value for 'ready': expected a boolean"})
    deep_elsewhere = await t.http.post(
        "/v2/repository/index", content=b'{"ready":true,"x":' + b"[" * 200 + b"]" * 200 + b"}"
    )
    assert deep_elsewhere.json()["error"].startswith("JSON nesting depth exceeds maximum allowed limit")


async def test_a_json_body_over_the_limit_says_so_in_tritons_words(server: Server) -> None:
    """Triton's check on a JSON body (a model load with its files, say) fires first on the same input."""
    t, _ = server
    resp = await t.http.post(
        "/v2/repository/models/m/load", content=b"{}", headers={"Content-Length": str(LIMITS.max_body_bytes + 1)}
    )
    assert resp.status_code == 413
    assert resp.json()["error"] == (
        f"request JSON size of {LIMITS.max_body_bytes + 1} bytes exceeds the maximum allowed input size of "
        f"{LIMITS.max_body_bytes} bytes, the server's max_body_bytes limit (raise it with --max-body-bytes)"
    )


@pytest.mark.parametrize("value", ["abc", "-1", "1, 2", "\uff11"])  # the last: a full-width digit one
async def test_invalid_content_length_is_400(server: Server, value: str) -> None:
    t, _ = server
    resp = await t.http.post("/v2/repository/index", content=b"{}", headers={"Content-Length": value.encode()})
    assert resp.status_code == 400
    assert resp.json()["error"].startswith("invalid Content-Length header")


async def test_default_limits_apply_without_any_wiring(server: Server) -> None:
    app = build_http_app(server[1])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        resp = await client.post("/v2/repository/index", content=b"{}", headers={"Content-Length": str(2**26 + 1)})
        assert resp.status_code == 413
        assert "maximum allowed input size of 67108864 bytes" in resp.json()["error"]
        deep = await client.post("/v2/repository/index", content=b"[" * 105 + b"]" * 105)
        assert deep.json()["error"].startswith("JSON nesting depth exceeds maximum allowed limit (100)")
        at_limit = await client.post("/v2/repository/index", content=b"[" * 104 + b"]" * 104)
        assert at_limit.json() == {"error": "repository index request must be a JSON object"}  # parsed


async def test_a_100000_deep_infer_body_is_a_quick_400(server: Server) -> None:
    t, _ = server
    start = time.perf_counter()
    resp = await t.http.post("/v2/models/add_sub/infer", content=b"[" * 100_000)
    assert resp.status_code == 400
    assert resp.json()["error"] == (
        f"JSON nesting depth exceeds maximum allowed limit ({LIMITS.max_json_depth}), the server's max_json_depth "
        "limit (raise it with --max-json-depth)"
    )
    assert time.perf_counter() - start < 1.0
    ok = await t.http.post("/v2/models/add_sub/infer", json=add_sub_json([1, 16]))
    assert ok.status_code == 200


async def test_tensor_elements_are_limited_before_any_array_on_both_protocols(
    server: Server,
) -> None:
    """A shape declaring too many elements is refused before its data is looked at (here there is none)."""
    t, _ = server
    rows = LIMITS.max_tensor_elements // 16 // 2 + 1  # both inputs together pass the limit
    expected = (
        f"input 'INPUT1' brings the request for model 'add_sub' to {rows * 32} tensor elements, more than the "
        f"maximum allowed value of {LIMITS.max_tensor_elements}, the server's max_tensor_elements limit "
        "(raise it with --max-tensor-elements)"
    )
    body = {
        "inputs": [
            {"name": f"INPUT{i}", "datatype": "FP32", "shape": [rows, 16], "parameters": {"binary_data_size": 0}}
            for i in (0, 1)
        ]
    }
    header = json.dumps(body).encode()
    resp = await t.http.post(
        "/v2/models/add_sub/infer", content=header, headers={"Inference-Header-Content-Length": str(len(header))}
    )
    assert (resp.status_code, resp.json()) == (400, {"error": expected})
    assert (await grpc_call(t, "ModelInfer", add_sub_grpc([rows, 16])))[:2] == ("INVALID_ARGUMENT", expected)


async def test_inputs_and_outputs_are_counted_on_both_protocols(server: Server) -> None:
    t, _ = server
    n = LIMITS.max_inputs + 1
    expected = (
        f"request for model 'add_sub' has {n} inputs, more than the maximum allowed value of {LIMITS.max_inputs}, "
        "the server's max_inputs limit (raise it with --max-inputs)"
    )
    body = {"inputs": [{"name": f"X{i}", "datatype": "BOOL", "shape": [0], "data": []} for i in range(n)]}
    resp = await t.http.post("/v2/models/add_sub/infer", json=body)
    assert (resp.status_code, resp.json()) == (400, {"error": expected})
    msg = pb.ModelInferRequest(model_name="add_sub")
    for i in range(n):
        msg.inputs.add(name=f"X{i}", datatype="BOOL", shape=[0])
    assert (await grpc_call(t, "ModelInfer", msg))[:2] == ("INVALID_ARGUMENT", expected)

    body = add_sub_json([1, 16])
    body["outputs"] = [{"name": f"O{i}"} for i in range(LIMITS.max_outputs + 1)]
    resp = await t.http.post("/v2/models/add_sub/infer", json=body)
    assert resp.status_code == 400 and "max_outputs" in resp.json()["error"]


async def test_grpc_message_over_the_limit_is_resource_exhausted(server: Server) -> None:
    t, _ = server
    code, details, _ = await grpc_call(t, "ModelInfer", add_sub_grpc([1, 16], bytes(LIMITS.max_body_bytes)))
    assert code == "RESOURCE_EXHAUSTED" and "larger than max" in details
    ok = await grpc_call(t, "ModelInfer", add_sub_grpc([1, 16], bytes(64)))
    assert ok[0] == "OK"


# --------------------------------------------------------------------------- abuse over real sockets


async def test_socket_abuse_gets_client_errors_and_memory_returns(server: Server) -> None:
    """Bad heads, oversized, nested and empty-object bodies, huge gRPC messages and HTTP/2 garbage on real
    sockets: no 5xx, each answered as its limit says (or closed), the server healthy, memory back within 5%."""
    _, service = server
    report = await sockets.abuse(service, LIMITS, model="add_sub", cases=120, seed=SEED, timeout_s=60.0)
    assert not report.problems, "\n".join(report.problems[:20])
    assert report.healthy
    assert report.cases == 120
    print(report.summary())
    assert report.memory_growth <= 0.05, report.summary()
    answers = set(report.answers)
    assert {"http 414", "http 431", "http 413", "http 400", "grpc grpc 3", "grpc grpc 8"} <= answers, answers
