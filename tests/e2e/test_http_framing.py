"""A body the client chunk-encodes itself, as ``requests`` sends it when given bytes and its own
``Transfer-Encoding: chunked`` (it adds a Content-Length too): the server reads it by its chunks, as Triton does."""

from __future__ import annotations

import json

import numpy as np
import requests

from tests.e2e.conftest import Server


def test_requests_with_a_self_chunked_body_gets_its_inference(server: Server) -> None:
    a, b = np.arange(16, dtype=np.float32), np.full(16, 0.5, np.float32)
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": a.tolist()},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": b.tolist()},
            ]
        }
    ).encode()
    encoded = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 64]), body[i : i + 64]) for i in range(0, len(body), 64))
    encoded += b"0\r\n\r\n"
    prepared = requests.Request(
        "POST",
        f"http://{server.http_url}/v2/models/add_sub/infer",
        data=encoded,
        headers={"Transfer-Encoding": "chunked"},
    ).prepare()
    assert prepared.headers["Content-Length"] == str(len(encoded))  # both headers, as the clients concerned send
    with requests.Session() as session:
        r = session.send(prepared, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["connection"] == "close"
    out = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert out["OUTPUT0"] == (a + b).tolist() and out["OUTPUT1"] == (a - b).tolist()
