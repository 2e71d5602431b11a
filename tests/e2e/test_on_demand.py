"""Load on demand and the per-node budget on a server of its own, with stock tritonclient: a cold request
served, concurrent cold requests sharing one load, LRU eviction, what is never evicted (in flight, queued,
live sequences, the operator's models), a load failure answered, a BLS call loading the model it calls, poll
mode, and the setting off changing nothing.

The budget is 3 models; ``pinned`` (``--load-model``) holds one of them, so two models loaded on demand fit.
Models may be evicted as soon as they are loaded (``--on-demand-min-resident-s 0``): the minimum time is
tested on a fake clock in tests/unit/repository/test_residency.py.  Each test starts from nothing loaded on
demand (the repository API unloads what an earlier test left).
"""

from __future__ import annotations

import pathlib
import re
import threading
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from scripts import example_models, python_models
from tests.e2e import cancel_models
from tests.e2e.conftest import Server, start_server, stop_server
from tests.e2e.sequence_models import accumulator

PINNED = "pinned"
COLD = ("m1", "m2", "m3")
GATE = "gate"  # its executions wait until the test creates ``open`` in its directory
SEQ = "seq"
BROKEN = "broken"
BLS, BLS_TARGET = "py_bls", "py_target"  # Triton's bls example, and the model it is told to call
ON_DEMAND = (*COLD, GATE, SEQ, BLS, BLS_TARGET)


def build(repo: pathlib.Path) -> None:
    for name in (PINNED, *COLD):
        example_models.add_sub(repo, name=name)
    cancel_models.build(repo)
    python_models.bls(repo, BLS)
    python_models.add_sub(repo, BLS_TARGET)
    accumulator(repo, SEQ, max_batch_size=1, instances=1, idle_us=120_000_000)
    broken = example_models.add_sub(repo, name=BROKEN)
    (broken / "config.pbtxt").write_text(f'name: "{BROKEN}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: -3\n')


@pytest.fixture(scope="module")
def on_demand(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("on_demand_repo")
    build(repo)
    extra = ["--model-control-mode", "explicit", "--load-model", PINNED, "--load-on-demand",
             "--max-loaded-models-per-node", "3", "--on-demand-min-resident-s", "0"]  # fmt: skip
    server, _ = start_server(tmp_path_factory, repo, extra, "on_demand")
    yield server
    stop_server(server)


@pytest.fixture
def client(on_demand: Server) -> httpclient.InferenceServerClient:
    """The HTTP client, with nothing loaded on demand (the gate closed)."""
    c = httpclient.InferenceServerClient(on_demand.http_url, network_timeout=300.0)
    for name in ON_DEMAND:
        c.unload_model(name)
    (on_demand.repo / GATE / "open").unlink(missing_ok=True)
    return c


def add_sub(client: httpclient.InferenceServerClient, model: str) -> None:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones_like(a))
    np.testing.assert_array_equal(client.infer(model, inputs).as_numpy("OUTPUT0"), a + 1)


def gate_infer(url: str) -> None:
    c = httpclient.InferenceServerClient(url, network_timeout=300.0)
    x = httpclient.InferInput("IN", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    c.infer(GATE, [x])


def seq_infer(client: httpclient.InferenceServerClient, value: int, *, start: bool = False, end: bool = False) -> int:
    x = httpclient.InferInput("INPUT", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[value]], np.int32))
    result = client.infer(SEQ, [x], sequence_id=7, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT").reshape(-1)[0])


def loaded(client: httpclient.InferenceServerClient) -> set[str]:
    return {e["name"] for e in client.get_model_repository_index() if e.get("state") == "READY"}


def figures(server: Server) -> dict[str, float]:
    """The load-on-demand counters, over every model (the histogram's count and sum too)."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(r'^(nv_model_on_demand_\w+?)\{model="[^"]*"\} (\S+)$', text, re.MULTILINE):
        out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


def test_a_cold_request_is_served_and_the_index_shows_it_loaded(client: httpclient.InferenceServerClient) -> None:
    assert loaded(client) == {PINNED}
    add_sub(client, "m1")
    assert loaded(client) == {PINNED, "m1"}


def test_a_cold_request_over_grpc(on_demand: Server, client: httpclient.InferenceServerClient) -> None:
    g = grpcclient.InferenceServerClient(on_demand.grpc_url)
    a = np.zeros((1, 16), np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a + 2)
    assert g.infer("m2", inputs, client_timeout=300.0).as_numpy("OUTPUT0").tolist() == (a + 2).tolist()


def test_concurrent_cold_requests_share_one_load(on_demand: Server, client: httpclient.InferenceServerClient) -> None:
    before = figures(on_demand)
    before.setdefault("nv_model_on_demand_loads_total", 0.0)
    before.setdefault("nv_model_on_demand_waited_requests_total", 0.0)
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def one() -> None:
        try:
            start.wait()
            add_sub(httpclient.InferenceServerClient(on_demand.http_url, network_timeout=300.0), "m3")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    after = figures(on_demand)
    assert after["nv_model_on_demand_loads_total"] - before["nv_model_on_demand_loads_total"] == 1
    waited = after["nv_model_on_demand_waited_requests_total"] - before["nv_model_on_demand_waited_requests_total"]
    assert 1 <= waited <= 8
    assert after["nv_model_on_demand_load_duration_seconds_count"] == after["nv_model_on_demand_loads_total"]


def test_the_least_recently_used_is_evicted_and_the_pinned_model_never(
    on_demand: Server, client: httpclient.InferenceServerClient
) -> None:
    before = figures(on_demand)
    before.setdefault("nv_model_on_demand_evictions_total", 0.0)
    add_sub(client, "m1")
    add_sub(client, "m2")
    add_sub(client, "m1")  # m2 is now the least recently used (pinned is older, but the operator's)
    add_sub(client, "m3")
    assert loaded(client) == {PINNED, "m1", "m3"}
    add_sub(client, "m2")  # m1 now
    assert loaded(client) == {PINNED, "m3", "m2"}
    after = figures(on_demand)
    assert after["nv_model_on_demand_evictions_total"] - before["nv_model_on_demand_evictions_total"] == 2


def test_a_model_the_operator_loaded_is_never_evicted(client: httpclient.InferenceServerClient) -> None:
    add_sub(client, "m3")
    client.load_model("m3")  # loaded on demand first: the operator's now
    add_sub(client, "m1")
    add_sub(client, "m2")  # m3 is the least recently used, but pinned: m1 goes
    assert loaded(client) == {PINNED, "m3", "m2"}


def test_nothing_in_flight_or_queued_is_evicted(on_demand: Server, client: httpclient.InferenceServerClient) -> None:
    gate = on_demand.repo / GATE
    (gate / "open").touch()
    gate_infer(on_demand.http_url)  # loads it
    (gate / "open").unlink()
    add_sub(client, "m1")  # the gate is the least recently used now
    threads = [threading.Thread(target=gate_infer, args=(on_demand.http_url,)) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(1200):  # one request runs (and waits at the gate), the others queue
            if (gate / "running").exists():
                break
            threading.Event().wait(0.1)
        assert (gate / "running").exists()
        add_sub(client, "m2")
        assert loaded(client) == {PINNED, GATE, "m2"}
    finally:
        (gate / "open").touch()
        for t in threads:
            t.join()


def test_a_model_holding_a_live_sequence_is_not_evicted(client: httpclient.InferenceServerClient) -> None:
    assert seq_infer(client, 5, start=True) == 5  # loads it; the sequence stays open
    add_sub(client, "m1")
    add_sub(client, "m2")  # seq is the least recently used, but holds a sequence: m1 goes
    assert loaded(client) == {PINNED, SEQ, "m2"}
    assert seq_infer(client, 2, end=True) == 7


def test_a_load_failure_is_answered_until_the_repository_changes(
    on_demand: Server, client: httpclient.InferenceServerClient
) -> None:
    before = figures(on_demand)
    before.setdefault("nv_model_on_demand_load_failures_total", 0.0)
    messages = []
    for _ in range(2):
        with pytest.raises(InferenceServerException) as info:
            add_sub(client, BROKEN)
        messages.append(str(info.value))
    assert "has no available versions" in messages[0] and BROKEN in messages[0]
    assert messages[0] == messages[1]
    after = figures(on_demand)
    assert after["nv_model_on_demand_load_failures_total"] - before["nv_model_on_demand_load_failures_total"] == 1
    entry = [e for e in client.get_model_repository_index() if e["name"] == BROKEN]
    assert entry and entry[0]["state"] == "UNAVAILABLE"


def test_a_bls_call_loads_the_model_it_calls(client: httpclient.InferenceServerClient) -> None:
    a, b = np.arange(16, dtype=np.float32), np.full(16, 2, dtype=np.float32)
    inputs = [httpclient.InferInput("MODEL_NAME", [1], "BYTES"), httpclient.InferInput("INPUT0", [16], "FP32"),
              httpclient.InferInput("INPUT1", [16], "FP32")]  # fmt: skip
    inputs[0].set_data_from_numpy(np.array([BLS_TARGET.encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(a)
    inputs[2].set_data_from_numpy(b)
    result = client.infer(BLS, inputs)  # loads py_bls, whose call loads py_target
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert loaded(client) == {PINNED, BLS, BLS_TARGET}


def test_a_name_not_in_the_repository_is_unknown(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        add_sub(client, "nope")


@pytest.fixture(scope="module")
def polled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("polled_repo")
    example_models.add_sub(repo, name="m1")
    extra = ["--model-control-mode", "poll", "--repository-poll-secs", "1", "--load-on-demand"]
    server, _ = start_server(tmp_path_factory, repo, extra, "polled_on_demand")
    yield server
    stop_server(server)


def test_poll_mode_starts_with_nothing_and_loads_models_added_later_on_request(polled: Server) -> None:
    c = httpclient.InferenceServerClient(polled.http_url, network_timeout=300.0)
    assert loaded(c) == set()
    add_sub(c, "m1")
    example_models.add_sub(polled.repo, name="m_new")
    add_sub(c, "m_new")
    assert loaded(c) == {"m1", "m_new"}


@pytest.fixture(scope="module")
def without(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("without_repo")
    for name in (PINNED, "m1"):
        example_models.add_sub(repo, name=name)
    extra = ["--model-control-mode", "explicit", "--load-model", PINNED]
    server, _ = start_server(tmp_path_factory, repo, extra, "without_on_demand")
    yield server
    stop_server(server)


def test_with_the_setting_off_a_model_not_loaded_is_refused(without: Server) -> None:
    c = httpclient.InferenceServerClient(without.http_url)
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'm1' is not found"):
        add_sub(c, "m1")
    assert loaded(c) == {PINNED}
    with urllib.request.urlopen(without.metrics_url, timeout=10) as r:
        assert "on_demand" not in r.read().decode()
