"""System shared memory on the real server with stock tritonclient (http and grpc) and
``tritonclient.utils.shared_memory``, as Triton's own examples use it: regions created and registered by the
client, inputs read from them, outputs written into them.  Off by default (the poll server runs without
``--allow-client-shm``), and shared by the gateways of a node (the secure server runs two)."""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Server
from tests.e2e.test_security import pki, secure_server
from tests.integration.test_security_tls import Pki

__all__ = ["pki", "secure_server"]
A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.float32)
SIZE = A.nbytes


@pytest.fixture
def regions() -> Iterator[tuple[Any, Any, str]]:
    """An input region holding INPUT0 and INPUT1 back to back, an output region for both outputs, and a
    suffix for names and keys unique to the test."""
    tag = uuid.uuid4().hex[:8]
    inputs = shm.create_shared_memory_region(f"in_{tag}", f"/serve_app_e2e_in_{tag}", 2 * SIZE)
    outputs = shm.create_shared_memory_region(f"out_{tag}", f"/serve_app_e2e_out_{tag}", 2 * SIZE)
    shm.set_shared_memory_region(inputs, [A, B])
    yield inputs, outputs, tag
    shm.destroy_shared_memory_region(inputs)
    shm.destroy_shared_memory_region(outputs)


def shm_add_sub(module: Any, client: Any, tag: str) -> Any:
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_shared_memory(f"in_{tag}", SIZE)
    inputs[1].set_shared_memory(f"in_{tag}", SIZE, offset=SIZE)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(f"out_{tag}", SIZE)
    outputs[1].set_shared_memory(f"out_{tag}", SIZE, offset=SIZE)
    return client.infer("add_sub", inputs, outputs=outputs)


def check_outputs(result: Any, outputs: Any) -> None:
    for name, offset, expected in (("OUTPUT0", 0, A + B), ("OUTPUT1", SIZE, A - B)):
        out = result.get_output(name)
        shape = out["shape"] if isinstance(out, dict) else list(out.shape)
        assert shape == [1, 16]
        np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, shape, offset=offset), expected)


def test_http_client_shared_memory(server: Server, regions: tuple[Any, Any, str]) -> None:
    _, outputs, tag = regions
    client = httpclient.InferenceServerClient(server.http_url)
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]
    client.register_system_shared_memory(f"in_{tag}", f"/serve_app_e2e_in_{tag}", 2 * SIZE)
    client.register_system_shared_memory(f"out_{tag}", f"/serve_app_e2e_out_{tag}", 2 * SIZE)
    status = {r["name"]: r for r in client.get_system_shared_memory_status()}
    assert status[f"in_{tag}"] == {
        "name": f"in_{tag}",
        "key": f"/serve_app_e2e_in_{tag}",
        "offset": 0,
        "byte_size": 128,
    }
    result = shm_add_sub(httpclient, client, tag)
    check_outputs(result, outputs)
    assert set(result.get_output("OUTPUT0")) == {"name", "datatype", "shape"}  # the data is in the region
    client.unregister_system_shared_memory(f"in_{tag}")
    with pytest.raises(InferenceServerException, match=f"Unable to find shared memory region: 'in_{tag}'"):
        shm_add_sub(httpclient, client, tag)
    client.unregister_system_shared_memory(f"out_{tag}")
    assert all(r["name"] not in (f"in_{tag}", f"out_{tag}") for r in client.get_system_shared_memory_status())
    assert client.get_cuda_shared_memory_status() == []


def test_grpc_client_shared_memory(server: Server, regions: tuple[Any, Any, str]) -> None:
    _, outputs, tag = regions
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert "system_shared_memory" in client.get_server_metadata().extensions
    client.register_system_shared_memory(f"in_{tag}", f"/serve_app_e2e_in_{tag}", 2 * SIZE)
    client.register_system_shared_memory(f"out_{tag}", f"/serve_app_e2e_out_{tag}", 2 * SIZE)
    status = client.get_system_shared_memory_status(region_name=f"out_{tag}")
    assert status.regions[f"out_{tag}"].byte_size == 2 * SIZE
    check_outputs(shm_add_sub(grpcclient, client, tag), outputs)
    with pytest.raises(InferenceServerException, match=f"shared memory region 'in_{tag}' already in manager"):
        client.register_system_shared_memory(f"in_{tag}", f"/serve_app_e2e_in_{tag}", 2 * SIZE)
    with pytest.raises(InferenceServerException, match="GPUs not supported"):
        client.register_cuda_shared_memory("cuda_region", b"\0" * 64, 0, 8)
    client.unregister_system_shared_memory(f"in_{tag}")
    client.unregister_system_shared_memory(f"out_{tag}")


def test_bytes_tensors_in_shared_memory(server: Server) -> None:
    from tritonclient.utils import serialize_byte_tensor, serialized_byte_size

    tag = uuid.uuid4().hex[:8]
    data = np.array([[b"one", b"", "über".encode()]], dtype=object)
    serialized = serialize_byte_tensor(data)
    size = serialized_byte_size(serialized)
    region = shm.create_shared_memory_region(f"bytes_{tag}", f"/serve_app_e2e_bytes_{tag}", 2 * size)
    try:
        shm.set_shared_memory_region(region, [serialized])
        client = httpclient.InferenceServerClient(server.http_url)
        client.register_system_shared_memory(f"bytes_{tag}", f"/serve_app_e2e_bytes_{tag}", 2 * size)
        inp = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
        inp.set_shared_memory(f"bytes_{tag}", size)
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(f"bytes_{tag}", size, offset=size)
        client.infer("identity_bytes", [inp], outputs=[out])
        got = shm.get_contents_as_numpy(region, np.object_, [1, 3], offset=size)
        assert got.tolist() == data.tolist()
        client.unregister_system_shared_memory(f"bytes_{tag}")
    finally:
        shm.destroy_shared_memory_region(region)


def test_a_key_that_is_a_symbolic_link_is_refused(server: Server, tmp_path: pathlib.Path) -> None:
    """As Triton's shm_open: a link under /dev/shm must not let a client read or write the file it names."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 4096)
    link = pathlib.Path("/dev/shm") / f"serve_app_e2e_link_{uuid.uuid4().hex[:8]}"
    link.symlink_to(secret)
    try:
        with pytest.raises(InferenceServerException, match=f"Unable to open shared memory region: '/{link.name}'"):
            httpclient.InferenceServerClient(server.http_url).register_system_shared_memory("l", f"/{link.name}", 16)
        with pytest.raises(InferenceServerException, match=f"Unable to open shared memory region: '/{link.name}'"):
            grpcclient.InferenceServerClient(server.grpc_url).register_system_shared_memory("l", f"/{link.name}", 16)
    finally:
        link.unlink()
    assert secret.read_bytes() == b"s" * 4096
    status = httpclient.InferenceServerClient(server.http_url).get_system_shared_memory_status()
    assert "l" not in [region["name"] for region in status]


def test_off_unless_allowed(poll_server: Server) -> None:
    """A server started without --allow-client-shm refuses registration, with what to do."""
    client = httpclient.InferenceServerClient(poll_server.http_url)
    assert "system_shared_memory" not in client.get_server_metadata()["extensions"]
    with pytest.raises(InferenceServerException, match="start it with --allow-client-shm") as err:
        client.register_system_shared_memory("r", "/serve_app_e2e_none", 8)
    assert "400" in str(err.value)
    with pytest.raises(InferenceServerException, match="--allow-client-shm"):
        grpcclient.InferenceServerClient(poll_server.grpc_url).register_system_shared_memory(
            "r", "/serve_app_e2e_none", 8
        )
    assert client.get_system_shared_memory_status() == []


def test_gateways_of_a_node_share_registrations(secure_server: Server, pki: Pki, regions: tuple[Any, Any, str]) -> None:
    """Registered through one connection (one gateway); used, listed and unregistered through 12 fresh
    connections each, which SO_REUSEPORT spreads over both gateways."""
    _, outputs, tag = regions

    def fresh() -> httpclient.InferenceServerClient:
        return httpclient.InferenceServerClient(secure_server.http_url, ssl=True, ssl_options={"ca_certs": str(pki.ca)})

    client = fresh()
    client.register_system_shared_memory(f"in_{tag}", f"/serve_app_e2e_in_{tag}", 2 * SIZE)
    client.register_system_shared_memory(f"out_{tag}", f"/serve_app_e2e_out_{tag}", 2 * SIZE)
    for _ in range(12):
        c = fresh()
        assert {r["name"] for r in c.get_system_shared_memory_status()} >= {f"in_{tag}", f"out_{tag}"}
        shm.set_shared_memory_region(outputs, [np.zeros((2, 16), np.float32)])
        check_outputs(shm_add_sub(httpclient, c, tag), outputs)
        c.close()
    fresh().unregister_system_shared_memory()
    for _ in range(12):
        c = fresh()
        assert c.get_system_shared_memory_status() == []
        with pytest.raises(InferenceServerException, match="Unable to find shared memory region"):
            shm_add_sub(httpclient, c, tag)
        c.close()
    client.close()
