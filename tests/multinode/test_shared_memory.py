"""System shared memory is a node's: a region registered through one node's gateway serves that node's
clients (HTTP and gRPC), and another node's gateway knows nothing of it, as a server on another machine."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.multinode import clients
from tests.multinode.conftest import MultiNode

A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.float32)
SIZE = A.nbytes


@pytest.fixture
def regions() -> Iterator[tuple[Any, Any, str]]:
    """INPUT0 and INPUT1 back to back in one region, both outputs in another; a tag unique to the test."""
    tag = uuid.uuid4().hex[:8]
    inputs = shm.create_shared_memory_region(f"in_{tag}", f"/serve_app_mn_in_{tag}", 2 * SIZE)
    outputs = shm.create_shared_memory_region(f"out_{tag}", f"/serve_app_mn_out_{tag}", 2 * SIZE)
    shm.set_shared_memory_region(inputs, [A, B])
    yield inputs, outputs, tag
    shm.destroy_shared_memory_region(inputs)
    shm.destroy_shared_memory_region(outputs)


def shm_add_sub(client: Any, tag: str) -> Any:
    module = clients._module(client)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_shared_memory(f"in_{tag}", SIZE)
    inputs[1].set_shared_memory(f"in_{tag}", SIZE, offset=SIZE)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(f"out_{tag}", SIZE)
    outputs[1].set_shared_memory(f"out_{tag}", SIZE, offset=SIZE)
    return client.infer("add_sub", inputs, outputs=outputs, **clients._kwargs(client))


def test_a_region_registered_on_one_node_serves_that_node_only(
    multinode: MultiNode, regions: tuple[Any, Any, str]
) -> None:
    _, outputs, tag = regions
    here, there = multinode.nodes[1], multinode.nodes[2]
    registrar = clients.http(here.address)
    registrar.register_system_shared_memory(f"in_{tag}", f"/serve_app_mn_in_{tag}", 2 * SIZE)
    registrar.register_system_shared_memory(f"out_{tag}", f"/serve_app_mn_out_{tag}", 2 * SIZE)
    try:
        for client in (clients.http(here.address), clients.grpc(here.address)):
            shm.set_shared_memory_region(outputs, [np.zeros((2, 16), np.float32)])
            shm_add_sub(client, tag)
            for offset, expected in ((0, A + B), (SIZE, A - B)):
                got = shm.get_contents_as_numpy(outputs, np.float32, [1, 16], offset=offset)
                np.testing.assert_array_equal(got, expected)
        elsewhere = clients.http(there.address)
        assert f"in_{tag}" not in {r["name"] for r in elsewhere.get_system_shared_memory_status()}
        with pytest.raises(InferenceServerException, match=f"Unable to find shared memory region: 'in_{tag}'"):
            shm_add_sub(elsewhere, tag)
    finally:
        registrar.unregister_system_shared_memory(f"in_{tag}")
        registrar.unregister_system_shared_memory(f"out_{tag}")
