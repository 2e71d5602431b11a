"""KServe v2 over HTTP against the real server, with the stock tritonclient and raw httpx."""

from __future__ import annotations

import json
import struct

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.e2e.conftest import Server
from tests.e2e.models import IDENTITY_TYPES, as_bytes


@pytest.fixture(scope="module")
def client(server: Server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


def add_sub_inputs(batch: int = 1, binary: bool = True) -> tuple[list[httpclient.InferInput], np.ndarray, np.ndarray]:
    a = np.arange(16 * batch, dtype=np.float32).reshape(batch, 16)
    b = np.ones((batch, 16), dtype=np.float32)
    inputs = [
        httpclient.InferInput("INPUT0", [batch, 16], "FP32"),
        httpclient.InferInput("INPUT1", [batch, 16], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs, a, b


def test_health_and_server_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    md = client.get_server_metadata()
    assert "binary_tensor_data" in md["extensions"]


def test_model_metadata_and_config(client: httpclient.InferenceServerClient) -> None:
    md = client.get_model_metadata("add_sub")
    assert md["name"] == "add_sub"
    assert md["versions"] == ["1"]
    assert md["platform"] == "onnxruntime_onnx"
    assert [(t["name"], t["datatype"], t["shape"]) for t in md["inputs"]] == [
        ("INPUT0", "FP32", [-1, 16]),
        ("INPUT1", "FP32", [-1, 16]),
    ]
    cfg = client.get_model_config("add_sub")
    assert cfg["name"] == "add_sub"
    assert cfg["max_batch_size"] == 8
    assert cfg["input"][0]["dims"] == [16]
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")


@pytest.mark.parametrize("binary", [True, False])
def test_add_sub_values(client: httpclient.InferenceServerClient, binary: bool) -> None:
    inputs, a, b = add_sub_inputs(batch=3, binary=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", inputs, outputs=outputs, request_id="req-7")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    resp = result.get_response()
    assert resp["id"] == "req-7"
    assert resp["model_name"] == "add_sub"
    assert resp["model_version"] == "1"


def test_requested_output_subset(client: httpclient.InferenceServerClient) -> None:
    inputs, a, b = add_sub_inputs()
    result = client.infer("add_sub", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("binary", [True, False])
def test_every_datatype_round_trips(client: httpclient.InferenceServerClient, binary: bool) -> None:
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray] = {}
    inputs = []
    for wire in IDENTITY_TYPES:
        if wire == "BYTES":
            arr = np.array([[b"", b"hello", "h\u00e9llo".encode()], [b"x", b"\x00\x01", b"z" * 40]], dtype=np.object_)
        elif wire == "BOOL":
            arr = rng.integers(0, 2, (2, 3)).astype(bool)
        elif wire.startswith("FP"):
            arr = rng.standard_normal((2, 3)).astype({"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[wire])
        else:
            dt = np.dtype(wire.lower())
            info = np.iinfo(dt)
            arr = np.array([[info.min, 0, info.max], [1, 2, 3]], dtype=dt)
        assert np_to_triton_dtype(arr.dtype) == wire
        arrays[wire] = arr
        inp = httpclient.InferInput(f"IN_{wire}", list(arr.shape), wire)
        inp.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(inp)
    outputs = [httpclient.InferRequestedOutput(f"OUT_{w}", binary_data=binary) for w in IDENTITY_TYPES]
    result = client.infer("identity_all", inputs, outputs=outputs)
    for wire, arr in arrays.items():
        got = result.as_numpy(f"OUT_{wire}")
        assert got is not None, wire
        assert got.shape == arr.shape, wire
        if wire == "BYTES":
            assert [as_bytes(x) for x in got.ravel()] == list(arr.ravel())
        else:
            np.testing.assert_array_equal(got, arr, err_msg=wire)


def test_raw_binary_request(server: Server) -> None:
    data = np.arange(5, dtype=np.float32)
    r = httpx.post(
        f"http://{server.http_url}/v2/models/identity_fp32/infer",
        content=data.tobytes(),
        headers={"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 200, r.text
    header_len = int(r.headers["Inference-Header-Content-Length"])
    header = json.loads(r.content[:header_len])
    out = header["outputs"][0]
    assert out["shape"] == [1, 5]
    assert out["parameters"]["binary_data_size"] == 20
    np.testing.assert_array_equal(np.frombuffer(r.content[header_len:], dtype=np.float32), data)


def test_curl_style_json(server: Server) -> None:
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16},
        ],
        "parameters": {"custom": "passed"},
    }
    r = httpx.post(f"http://{server.http_url}/v2/models/add_sub/infer", json=body)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert out["OUTPUT0"]["data"] == [float(i + 1) for i in range(16)]
    assert "parameters" not in out["OUTPUT0"]  # perf_analyzer rejects JSON outputs with parameters


def test_bytes_model_over_json(client: httpclient.InferenceServerClient) -> None:
    arr = np.array([[b"abc", b"de"]], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
    inp.set_data_from_numpy(arr, binary_data=False)
    result = client.infer(
        "identity_bytes", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    )
    assert [as_bytes(x) for x in result.as_numpy("OUTPUT0").ravel()] == [b"abc", b"de"]


def test_generated_config(client: httpclient.InferenceServerClient) -> None:
    cfg = client.get_model_config("generated")
    assert cfg["name"] == "generated"
    assert cfg["platform"] == "onnxruntime_onnx"
    assert cfg["max_batch_size"] == 4
    assert [i["name"] for i in cfg["input"]] and [o["name"] for o in cfg["output"]]
    md = client.get_model_metadata("generated")
    assert all(t["shape"][0] == -1 for t in md["inputs"])


def test_version_policy(client: httpclient.InferenceServerClient) -> None:
    md = client.get_model_metadata("versioned")
    assert md["versions"] == ["2", "3"]
    assert client.is_model_ready("versioned", "3")
    assert not client.is_model_ready("versioned", "1")
    inputs, a, b = add_sub_inputs()
    result = client.infer("versioned", inputs, model_version="2")
    assert result.get_response()["model_version"] == "2"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert client.infer("versioned", inputs).get_response()["model_version"] == "3"
    with pytest.raises(InferenceServerException) as exc:
        client.infer("versioned", inputs, model_version="1")
    assert exc.value.status() == "404"
    assert "version 1 is not found" in exc.value.message()


def test_failed_model_reported_others_serve(server: Server, client: httpclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    broken = [m for m in index if m["name"] == "broken"]
    assert broken and broken[0]["state"] == "UNAVAILABLE"
    assert "max_batch_size" in broken[0]["reason"]
    assert not client.is_model_ready("broken")
    ready = {m["name"] for m in client.get_model_repository_index() if m.get("state") == "READY"}
    assert {"add_sub", "identity_all", "generated", "versioned"} <= ready


def _post(server: Server, path: str, **kw: object) -> httpx.Response:
    return httpx.post(f"http://{server.http_url}{path}", **kw)  # type: ignore[arg-type]


BAD_REQUESTS = [
    # (path, body, status, message fragment)
    ("/v2/models/nope/infer", {"inputs": []}, 404, "Request for unknown model: 'nope' is not found"),
    ("/v2/models/add_sub/versions/9/infer", {"inputs": []}, 404, "version 9 is not found"),
    (
        "/v2/models/add_sub/infer",
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 8], "datatype": "FP32", "data": [0] * 8},
                {"name": "INPUT1", "shape": [1, 8], "datatype": "FP32", "data": [0] * 8},
            ]
        },
        400,
        "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,8]",
    ),
    (
        "/v2/models/add_sub/infer",
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [0] * 16},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [0] * 16},
            ]
        },
        400,
        "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'",
    ),
    (
        "/v2/models/add_sub/infer",
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0] * 16}]},
        400,
        "missing required input(s) ['INPUT1']",
    ),
    (
        "/v2/models/add_sub/infer",
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0] * 16},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [0] * 16},
            ],
            "outputs": [{"name": "OUTPUT9"}],
        },
        400,
        "unexpected inference output 'OUTPUT9' for model 'add_sub'",
    ),
    (
        "/v2/models/add_sub/infer",
        {
            "inputs": [
                {"name": "INPUT0", "shape": [9, 16], "datatype": "FP32", "data": [0] * 144},
                {"name": "INPUT1", "shape": [9, 16], "datatype": "FP32", "data": [0] * 144},
            ]
        },
        400,
        "inference request batch-size must be <= 8 for 'add_sub'",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "message"), BAD_REQUESTS)
def test_bad_requests(server: Server, path: str, body: dict, status: int, message: str) -> None:
    r = _post(server, path, json=body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


@pytest.mark.parametrize(
    ("content", "headers"),
    [
        (b"{not json", {}),
        (b"[1,2]", {}),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "abc"}),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}),
        (
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": "INPUT0",
                            "shape": [1, 16],
                            "datatype": "FP32",
                            "parameters": {"binary_data_size": 64},
                        },
                        {
                            "name": "INPUT1",
                            "shape": [1, 16],
                            "datatype": "FP32",
                            "parameters": {"binary_data_size": 64},
                        },
                    ]
                }
            ).encode()
            + b"\x00" * 60,
            {"Inference-Header-Content-Length": "__LEN__"},
        ),
    ],
)
def test_malformed_bodies_are_400(server: Server, content: bytes, headers: dict[str, str]) -> None:
    if headers.get("Inference-Header-Content-Length") == "__LEN__":
        headers = {"Inference-Header-Content-Length": str(content.index(b"\x00"))}
    r = _post(server, "/v2/models/add_sub/infer", content=content, headers=headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"]


def test_server_healthy_after_bad_input(server: Server, client: httpclient.InferenceServerClient) -> None:
    for _ in range(3):
        _post(server, "/v2/models/add_sub/infer", content=b"\xff\xfe garbage")
    assert client.is_server_ready()
    inputs, a, b = add_sub_inputs()
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + b)


def test_unknown_model_metadata_404(server: Server) -> None:
    r = httpx.get(f"http://{server.http_url}/v2/models/nope")
    assert r.status_code == 404
    assert r.json() == {"error": "Request for unknown model: 'nope' is not found"}
    assert httpx.get(f"http://{server.http_url}/v2/models/nope/ready").status_code == 400


def test_binary_bytes_length_prefix(server: Server) -> None:
    payload = struct.pack("<I", 3) + b"abc"
    header = json.dumps(
        {
            "inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 7}}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    r = _post(
        server,
        "/v2/models/identity_bytes/infer",
        content=header + payload,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 200, r.text
    n = int(r.headers["Inference-Header-Content-Length"])
    assert r.content[n:] == payload
