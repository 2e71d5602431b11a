"""TorchScript models (platform ``pytorch_libtorch``) served by the real server, through stock tritonclient.

The models are built by ``tests/e2e/torchscript_models.py``:

* ``ts_add_sub``: ``OUTPUT__0 = INPUT__0 + INPUT__1``, ``OUTPUT__1 = INPUT__0 - INPUT__1`` (FP32 [16]) under the
  dynamic batcher (preferred batches of 4 and 8, up to 300 ms of queue delay), so concurrent requests share
  executions.
* ``ts_accum``: a running sum with implicit state under the sequence batcher (direct, one instance with 4
  slots); the state (``INPUT_STATE__1`` / ``OUTPUT_STATE__1``) and the START control (``START__2``) reach
  ``forward()`` by their ``__<index>``.

Sequence ids start at 500_000 so that they never meet test_sequence.py's. The whole module skips when the
server's Python has no PyTorch (the same interpreter runs the server, see conftest).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Server

pytest.importorskip("torch")


TIMEOUT_S = 30
ADD_SUB, ACCUM = "ts_add_sub", "ts_accum"

Client = httpclient.InferenceServerClient | grpcclient.InferenceServerClient

_ids = itertools.count(500_000)
_ids_lock = threading.Lock()


def new_id() -> int:
    with _ids_lock:
        return next(_ids)


@pytest.fixture(scope="module")
def http_client(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(
        server.http_url, concurrency=16, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S
    )
    yield c
    c.close()


@pytest.fixture(scope="module")
def grpc_client(server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture(params=["http", "grpc"])
def client(
    request: pytest.FixtureRequest,
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> Client:
    return http_client if request.param == "http" else grpc_client


def module_of(client: Client) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def timeout_kwargs(module: Any) -> dict[str, Any]:
    return {"client_timeout": TIMEOUT_S} if module is grpcclient else {}


def add_sub_inputs(module: Any, a: np.ndarray, b: np.ndarray) -> list[Any]:
    inputs = [
        module.InferInput("INPUT__0", list(a.shape), "FP32"),
        module.InferInput("INPUT__1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def stats(client: httpclient.InferenceServerClient, model: str) -> dict[str, int]:
    s = client.get_inference_statistics(model)["model_stats"][0]
    return {"inference_count": int(s["inference_count"]), "execution_count": int(s["execution_count"])}


# ------------------------------------------------------------------------ add_sub


def test_metadata_and_config(client: Client) -> None:
    assert client.is_model_ready(ADD_SUB)
    if isinstance(client, httpclient.InferenceServerClient):
        meta, config = client.get_model_metadata(ADD_SUB), client.get_model_config(ADD_SUB)
    else:
        meta = client.get_model_metadata(ADD_SUB, as_json=True)
        config = client.get_model_config(ADD_SUB, as_json=True)["config"]
    assert meta["platform"] == "pytorch_libtorch"
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]] == [
        ("INPUT__0", "FP32", [-1, 16]),
        ("INPUT__1", "FP32", [-1, 16]),
    ]
    assert [t["name"] for t in meta["outputs"]] == ["OUTPUT__0", "OUTPUT__1"]
    assert config["backend"] == "pytorch"
    assert config["platform"] == "pytorch_libtorch"


def test_add_sub(client: Client) -> None:
    module = module_of(client)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1, 16)).astype(np.float32)
    b = rng.standard_normal((1, 16)).astype(np.float32)
    r = client.infer(ADD_SUB, add_sub_inputs(module, a, b), **timeout_kwargs(module))
    np.testing.assert_allclose(r.as_numpy("OUTPUT__0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(r.as_numpy("OUTPUT__1"), a - b, rtol=1e-6)

    # one output only, and a request of 3 rows
    a3, b3 = np.arange(48, dtype=np.float32).reshape(3, 16), np.full((3, 16), 2, np.float32)
    r = client.infer(
        ADD_SUB,
        add_sub_inputs(module, a3, b3),
        outputs=[module.InferRequestedOutput("OUTPUT__1")],
        **timeout_kwargs(module),
    )
    assert r.as_numpy("OUTPUT__0") is None
    np.testing.assert_array_equal(r.as_numpy("OUTPUT__1"), a3 - b3)


def test_wrong_input_name_is_rejected(client: Client) -> None:
    module = module_of(client)
    inputs = add_sub_inputs(module, np.zeros((1, 16), np.float32), np.zeros((1, 16), np.float32))
    bad = module.InferInput("INPUT0", [1, 16], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer(ADD_SUB, [inputs[0], bad], **timeout_kwargs(module))
    assert "INPUT0" in info.value.message()


def test_concurrent_requests_are_batched(
    http_client: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """8 HTTP and 8 gRPC requests at once: each gets its own rows back, and the dynamic batcher ran them in
    fewer executions than requests."""
    before = stats(http_client, ADD_SUB)
    b = np.ones((1, 16), np.float32)
    http_futures = [
        http_client.async_infer(ADD_SUB, add_sub_inputs(httpclient, np.full((1, 16), i, np.float32), b))
        for i in range(8)
    ]
    grpc_results: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
    for i in range(8, 16):
        grpc_client.async_infer(
            ADD_SUB,
            add_sub_inputs(grpcclient, np.full((1, 16), i, np.float32), b),
            callback=lambda result, error, i=i: grpc_results.put((i, result, error)),
            client_timeout=TIMEOUT_S,
        )
    for i, f in enumerate(http_futures):
        r = f.get_result()
        np.testing.assert_array_equal(r.as_numpy("OUTPUT__0"), np.full((1, 16), i + 1, np.float32))
        np.testing.assert_array_equal(r.as_numpy("OUTPUT__1"), np.full((1, 16), i - 1, np.float32))
    for _ in range(8):
        i, r, error = grpc_results.get(timeout=TIMEOUT_S)
        assert error is None, error
        np.testing.assert_array_equal(r.as_numpy("OUTPUT__0"), np.full((1, 16), i + 1, np.float32))
        np.testing.assert_array_equal(r.as_numpy("OUTPUT__1"), np.full((1, 16), i - 1, np.float32))

    after = stats(http_client, ADD_SUB)
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 16
    assert 1 <= executions < inferences, (executions, inferences)
    batch_sizes = {
        int(s["batch_size"]) for s in http_client.get_inference_statistics(ADD_SUB)["model_stats"][0]["batch_stats"]
    }
    assert max(batch_sizes) > 1, batch_sizes


# ------------------------------------------------------------------------ accumulator (implicit state)


def accumulate(
    client: Client, value: int, seq_id: int, *, start: bool = False, end: bool = False, state: bool = False
) -> int:
    module = module_of(client)
    inp = module.InferInput("INPUT__0", [1, 1], "INT32")
    inp.set_data_from_numpy(np.full((1, 1), value, np.int32))
    r = client.infer(
        ACCUM,
        [inp],
        sequence_id=seq_id,
        sequence_start=start,
        sequence_end=end,
        **timeout_kwargs(module),
    )
    out = r.as_numpy("OUTPUT__0")
    assert out is not None and out.shape == (1, 1), out
    return int(out[0, 0])


def test_sequences_accumulate_with_implicit_state(client: Client) -> None:
    """Three sequences interleaved request by request (3 <= 4 slots): each sees only its own running sum."""
    seqs = {new_id(): [1, 2, 3, 4], new_id(): [10, -20, 30], new_id(): [100, 1]}
    sums = dict.fromkeys(seqs, 0)
    for step in range(4):
        for seq_id, values in seqs.items():
            if step < len(values):
                sums[seq_id] += values[step]
                last = step == len(values) - 1
                got = accumulate(client, values[step], seq_id, start=step == 0, end=last)
                assert got == sums[seq_id], (seq_id, step)


def test_start_restarts_the_state(client: Client) -> None:
    seq_id = new_id()
    assert accumulate(client, 5, seq_id, start=True) == 5
    assert accumulate(client, 5, seq_id) == 10
    assert accumulate(client, 2, seq_id, start=True) == 2  # START on an active id: from zero
    assert accumulate(client, 1, seq_id, end=True) == 3


def test_stream_of_more_sequences_than_slots(server: Server) -> None:
    """Six sequences of three requests sent at once on one gRPC stream to four slots: two wait in the
    backlog until others END; every response is its sequence's running sum, in order."""
    rng = np.random.default_rng(3)
    seqs = {new_id(): [int(v) for v in rng.integers(-50, 100, size=3)] for _ in range(6)}
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: responses.put((result, error)), stream_timeout=120)
    try:
        for step in range(3):
            for seq_id, values in seqs.items():
                inp = grpcclient.InferInput("INPUT__0", [1, 1], "INT32")
                inp.set_data_from_numpy(np.full((1, 1), values[step], np.int32))
                c.async_stream_infer(
                    ACCUM,
                    [inp],
                    request_id=f"{seq_id}:{step}",
                    sequence_id=seq_id,
                    sequence_start=step == 0,
                    sequence_end=step == 2,
                )
        got: dict[int, list[tuple[int, int]]] = {seq_id: [] for seq_id in seqs}
        deadline = time.monotonic() + 60
        for _ in range(3 * len(seqs)):
            result, error = responses.get(timeout=max(deadline - time.monotonic(), 0.01))
            assert error is None, error
            seq_id, step = (int(x) for x in result.get_response().id.split(":"))
            got[seq_id].append((step, int(result.as_numpy("OUTPUT__0")[0, 0])))
    finally:
        c.stop_stream(cancel_requests=True)
        c.close()
    for seq_id, values in seqs.items():
        assert got[seq_id] == list(enumerate(np.cumsum(values).tolist())), seq_id
