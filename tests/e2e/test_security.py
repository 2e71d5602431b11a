"""TLS on both ports and Triton's restricted APIs on the real server (two gateway replicas, which must agree on
what is loaded), with stock tritonclient; with --allow-model-code-upload, a Python model's code sent through the
load API loads and serves (test_repository_errors.py: refused without it)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from scripts import example_models
from scripts.python_models import ADD_SUB_PY
from tests.e2e.conftest import Server, start_server, stop_server
from tests.e2e.test_repository_errors import FAILING_PY, FAILING_PY_CONFIG
from tests.integration.test_security_tls import Pki, _with_cryptography

KEY, SECRET = "admin-key", "s3cret"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    pytest.importorskip("cryptography")
    return _with_cryptography(tmp_path_factory.mktemp("e2e_pki"))


@pytest.fixture(scope="module")
def secure_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("secure_repo")
    example_models.add_sub(repo)
    extra = [
        "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
        "--model-control-mode", "explicit", "--load-model", "*", "--gateway-replicas", "2",
        "--http-restricted-api", f"model-repository:{KEY}={SECRET}",
        "--grpc-restricted-protocol", f"model-repository:{KEY}={SECRET}",
        "--allow-client-shm",  # test_shared_memory.py: regions registered with one gateway serve the other
        "--allow-model-code-upload",  # the repository API is restricted: its clients may load model code
    ]  # fmt: skip
    server, _ = start_server(tmp_path_factory, repo, extra, "secure", ca_file=str(pki.ca))
    yield server
    stop_server(server)


def add_sub(module: object, client: object) -> np.ndarray:
    a = np.ones((1, 16), np.float32)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]  # type: ignore[attr-defined]
    for i in inputs:
        i.set_data_from_numpy(a)
    return client.infer("add_sub", inputs).as_numpy("OUTPUT0")  # type: ignore[attr-defined,no-any-return]


def test_http_over_tls_with_a_restricted_repository_api(secure_server: Server, pki: Pki) -> None:
    client = httpclient.InferenceServerClient(secure_server.http_url, ssl=True, ssl_options={"ca_certs": str(pki.ca)})
    np.testing.assert_array_equal(add_sub(httpclient, client), np.full((1, 16), 2.0, np.float32))
    with pytest.raises(InferenceServerException, match=f"This API is restricted, expecting header '{KEY}'"):
        client.get_model_repository_index()
    index = client.get_model_repository_index(headers={KEY: SECRET})
    assert [m["name"] for m in index] == ["add_sub"]
    client.unload_model("add_sub", headers={KEY: SECRET})
    assert fresh_connections_ready(secure_server, pki) == {400}  # both gateway replicas agree at once
    client.load_model("add_sub", headers={KEY: SECRET})
    assert fresh_connections_ready(secure_server, pki) == {200}


def fresh_connections_ready(server: Server, pki: Pki) -> set[int]:
    """The model's ready status over 20 new connections, which SO_REUSEPORT spreads over the gateways."""
    import ssl

    import httpx

    context = ssl.create_default_context(cafile=str(pki.ca))
    codes = set()
    for _ in range(20):
        with httpx.Client(verify=context, headers={"Connection": "close"}) as c:
            codes.add(c.get(f"https://{server.http_url}/v2/models/add_sub/ready").status_code)
    return codes


def test_grpc_over_tls_with_a_restricted_repository_api(secure_server: Server, pki: Pki) -> None:
    client = grpcclient.InferenceServerClient(secure_server.grpc_url, ssl=True, root_certificates=str(pki.ca))
    np.testing.assert_array_equal(add_sub(grpcclient, client), np.full((1, 16), 2.0, np.float32))
    with pytest.raises(InferenceServerException) as refused:
        client.get_model_repository_index()
    assert refused.value.status() == str(grpc.StatusCode.UNAVAILABLE)
    assert f"expecting header 'triton-grpc-protocol-{KEY}'" in refused.value.message()
    index = client.get_model_repository_index(headers={f"triton-grpc-protocol-{KEY}": SECRET})
    assert [m.name for m in index.models] == ["add_sub"]
    plain = grpcclient.InferenceServerClient(secure_server.grpc_url)
    with pytest.raises(InferenceServerException):
        plain.is_server_live()


def test_model_code_uploads_load_with_the_flag(secure_server: Server, pki: Pki) -> None:
    client = httpclient.InferenceServerClient(secure_server.http_url, ssl=True, ssl_options={"ca_certs": str(pki.ca)})
    headers = {KEY: SECRET}
    io = [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("INPUT0", "INPUT1")]
    config = {"name": "uploaded_py", "backend": "python", "input": io}
    config["output"] = [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")]
    files = {"file:1/model.py": ADD_SUB_PY.encode()}
    client.load_model("uploaded_py", config=json.dumps(config), files=files, headers=headers)
    try:
        a = np.ones(16, np.float32)
        inputs = [httpclient.InferInput("INPUT0", [16], "FP32"), httpclient.InferInput("INPUT1", [16], "FP32")]
        for i in inputs:
            i.set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("uploaded_py", inputs).as_numpy("OUTPUT0"), a + a)
    finally:
        client.unload_model("uploaded_py", headers=headers)
    failing = json.dumps({"name": "failing_py", **FAILING_PY_CONFIG})
    with pytest.raises(InferenceServerException, match="RuntimeError: this model cannot start"):
        client.load_model("failing_py", config=failing, files={"file:1/model.py": FAILING_PY.encode()}, headers=headers)
