"""Stock tritonclient calls the multi-node tests make against one node's gateway."""

from __future__ import annotations

from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.multinode.conftest import GRPC_PORT, HTTP_PORT

TIMEOUT_S = 120.0  # a request that takes longer is a hang (a sequence step may wait 60 s for a slot)


def http(address: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(
        f"{address}:{HTTP_PORT}", connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S
    )


def grpc(address: str) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"{address}:{GRPC_PORT}")


def _module(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def _kwargs(client: Any) -> dict[str, Any]:
    return {} if _module(client) is httpclient else {"client_timeout": TIMEOUT_S}


def add_sub(client: Any, model: str = "add_sub") -> None:
    """One add_sub inference; checks both outputs."""
    module = _module(client)
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model, inputs, **_kwargs(client))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def bls(client: Any, model: str = "py_add_sub") -> None:
    """py_bls runs ``model`` (add_sub's signature, unbatched) from its own instance; checks the outputs."""
    module = _module(client)
    a, b = np.arange(16, dtype=np.float32), np.full(16, 2, dtype=np.float32)
    name = module.InferInput("MODEL_NAME", [1], "BYTES")
    name.set_data_from_numpy(np.array([model.encode()], dtype=np.object_))
    inputs = [name, module.InferInput("INPUT0", [16], "FP32"), module.InferInput("INPUT1", [16], "FP32")]
    inputs[1].set_data_from_numpy(a)
    inputs[2].set_data_from_numpy(b)
    result = client.infer("py_bls", inputs, **_kwargs(client))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def where(client: Any, model: str) -> str:
    """The address of the node whose instance answered."""
    module = _module(client)
    inp = module.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.zeros(1, dtype=np.int32))
    out = client.infer(model, [inp], **_kwargs(client)).as_numpy("NODE")
    value = out.reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def step(client: Any, model: str, value: int, sid: int, *, start: bool = False, end: bool = False) -> tuple[int, int]:
    """One sequence step of an accumulator: (OUTPUT, OUT_CORRID or -1)."""
    module = _module(client)
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.full((1, 1), value, np.int32))
    result = client.infer(model, [inp], sequence_id=sid, sequence_start=start, sequence_end=end, **_kwargs(client))
    corrid = result.as_numpy("OUT_CORRID")
    return int(result.as_numpy("OUTPUT").reshape(-1)[0]), -1 if corrid is None else int(corrid.reshape(-1)[0])
