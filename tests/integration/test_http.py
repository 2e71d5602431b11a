"""The v2 HTTP front end in process: Starlette app over httpx's ASGI transport, real ONNX models."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from serve_app.keys import ModelKey
from serve_app.runtime import ModelInstance
from serve_app.service import InferenceService, ModelState
from tests.support.repos import ADD_SUB, BROKEN, GENERATED, IDENTITY_BYTES, IDENTITY_FP32, VERSIONED

HEADER = "Inference-Header-Content-Length"


def add_sub_inputs(
    batch: int = 1, binary: tuple[bool, bool] = (True, True)
) -> tuple[list[httpclient.InferInput], np.ndarray, np.ndarray]:
    a = np.arange(16 * batch, dtype=np.float32).reshape(batch, 16)
    b = np.full((batch, 16), 0.5, dtype=np.float32)
    inputs = [
        httpclient.InferInput("INPUT0", [batch, 16], "FP32"),
        httpclient.InferInput("INPUT1", [batch, 16], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary[0])
    inputs[1].set_data_from_numpy(b, binary_data=binary[1])
    return inputs, a, b


async def infer(
    http: httpx.AsyncClient,
    path: str,
    inputs: list[httpclient.InferInput],
    outputs: list[httpclient.InferRequestedOutput] | None = None,
    **kw: Any,
) -> tuple[httpx.Response, httpclient.InferResult | None]:
    """POST a body built by tritonclient; parse a 200 answer the way tritonclient does."""
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs, **kw)
    headers = {} if json_size is None else {HEADER: str(json_size)}
    r = await http.post(path, content=body, headers=headers)
    if r.status_code != 200:
        return r, None
    length = r.headers.get(HEADER)
    result = httpclient.InferResult.from_response_body(r.content, header_length=None if length is None else int(length))
    return r, result


def assert_error(r: httpx.Response, status: int, fragment: str) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert list(body) == ["error"]
    assert fragment in body["error"], body["error"]
    return body["error"]


# --------------------------------------------------------------------------- health, metadata, config


async def test_health_and_server_metadata(http: httpx.AsyncClient) -> None:
    assert (await http.get("/v2/health/live")).status_code == 200
    assert (await http.get("/v2/health/ready")).status_code == 200
    md = (await http.get("/v2")).json()
    assert md["name"] == "serve_app"
    assert {"binary_tensor_data", "model_configuration"} <= set(md["extensions"])


async def test_not_accepting_is_not_ready_but_live(
    http: httpx.AsyncClient, service: InferenceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "accepting", False)
    assert (await http.get("/v2/health/ready")).status_code == 400
    assert (await http.get("/v2/health/live")).status_code == 200


@pytest.mark.parametrize(
    ("path", "status"),
    [
        (f"/v2/models/{ADD_SUB}/ready", 200),
        (f"/v2/models/{ADD_SUB}/versions/1/ready", 200),
        (f"/v2/models/{VERSIONED}/ready", 200),
        (f"/v2/models/{VERSIONED}/versions/2/ready", 200),
        (f"/v2/models/{VERSIONED}/versions/3/ready", 200),
        (f"/v2/models/{VERSIONED}/versions/1/ready", 400),  # on disk, not served by the policy
        (f"/v2/models/{ADD_SUB}/versions/x/ready", 400),
        (f"/v2/models/{BROKEN}/ready", 400),
        ("/v2/models/nope/ready", 400),
    ],
)
async def test_model_ready_routes(http: httpx.AsyncClient, path: str, status: int) -> None:
    r = await http.get(path)
    assert r.status_code == status
    assert r.content == b""


@pytest.mark.parametrize(
    ("path", "versions"),
    [
        (f"/v2/models/{VERSIONED}", ["2", "3"]),
        (f"/v2/models/{VERSIONED}/versions/2", ["2"]),
        (f"/v2/models/{VERSIONED}/versions/3", ["3"]),
        (f"/v2/models/{ADD_SUB}/versions/1", ["1"]),
    ],
)
async def test_model_metadata_routes(http: httpx.AsyncClient, path: str, versions: list[str]) -> None:
    r = await http.get(path)
    assert r.status_code == 200, r.text
    md = r.json()
    assert md["versions"] == versions
    assert md["platform"] == "onnxruntime_onnx"
    assert md["inputs"] == [
        {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 16]},
    ]
    assert [o["name"] for o in md["outputs"]] == ["OUTPUT0", "OUTPUT1"]


async def test_config_routes(http: httpx.AsyncClient) -> None:
    plain = (await http.get(f"/v2/models/{VERSIONED}/config")).json()
    v2 = (await http.get(f"/v2/models/{VERSIONED}/versions/2/config")).json()
    assert plain == v2
    assert plain["version_policy"] == {"latest": {"num_versions": 2}}
    assert_error(await http.get(f"/v2/models/{VERSIONED}/versions/1/config"), 404, "version 1 is not found")


async def test_generated_config_json(http: httpx.AsyncClient) -> None:
    """No config.pbtxt: the config endpoint shows what was generated from the ONNX file, in Triton's JSON form."""
    r = await http.get(f"/v2/models/{GENERATED}/config")
    assert r.status_code == 200, r.text
    cfg = r.json()
    assert cfg["name"] == GENERATED
    assert cfg["platform"] == "onnxruntime_onnx"
    assert cfg["backend"] == "onnxruntime"
    assert cfg["default_model_filename"] == "model.onnx"
    # symbolic batch dim -> batching with Triton's default max_batch_size 4, dynamic batching on
    assert cfg["max_batch_size"] == 4
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [4]
    assert cfg["version_policy"] == {"latest": {"num_versions": 1}}
    # batch dim stripped; int64 dims as JSON numbers, enums by name, defaults printed
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]] == [
        ("INPUT0", "TYPE_FP32", [16]),
        ("INPUT1", "TYPE_FP32", [16]),
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [16]),
        ("OUTPUT1", "TYPE_FP32", [16]),
    ]
    assert cfg["input"][0]["optional"] is False
    assert cfg["input"][0]["format"] == "FORMAT_NONE"
    md = (await http.get(f"/v2/models/{GENERATED}")).json()
    assert [t["shape"] for t in md["inputs"]] == [[-1, 16], [-1, 16]]


# --------------------------------------------------------------------------- repository index


async def test_repository_index(http: httpx.AsyncClient) -> None:
    r = await http.post("/v2/repository/index")
    assert r.status_code == 200, r.text
    index = r.json()
    by_name: dict[str, list[dict[str, str]]] = {}
    for item in index:
        by_name.setdefault(item["name"], []).append(item)
    assert sorted(by_name) == sorted([ADD_SUB, BROKEN, GENERATED, IDENTITY_BYTES, IDENTITY_FP32, VERSIONED])
    assert by_name[VERSIONED] == [
        {"name": VERSIONED, "version": "2", "state": "READY"},
        {"name": VERSIONED, "version": "3", "state": "READY"},
    ]
    (broken,) = by_name[BROKEN]
    assert "version" not in broken
    assert broken["state"] == "UNAVAILABLE"
    assert "max_batch_size" in broken["reason"]

    ready = (await http.post("/v2/repository/index", json={"ready": True})).json()
    assert ready == [m for m in index if m["state"] == "READY"]
    assert (await http.post("/v2/repository/index", json={"ready": False})).json() == index
    assert (await http.post("/v2/repository/index", json={})).json() == index


async def test_loading_version(
    http: httpx.AsyncClient, service: InferenceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version still loading: server not ready, listed LOADING, not in the ready index, 503 on infer."""
    entry = service.registry.resolve(VERSIONED, "3")
    monkeypatch.setattr(entry, "state", ModelState.LOADING)
    assert (await http.get("/v2/health/ready")).status_code == 400
    assert (await http.get(f"/v2/models/{VERSIONED}/versions/3/ready")).status_code == 400
    assert (await http.get(f"/v2/models/{VERSIONED}/versions/2/ready")).status_code == 200
    index = (await http.post("/v2/repository/index")).json()
    assert {"name": VERSIONED, "version": "3", "state": "LOADING"} in index
    ready = (await http.post("/v2/repository/index", json={"ready": True})).json()
    assert [m["version"] for m in ready if m["name"] == VERSIONED] == ["2"]

    inputs, a, b = add_sub_inputs()
    r, _ = await infer(http, f"/v2/models/{VERSIONED}/infer", inputs)
    assert_error(r, 503, f"'{VERSIONED}' version 3 is not at ready state")
    r, result = await infer(http, f"/v2/models/{VERSIONED}/versions/2/infer", inputs)
    assert result is not None, r.text
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [(b"{not json", "failed to parse the request JSON buffer"), (b"[true]", "must be a JSON object")],
)
async def test_repository_index_bad_body(http: httpx.AsyncClient, body: bytes, fragment: str) -> None:
    assert_error(await http.post("/v2/repository/index", content=body), 400, fragment)


async def test_repository_index_ready_must_be_boolean(http: httpx.AsyncClient) -> None:
    r = await http.post("/v2/repository/index", json={"ready": "false"})
    assert r.status_code == 400, r.text
    assert "ready" in r.json()["error"]


# --------------------------------------------------------------------------- inference


@pytest.mark.parametrize(
    ("in_binary", "out_binary"),
    [
        ((True, True), (True, True)),
        ((False, False), (False, False)),
        ((True, False), (False, True)),  # mixed: JSON and binary in one body, both ways
    ],
    ids=["binary", "json", "mixed"],
)
async def test_add_sub_bodies(
    http: httpx.AsyncClient, in_binary: tuple[bool, bool], out_binary: tuple[bool, bool]
) -> None:
    inputs, a, b = add_sub_inputs(batch=3, binary=in_binary)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=out_binary[0]),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=out_binary[1]),
    ]
    r, result = await infer(
        http, f"/v2/models/{ADD_SUB}/infer", inputs, outputs, request_id="r-1", parameters={"custom": "x"}
    )
    assert result is not None, r.text
    assert (HEADER in r.headers) == any(out_binary)
    assert r.headers["content-type"] == ("application/octet-stream" if any(out_binary) else "application/json")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    resp = result.get_response()
    assert (resp["id"], resp["model_name"], resp["model_version"]) == ("r-1", ADD_SUB, "1")
    for out, binary in zip(resp["outputs"], out_binary, strict=True):
        assert out["shape"] == [3, 16]
        assert out["datatype"] == "FP32"
        if binary:
            assert out["parameters"] == {"binary_data_size": 3 * 16 * 4}
            assert "data" not in out
        else:
            assert "parameters" not in out


async def test_no_requested_outputs_come_back_binary(http: httpx.AsyncClient) -> None:
    """tritonclient sends binary_data_output=true when no outputs are named: every output is binary."""
    inputs, a, b = add_sub_inputs(binary=(False, False))
    r, result = await infer(http, f"/v2/models/{ADD_SUB}/versions/1/infer", inputs, priority=1, timeout=1000)
    assert result is not None, r.text
    assert "id" not in result.get_response()
    assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize(
    ("path", "version"), [(f"/v2/models/{VERSIONED}", "3"), (f"/v2/models/{VERSIONED}/versions/2", "2")]
)
async def test_infer_versions(http: httpx.AsyncClient, path: str, version: str) -> None:
    inputs, a, b = add_sub_inputs()
    r, result = await infer(http, f"{path}/infer", inputs)
    assert result is not None, r.text
    assert result.get_response()["model_version"] == version
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


@pytest.mark.parametrize("binary", [True, False])
async def test_bytes_round_trip(http: httpx.AsyncClient, binary: bool) -> None:
    arr = np.array([[b"", b"abc", "h\u00e9".encode()], [b"x", b"yz", b"0" * 33]], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [2, 3], "BYTES")
    inp.set_data_from_numpy(arr, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    r, result = await infer(http, f"/v2/models/{IDENTITY_BYTES}/infer", [inp], outputs)
    assert result is not None, r.text
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (2, 3)
    assert [x.encode() if isinstance(x, str) else bytes(x) for x in got.ravel()] == list(arr.ravel())


async def test_raw_binary_request_on_version_route(http: httpx.AsyncClient) -> None:
    data = np.arange(6, dtype=np.float32)
    r = await http.post(f"/v2/models/{IDENTITY_FP32}/versions/1/infer", content=data.tobytes(), headers={HEADER: "0"})
    assert r.status_code == 200, r.text
    result = httpclient.InferResult.from_response_body(r.content, header_length=int(r.headers[HEADER]))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data.reshape(1, 6))


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("method", "path", "status", "fragment"),
    [
        ("GET", "/v2/models/nope", 404, "Request for unknown model: 'nope' is not found"),
        ("GET", "/v2/models/nope/config", 404, "Request for unknown model: 'nope' is not found"),
        ("GET", f"/v2/models/{ADD_SUB}/versions/2", 404, f"'{ADD_SUB}' version 2 is not found"),
        (
            "GET",
            f"/v2/models/{ADD_SUB}/versions/x/config",
            400,
            "failed to get model version from specified version string 'x'",
        ),
        ("GET", f"/v2/models/{BROKEN}", 503, f"'{BROKEN}' has no available versions"),
        ("GET", f"/v2/models/{BROKEN}/config", 503, "max_batch_size"),
        ("POST", f"/v2/models/{BROKEN}/infer", 503, f"'{BROKEN}' has no available versions"),
        ("POST", f"/v2/models/{VERSIONED}/versions/1/infer", 404, f"'{VERSIONED}' version 1 is not found"),
        ("POST", f"/v2/models/{ADD_SUB}/infer", 400, "failed to parse the request JSON buffer"),
    ],
)
async def test_error_bodies(http: httpx.AsyncClient, method: str, path: str, status: int, fragment: str) -> None:
    content = b"{oops" if method == "POST" else None
    assert_error(await http.request(method, path, content=content), status, fragment)


@pytest.mark.parametrize(
    ("header", "body", "fragment"),
    [
        ({HEADER: "abc"}, b'{"inputs": []}', "Unable to parse Inference-Header-Content-Length"),
        ({HEADER: "99"}, b'{"inputs": []}', "inference header size should be in range"),
        ({}, b'{"inputs": {}}', "Unable to parse 'inputs'"),
        ({}, json.dumps({"inputs": [], "parameters": {"triton_x": 1}}).encode(), "reserved for Triton usage"),
    ],
)
async def test_malformed_infer_bodies(
    http: httpx.AsyncClient, header: dict[str, str], body: bytes, fragment: str
) -> None:
    assert_error(await http.post(f"/v2/models/{ADD_SUB}/infer", content=body, headers=header), 400, fragment)


def _raise(*_: Any) -> dict[str, np.ndarray]:
    raise RuntimeError("backend exploded")


def _wrong_dtype(inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    return {n: inputs["INPUT0"].astype(np.float64) for n in names}


def _missing_output(inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    return {}


@pytest.mark.parametrize(
    ("execute", "message"),
    [
        (_raise, "RuntimeError: backend exploded"),
        (_wrong_dtype, f"model '{ADD_SUB}' output 'OUTPUT0' has data type float64, config says TYPE_FP32"),
        (_missing_output, f"model '{ADD_SUB}' did not produce output 'OUTPUT0'"),
    ],
    ids=["raises", "wrong-dtype", "missing-output"],
)
async def test_backend_failure_is_500_and_next_request_works(
    http: httpx.AsyncClient,
    instances: dict[ModelKey, ModelInstance],
    monkeypatch: pytest.MonkeyPatch,
    execute: Any,
    message: str,
) -> None:
    instance = instances[ModelKey(ADD_SUB, 1)]
    monkeypatch.setattr(instance.backend, "execute", execute)
    inputs, a, b = add_sub_inputs()
    r, _ = await infer(http, f"/v2/models/{ADD_SUB}/infer", inputs)
    assert assert_error(r, 500, message) == message
    assert (await http.get("/v2/health/ready")).status_code == 200
    monkeypatch.undo()
    r, result = await infer(http, f"/v2/models/{ADD_SUB}/infer", inputs)
    assert result is not None, r.text
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


async def test_server_metadata_lists_triton_extensions_in_order(http: httpx.AsyncClient) -> None:
    extensions = (await http.get("/v2")).json()["extensions"]
    assert extensions[:6] == [
        "classification",
        "sequence",
        "model_repository",
        "model_repository(unload_dependents)",
        "schedule_policy",
        "model_configuration",
    ]


async def test_statistics_of_a_version_not_served_is_triton_s_400(http: httpx.AsyncClient) -> None:
    r = await http.get(f"/v2/models/{VERSIONED}/versions/1/stats")
    assert r.status_code == 400
    assert r.json() == {"error": f"requested model version is not available for model '{VERSIONED}'"}
