"""Triton's sequence batcher against the real server, through stock tritonclient only.

The models are built by ``tests/e2e/sequence_models.py`` (see the table there):

* ``seq_accum`` / ``seq_accum_file`` / ``seq_idle`` / ``seq_kill`` / ``seq_survive``: accumulators with
  implicit state (``seq_kill`` without state backup, ``seq_survive`` with it),
  ``OUTPUT = OUTPUT_STATE = INPUT_STATE + INPUT``, so every response must be the running sum of its
  sequence's inputs (plus 100 for ``seq_accum_file``, whose initial state comes from a data file).
* ``seq_ctl`` / ``seq_ctl32``: echo INPUT and the START/END/READY/CORRID control tensors.
* ``seq_oldest``: the accumulator under the oldest strategy, with a CORRID echo.
* ``seq_old_idle``: the accumulator under the oldest strategy with one place in all and a 2 s idle timeout.
* ``seq_text``: a TYPE_STRING implicit state (StringConcat), initial state from a data file.
* ``seq_ensemble``: an ensemble whose one step is ``seq_accum``.

Slots (direct strategy: max_batch_size slots per instance): seq_accum 8, seq_accum_file 4, seq_ctl 4,
seq_ctl32 2, seq_idle 1, seq_kill 4, seq_survive 4, seq_text 2; seq_oldest has 8 candidate places and
seq_old_idle 1. A sequence holds its slot until END (or its idle timeout), so unary tests never interleave
more sequences than there are slots
(they would wait for a slot that only their own later requests could free), and every test ENDs its
sequences. Streaming tests send every request up front and may exceed the slots: the server must
then hold the extra sequences in its backlog and serve them as others END, which requires it to
process the requests of one stream concurrently.

Sequence ids come from one counter, so no two tests share a sequence. Every client call has a
timeout, so a server that never answers fails a test instead of hanging it. Test order matters only
for the replica-kill tests, which are last in this file (and this file sorts last in tests/e2e).
"""

from __future__ import annotations

import itertools
import os
import queue
import signal
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Server
from tests.e2e.sequence_models import FILE_INITIAL_STATE
from tests.support import faults as fault_injection

TIMEOUT_S = 30  # every unary client call
STREAM_TIMEOUT_S = 120  # the whole life of one gRPC stream (gRPC deadline)
COLLECT_TIMEOUT_S = 60  # waiting for all the responses a stream test expects

# Triton's messages (substrings), identical over HTTP and gRPC.
NO_ID = "must specify a non-zero or non-empty correlation ID"
NO_START = "must specify the START flag on the first request of the sequence"
BATCH_ONE = "must specify batch-size 1 due to requirements of sequence batcher"
LOST = "was lost"

INVALID = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
UNAVAILABLE = {"http": "503", "grpc": "StatusCode.UNAVAILABLE"}

SeqId = int | str
Client = httpclient.InferenceServerClient | grpcclient.InferenceServerClient

_ids = itertools.count(1_000)
_ids_lock = threading.Lock()


def new_id() -> int:
    with _ids_lock:
        return next(_ids)


# ------------------------------------------------------------------------ clients and helpers


@pytest.fixture(scope="module")
def http_client(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.http_url, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S)
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


def protocol(client: Client) -> str:
    return "http" if isinstance(client, httpclient.InferenceServerClient) else "grpc"


def value_inputs(module: Any, value: int, *, batch: int | None = 1) -> list[Any]:
    """INPUT (INT32) holding ``value``: shape [batch, 1], or [1] for a model without batching (batch=None)."""
    shape = [1] if batch is None else [batch, 1]
    inp = module.InferInput("INPUT", shape, "INT32")
    inp.set_data_from_numpy(np.full(shape, value, np.int32))
    return [inp]


def infer(
    client: Client,
    model: str,
    value: int,
    seq_id: SeqId,
    *,
    start: bool = False,
    end: bool = False,
    outputs: Sequence[str] = (),
    batch: int | None = 1,
) -> Any:
    """One unary request of a sequence (``seq_id`` 0 or "" sends no sequence parameters at all)."""
    module = httpclient if protocol(client) == "http" else grpcclient
    kwargs: dict[str, Any] = {} if module is httpclient else {"client_timeout": TIMEOUT_S}
    requested = [module.InferRequestedOutput(n) for n in outputs] or None
    return client.infer(
        model,
        value_inputs(module, value, batch=batch),
        outputs=requested,
        sequence_id=seq_id,
        sequence_start=start,
        sequence_end=end,
        **kwargs,
    )


def scalar(result: Any, name: str = "OUTPUT") -> int:
    array = result.as_numpy(name)
    assert array is not None, f"no {name} in the response"
    assert array.size == 1, f"{name} has shape {array.shape}"
    return int(array.reshape(-1)[0])


def check_error(info: pytest.ExceptionInfo[InferenceServerException], status: str, fragment: str) -> None:
    assert info.value.status() == status, (info.value.status(), info.value.message())
    assert fragment in info.value.message(), info.value.message()


def int32_of(seq_id: int) -> int:
    """What a TYPE_INT32 CORRID control carries: the low 32 bits, read as int32."""
    return int(np.array([seq_id & 0xFFFF_FFFF], np.uint32).view(np.int32)[0])


def stats(client: Client, model: str) -> dict[str, int]:
    """inference/execution/success counts of a model's only version, over either protocol (gRPC's JSON
    carries 64-bit integers as strings)."""
    if protocol(client) == "http":
        s = client.get_inference_statistics(model)["model_stats"][0]
    else:
        s = client.get_inference_statistics(model, as_json=True, client_timeout=TIMEOUT_S)["model_stats"][0]
    return {
        "inference_count": int(s.get("inference_count", 0)),
        "execution_count": int(s.get("execution_count", 0)),
        "success": int(s["inference_stats"].get("success", {}).get("count", 0)),
    }


# ------------------------------------------------------------------------ gRPC streams


Response = tuple[Any, InferenceServerException | None]  # (InferResult or None, in-band error or None)


class Stream:
    """One bidirectional ModelStreamInfer stream, on its own client (tritonclient allows one per client)."""

    def __init__(self, server: Server) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.responses: queue.Queue[Response] = queue.Queue()

    def __enter__(self) -> Stream:
        self.client.start_stream(
            callback=lambda result, error: self.responses.put((result, error)), stream_timeout=STREAM_TIMEOUT_S
        )
        return self

    def __exit__(self, *exc: object) -> None:
        # cancel whatever is still pending, so that a failing test never blocks here
        self.client.stop_stream(cancel_requests=True)
        self.client.close()

    def send(
        self,
        model: str,
        value: int,
        *,
        request_id: str,
        seq_id: SeqId = 0,
        start: bool = False,
        end: bool = False,
        batch: int = 1,
    ) -> None:
        self.client.async_stream_infer(
            model,
            value_inputs(grpcclient, value, batch=batch),
            request_id=request_id,
            sequence_id=seq_id,
            sequence_start=start,
            sequence_end=end,
        )

    def collect(self, count: int) -> list[Response]:
        """The next ``count`` responses, in arrival order."""
        deadline = time.monotonic() + COLLECT_TIMEOUT_S
        got: list[Response] = []
        while len(got) < count:
            try:
                got.append(self.responses.get(timeout=max(deadline - time.monotonic(), 0.01)))
            except queue.Empty:
                seen = [r.get_response().id if r is not None else f"error: {e}" for r, e in got]
                raise AssertionError(
                    f"only {len(got)} of {count} stream responses within {COLLECT_TIMEOUT_S} s: {seen}"
                ) from None
        return got


@dataclass(frozen=True)
class Seq:
    seq_id: SeqId
    values: list[int]

    def sums(self) -> list[int]:
        return [int(x) for x in np.cumsum(self.values)]


def run_on_stream(server: Server, model: str, seqs: Sequence[Seq]) -> dict[tuple[int, int], Any]:
    """Sends every request of every sequence on one stream at once, step-major (all first steps, then
    all second steps, ...), without waiting for any response; returns the results by (sequence index,
    step). Asserts that nothing failed and that each sequence's responses arrived in order.

    Nothing here waits on the server between sends, so the test cannot deadlock when there are more
    sequences than slots: the active sequences' END requests are already on the wire, and the
    backlogged sequences get slots as those end.
    """
    total = 0
    with Stream(server) as stream:
        for step in range(max(len(s.values) for s in seqs)):
            for k, s in enumerate(seqs):
                if step < len(s.values):
                    last = step == len(s.values) - 1
                    stream.send(
                        model, s.values[step], request_id=f"{k}:{step}", seq_id=s.seq_id, start=step == 0, end=last
                    )
                    total += 1
        got = stream.collect(total)
    errors = [e.message() for _, e in got if e is not None]
    assert not errors, errors
    results: dict[tuple[int, int], Any] = {}
    arrival: dict[int, list[int]] = defaultdict(list)
    for result, _ in got:
        k, step = (int(x) for x in result.get_response().id.split(":"))
        assert (k, step) not in results, f"two responses for {k}:{step}"
        results[(k, step)] = result
        arrival[k].append(step)
    for k, s in enumerate(seqs):
        assert arrival[k] == list(range(len(s.values))), f"sequence {k} ({s.seq_id}) answered in order {arrival[k]}"
    return results


def random_values(rng: np.random.Generator, n: int) -> list[int]:
    return [int(v) for v in rng.integers(-50, 100, size=n)]


# ------------------------------------------------------------------------ unary: implicit state


def test_interleaved_sequences_accumulate(client: Client) -> None:
    """Four sequences (two integer ids, two string ids) of different lengths, interleaved one request at a
    time: each response is the running sum of its own sequence only (4 sequences <= seq_accum's 8 slots)."""
    n = new_id()
    seqs = [
        Seq(new_id(), [1, 2, 3]),
        Seq(f"seq-a-{n}", [10, 20, 30, 40]),
        Seq(new_id(), [-5, 7, 100, 1, 2]),
        Seq(f"seq-b-{n}", [1000, 1]),
    ]
    for step in range(max(len(s.values) for s in seqs)):
        for s in seqs:
            if step < len(s.values):
                last = step == len(s.values) - 1
                r = infer(client, "seq_accum", s.values[step], s.seq_id, start=step == 0, end=last)
                assert scalar(r) == s.sums()[step], (s.seq_id, step)


def test_output_state_can_be_requested(client: Client) -> None:
    """OUTPUT_STATE is also listed in the config's outputs, so a client may ask for it like any output."""
    sid = new_id()
    r = infer(client, "seq_accum", 5, sid, start=True, outputs=["OUTPUT", "OUTPUT_STATE"])
    assert (scalar(r, "OUTPUT"), scalar(r, "OUTPUT_STATE")) == (5, 5)
    r = infer(client, "seq_accum", 7, sid, outputs=["OUTPUT_STATE"])
    assert scalar(r, "OUTPUT_STATE") == 12
    assert r.as_numpy("OUTPUT") is None  # only what was requested
    r = infer(client, "seq_accum", 1, sid, end=True, outputs=["OUTPUT"])
    assert scalar(r, "OUTPUT") == 13


def test_initial_state_from_data_file(client: Client) -> None:
    """seq_accum_file starts every sequence from <model>/initial_state/initial_state_data (int32 100)."""
    a, b = new_id(), f"file-{new_id()}"
    assert scalar(infer(client, "seq_accum_file", 1, a, start=True)) == FILE_INITIAL_STATE + 1
    assert scalar(infer(client, "seq_accum_file", 2, b, start=True)) == FILE_INITIAL_STATE + 2
    assert scalar(infer(client, "seq_accum_file", 3, a, end=True)) == FILE_INITIAL_STATE + 4
    assert scalar(infer(client, "seq_accum_file", 4, b)) == FILE_INITIAL_STATE + 6
    assert scalar(infer(client, "seq_accum_file", 5, b, end=True)) == FILE_INITIAL_STATE + 11
    # a new sequence starts from the file's value again, not from anything a previous one left
    c = new_id()
    assert scalar(infer(client, "seq_accum_file", 0, c, start=True, end=True)) == FILE_INITIAL_STATE


def test_start_mid_sequence_restarts_with_fresh_state(client: Client) -> None:
    """A START for an active sequence id restarts it: the state goes back to the initial (zero) state."""
    sid = new_id()
    assert scalar(infer(client, "seq_accum", 5, sid, start=True)) == 5
    assert scalar(infer(client, "seq_accum", 3, sid)) == 8
    assert scalar(infer(client, "seq_accum", 2, sid, start=True)) == 2
    assert scalar(infer(client, "seq_accum", 4, sid)) == 6
    assert scalar(infer(client, "seq_accum", 1, sid, end=True)) == 7


# ------------------------------------------------------------------------ unary: controls


def test_int32_corrid_carries_the_low_32_bits(client: Client) -> None:
    """seq_ctl32 declares CONTROL_SEQUENCE_CORRID as TYPE_INT32: an id above 2**32 reaches the model as its low
    32 bits read as int32 (so 2**33 + 2**31 + 5 arrives negative)."""
    for sid in (12_345, 2**32 + 7, 2**33 + 2**31 + 5):
        r = infer(client, "seq_ctl32", 3, sid, start=True, end=True)  # a one-request sequence
        assert r.as_numpy("OUT_CORRID").dtype == np.int32
        assert scalar(r, "OUT_CORRID") == int32_of(sid), sid
        assert [scalar(r, n) for n in ("OUTPUT", "OUT_START", "OUT_END", "OUT_READY")] == [3, 1, 1, 1]
    assert int32_of(2**33 + 2**31 + 5) == -(2**31) + 5
    # two requests: START only on the first, END only on the last
    sid = 5 * 2**32 + 99
    first = infer(client, "seq_ctl32", 1, sid, start=True)
    last = infer(client, "seq_ctl32", 2, sid, end=True)
    assert [scalar(first, n) for n in ("OUTPUT", "OUT_START", "OUT_END", "OUT_READY", "OUT_CORRID")] == [1, 1, 0, 1, 99]
    assert [scalar(last, n) for n in ("OUTPUT", "OUT_START", "OUT_END", "OUT_READY", "OUT_CORRID")] == [2, 0, 1, 1, 99]


# ------------------------------------------------------------------------ errors


def test_sequence_errors(client: Client) -> None:
    """Missing id, missing START, batch size 2: 400 / INVALID_ARGUMENT with Triton's messages; none of them
    disturbs the sequences that follow."""
    invalid = INVALID[protocol(client)]
    with pytest.raises(InferenceServerException) as info:
        infer(client, "seq_accum", 1, 0, start=True, end=True)  # tritonclient sends no sequence parameters
    check_error(info, invalid, NO_ID)
    for unknown in (new_id(), f"never-started-{new_id()}"):
        with pytest.raises(InferenceServerException) as info:
            infer(client, "seq_accum", 1, unknown)
        check_error(info, invalid, NO_START)
    with pytest.raises(InferenceServerException) as info:
        infer(client, "seq_accum", 1, new_id(), start=True, end=True, batch=2)
    check_error(info, invalid, BATCH_ONE)

    # once a sequence has ENDed its id is unknown again: a request without START is refused ...
    sid = new_id()
    assert scalar(infer(client, "seq_accum", 4, sid, start=True, end=True)) == 4
    with pytest.raises(InferenceServerException) as info:
        infer(client, "seq_accum", 1, sid)
    check_error(info, invalid, NO_START)
    # ... and a START begins it afresh
    assert scalar(infer(client, "seq_accum", 6, sid, start=True)) == 6
    assert scalar(infer(client, "seq_accum", 1, sid, end=True)) == 7


@pytest.mark.parametrize("seq_id", [0, ""], ids=["zero", "empty"])
def test_zero_or_empty_id_on_the_wire_http(server: Server, seq_id: int | str) -> None:
    """An explicit ``sequence_id`` of 0 or "" (tritonclient would leave the parameter out) is refused."""
    body = {
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
        "parameters": {"sequence_id": seq_id, "sequence_start": True, "sequence_end": True},
    }
    r = httpx.post(f"http://{server.http_url}/v2/models/seq_accum/infer", json=body, timeout=TIMEOUT_S)
    assert r.status_code == 400
    assert NO_ID in r.json()["error"]


@pytest.mark.parametrize("seq_id", [0, ""], ids=["zero", "empty"])
def test_zero_or_empty_id_on_the_wire_grpc(server: Server, seq_id: int | str) -> None:
    req = service_pb2.ModelInferRequest(model_name="seq_accum")
    req.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
    req.raw_input_contents.append(np.array([1], "<i4").tobytes())
    if isinstance(seq_id, str):
        req.parameters["sequence_id"].string_param = seq_id
    else:
        req.parameters["sequence_id"].int64_param = seq_id
    req.parameters["sequence_start"].bool_param = True
    req.parameters["sequence_end"].bool_param = True
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(req, timeout=TIMEOUT_S)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert NO_ID in info.value.details()


# ------------------------------------------------------------------------ gRPC streaming


def test_stream_more_sequences_than_slots_control_echo(server: Server) -> None:
    """Ten sequences of 5-8 requests on one stream, all sent at once, on seq_ctl's 4 slots: six sequences wait
    in the backlog until others END. Every response echoes its own INPUT, START only on the first request,
    END only on the last, READY 1, and the full 64-bit CORRID (ids above 2**32: no truncation)."""
    seqs = [Seq(2**40 + new_id(), [1000 * k + step for step in range(5 + k % 4)]) for k in range(10)]
    results = run_on_stream(server, "seq_ctl", seqs)
    assert len(results) == sum(len(s.values) for s in seqs)
    for (k, step), r in results.items():
        s = seqs[k]
        last = len(s.values) - 1
        got = {n: scalar(r, n) for n in ("OUTPUT", "OUT_START", "OUT_END", "OUT_READY", "OUT_CORRID")}
        want = {
            "OUTPUT": s.values[step],
            "OUT_START": int(step == 0),
            "OUT_END": int(step == last),
            "OUT_READY": 1,
            "OUT_CORRID": s.seq_id,
        }
        assert got == want, (k, step)
        assert r.as_numpy("OUT_CORRID").dtype == np.uint64


def test_stream_more_sequences_than_slots_accumulate(server: Server) -> None:
    """Twelve sequences (integer and string ids) on seq_accum's 8 slots, all sent at once: exact running sums."""
    rng = np.random.default_rng(4)
    seqs = [Seq(new_id() if k % 2 == 0 else f"stream-{k}-{new_id()}", random_values(rng, 3 + k % 4)) for k in range(12)]
    results = run_on_stream(server, "seq_accum", seqs)
    for (k, step), r in results.items():
        assert scalar(r) == seqs[k].sums()[step], (k, step)


def test_stream_oldest_strategy(server: Server) -> None:
    """Twelve sequences on seq_oldest (2 instances x 4 candidate sequences): a batch takes at most one request
    of each sequence, oldest first; sums and CORRID echoes must come back exact."""
    rng = np.random.default_rng(5)
    seqs = [Seq(2**40 + new_id(), random_values(rng, 4 + k % 4)) for k in range(12)]
    results = run_on_stream(server, "seq_oldest", seqs)
    for (k, step), r in results.items():
        assert scalar(r) == seqs[k].sums()[step], (k, step)
        assert scalar(r, "OUT_CORRID") == seqs[k].seq_id


def test_stream_inband_errors_keep_the_stream_open(server: Server) -> None:
    """Bad requests on a stream get an in-band error each (the stream is not closed); the valid sequence
    around them, and a later one, are served with correct sums. In-band errors carry no request id, so
    they are told apart by their messages."""
    a = f"stream-good-{new_id()}"
    with Stream(server) as stream:
        stream.send("seq_accum", 1, request_id="a0", seq_id=a, start=True)
        stream.send("seq_accum", 50, request_id="no-id")  # no sequence_id at all
        stream.send("seq_accum", 60, request_id="no-start", seq_id=new_id())  # unknown sequence, no START
        stream.send("seq_accum", 70, request_id="batch-2", seq_id=new_id(), start=True, end=True, batch=2)
        stream.send("seq_accum", 2, request_id="a1", seq_id=a)
        stream.send("seq_accum", 3, request_id="a2", seq_id=a, end=True)
        got = stream.collect(6)
        errors = [e.message() for _, e in got if e is not None]
        results = {r.get_response().id: scalar(r) for r, e in got if e is None}
        assert results == {"a0": 1, "a1": 3, "a2": 6}
        assert len(errors) == 3, errors
        for fragment in (NO_ID, NO_START, BATCH_ONE):
            assert sum(fragment in e for e in errors) == 1, (fragment, errors)

        # after the errors have been delivered, the same stream still serves
        b = new_id()
        stream.send("seq_accum", 9, request_id="b0", seq_id=b, start=True)
        stream.send("seq_accum", 1, request_id="b1", seq_id=b, end=True)
        later = stream.collect(2)
    assert [e for _, e in later] == [None, None], [str(e) for _, e in later]
    assert [(r.get_response().id, scalar(r)) for r, _ in later] == [("b0", 9), ("b1", 10)]


# ------------------------------------------------------------------------ idle timeout and backlog


def test_idle_sequence_is_dropped_and_its_slot_given_to_the_backlog(
    http_client: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """seq_idle has one slot in all and drops a sequence idle for 1 s. Sequence A takes the slot and goes
    quiet; B's START (from a thread) is held in the backlog, not refused, and is served once A idles
    out (about 1 s later). A is then unknown: its next request without START is refused."""
    a, b = new_id(), new_id()
    assert scalar(infer(grpc_client, "seq_idle", 1, a, start=True, batch=None)) == 1
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(infer, grpc_client, "seq_idle", 10, b, start=True, batch=None)
        first_of_b = waiting.result(timeout=TIMEOUT_S)  # held until A's idle timeout frees the slot
    assert scalar(first_of_b) == 10  # B starts from zero, not from A's state
    assert scalar(infer(grpc_client, "seq_idle", 5, b, end=True, batch=None)) == 15

    with pytest.raises(InferenceServerException) as info:
        infer(http_client, "seq_idle", 2, a, batch=None)
    check_error(info, INVALID["http"], NO_START)
    with pytest.raises(InferenceServerException) as info:  # refusing it did not revive it
        infer(grpc_client, "seq_idle", 2, a, batch=None)
    check_error(info, INVALID["grpc"], NO_START)
    # the id may START again, with fresh state
    assert scalar(infer(grpc_client, "seq_idle", 3, a, start=True, end=True, batch=None)) == 3


def test_oldest_idle_sequence_is_released_and_the_backlog_moves_on(
    http_client: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """seq_old_idle (oldest strategy, one candidate place in all) drops a sequence idle for 2 s, as Triton's
    reaper does. A takes the place and goes quiet; B's START waits in the backlog and is served once A is
    released; A's late request (no START) is refused with Triton's message instead of continuing A."""
    a, b = new_id(), new_id()
    assert scalar(infer(grpc_client, "seq_old_idle", 1, a, start=True)) == 1
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(infer, grpc_client, "seq_old_idle", 10, b, start=True)
        first_of_b = waiting.result(timeout=TIMEOUT_S)  # held until A is released
    assert scalar(first_of_b) == 10
    for client in (http_client, grpc_client):
        with pytest.raises(InferenceServerException) as info:
            infer(client, "seq_old_idle", 2, a)
        check_error(info, INVALID[protocol(client)], f"inference request for sequence {a} to model 'seq_old_idle' "
                    + NO_START)  # fmt: skip
    assert scalar(infer(grpc_client, "seq_old_idle", 5, b, end=True)) == 15


@pytest.mark.parametrize(
    ("proto", "model", "batch"), [("http", "seq_old_idle", 1), ("grpc", "seq_old_idle", 1), ("grpc", "seq_idle", None)]
)
def test_backlogged_sequence_times_out_with_its_request_timeout(
    proto: str,
    model: str,
    batch: int | None,
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    """A holds the only place of seq_old_idle (oldest) or seq_idle (direct); B's START carries a 0.1 s
    ``timeout``: it leaves the backlog failing with Triton's UNAVAILABLE message, B is forgotten (its next
    request needs a START), and A goes on."""
    client = http_client if proto == "http" else grpc_client
    module = httpclient if proto == "http" else grpcclient
    a, b = new_id(), new_id()
    assert scalar(infer(grpc_client, model, 1, a, start=True, batch=batch)) == 1
    kwargs: dict[str, Any] = {} if proto == "http" else {"client_timeout": TIMEOUT_S}
    with pytest.raises(InferenceServerException) as info:
        client.infer(
            model, value_inputs(module, 4, batch=batch), sequence_id=b, sequence_start=True, timeout=100_000, **kwargs
        )
    check_error(info, UNAVAILABLE[proto], "timeout of the corresponding sequence has been expired")
    with pytest.raises(InferenceServerException) as info:
        infer(client, model, 4, b, batch=batch)
    check_error(info, INVALID[proto], NO_START)
    assert scalar(infer(client, model, 2, a, end=True, batch=batch)) == 3


def test_backlog_timeout_of_a_step_held_behind_its_start_on_a_stream(
    server: Server, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """On one stream: B's START (no timeout) waits in seq_old_idle's backlog, behind A; B's next request carries
    a 0.1 s ``timeout``, which ends the wait of the whole sequence, as in Triton's backlog: both fail in-band.
    A holds the one slot only until its 2 s idle timeout: where B's requests came later than that (a slow
    machine), B took the freed slot and A's END finds no sequence; the scene is then played again."""
    for _ in range(3):
        a, b = new_id(), new_id()
        assert scalar(infer(grpc_client, "seq_old_idle", 1, a, start=True)) == 1
        with Stream(server) as stream:
            stream.client.async_stream_infer(
                "seq_old_idle", value_inputs(grpcclient, 5), request_id="b0", sequence_id=b, sequence_start=True
            )
            stream.client.async_stream_infer(
                "seq_old_idle", value_inputs(grpcclient, 6), request_id="b1", sequence_id=b, timeout=100_000
            )
            got = stream.collect(2)
        errors = [e.message() if e is not None else None for _, e in got]
        try:
            a_end = scalar(infer(grpc_client, "seq_old_idle", 2, a, end=True))
        except InferenceServerException:
            continue  # A's idle timeout ran out before B's requests arrived (B now idles out of the slot)
        assert a_end == 3
        timed_out = "timeout of the corresponding sequence has been expired"
        assert all(e is not None and timed_out in e for e in errors), errors
        return
    pytest.fail("A's sequence idled out before B's requests arrived, three times: the backlog was never seen")


# ------------------------------------------------------------------------ string implicit state


def text_inputs(module: Any, text: str) -> list[Any]:
    inp = module.InferInput("INPUT", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
    return [inp]


def infer_text(client: Client, text: str, seq_id: SeqId, *, start: bool = False, end: bool = False) -> str:
    module = httpclient if protocol(client) == "http" else grpcclient
    kwargs: dict[str, Any] = {} if module is httpclient else {"client_timeout": TIMEOUT_S}
    result = client.infer(
        "seq_text", text_inputs(module, text), sequence_id=seq_id, sequence_start=start, sequence_end=end, **kwargs
    )
    out = result.as_numpy("OUTPUT")
    assert out is not None and out.shape == (1, 1)
    return bytes(out[0, 0]).decode()


def test_string_implicit_state(client: Client) -> None:
    """seq_text keeps a TYPE_STRING state (ONNX StringConcat) starting from its data_file ("<"): each response
    is the prefix plus every input of its sequence so far; two interleaved sequences keep their own."""
    a, b = new_id(), new_id()
    assert infer_text(client, "ab", a, start=True) == "<ab"
    assert infer_text(client, "x", b, start=True) == "<x"
    assert infer_text(client, "cd", a) == "<abcd"
    assert infer_text(client, "ü", b, end=True) == "<xü"
    assert infer_text(client, "e", a, end=True) == "<abcde"


# ------------------------------------------------------------------------ sequences through an ensemble


def test_ensemble_passes_sequence_flags_and_answers_with_them(
    http_client: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """seq_ensemble's one step is seq_accum: the flags of a request to the ensemble reach it (the sums run on),
    and each response carries sequence_id, sequence_start and sequence_end, as Triton's ensemble responses do."""
    seq = new_id()
    steps = [(3, True, False, http_client), (4, False, False, grpc_client), (5, False, True, http_client)]
    sums = []
    for value, start, end, client in steps:
        result = infer(client, "seq_ensemble", value, seq, start=start, end=end)
        sums.append(scalar(result))
        if protocol(client) == "http":
            params = result.get_response()["parameters"]
        else:
            params = {
                k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in result.get_response().parameters.items()
            }
        assert params == {"sequence_id": seq, "sequence_start": start, "sequence_end": end}
    assert sums == [3, 7, 12]
    with pytest.raises(InferenceServerException) as info:
        infer(grpc_client, "seq_ensemble", 1, seq)  # ended: the step needs a START, Triton's message
    check_error(info, INVALID["grpc"], "in ensemble 'seq_ensemble', inference request for sequence")


def test_ensemble_stream_responses_carry_the_sequence_parameters(server: Server) -> None:
    """Two sequences interleaved on one ModelStreamInfer stream to seq_ensemble: every streamed response
    carries its own request's sequence parameters."""
    a, b = new_id(), str(new_id())
    sent = [(a, 1, True, False), (b, 2, True, False), (a, 3, False, True), (b, 4, False, True)]
    with Stream(server) as stream:
        for i, (seq, value, start, end) in enumerate(sent):
            stream.send("seq_ensemble", value, request_id=str(i), seq_id=seq, start=start, end=end)
        got = stream.collect(len(sent))
    assert [e for _, e in got] == [None] * len(sent), [str(e) for _, e in got]
    for result, _ in got:
        response = result.get_response()
        seq, _, start, end = sent[int(response.id)]
        params = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in response.parameters.items()}
        assert params["sequence_id"] == seq and params["sequence_start"] == start, params
        assert params["sequence_end"] == end, params
    sums = {int(r.get_response().id): scalar(r) for r, _ in got}
    assert sums == {0: 1, 1: 2, 2: 4, 3: 6}


# ------------------------------------------------------------------------ statistics


def test_statistics_count_requests_and_batched_executions(
    server: Server, http_client: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """After 8 concurrent sequences x 4 requests on seq_oldest, inference_count and the success count grew by
    32 and execution_count by fewer: every request is queued at once and the oldest strategy batches up
    to 4 candidate sequences (waiting up to 100 ms for a batch of 4), so some executions carry several
    requests. Both protocols report the same figures."""
    before = stats(http_client, "seq_oldest")
    rng = np.random.default_rng(6)
    seqs = [Seq(new_id(), random_values(rng, 4)) for _ in range(8)]
    results = run_on_stream(server, "seq_oldest", seqs)
    for (k, step), r in results.items():
        assert scalar(r) == seqs[k].sums()[step], (k, step)
    sent = sum(len(s.values) for s in seqs)

    after = stats(http_client, "seq_oldest")
    grew = {key: after[key] - before[key] for key in after}
    assert grew["inference_count"] == sent
    assert grew["success"] == sent
    assert 1 <= grew["execution_count"] < sent, grew
    assert after["execution_count"] <= after["inference_count"]
    assert stats(grpc_client, "seq_oldest") == after


# ------------------------------------------------------------------------ replica failure (keep last)


def replica_pids(server: Server, deployment: str) -> list[int]:
    """Live Ray Serve replica processes of ``deployment`` that belong to this test server (Ray titles them
    ``ray::ServeReplica:<app>:<deployment>``; they stay in the session the fixture starts the server in)."""
    return fault_injection.replica_pids(server.proc.pid, deployment)


def ps_listing(fragment: str) -> str:
    out = subprocess.run(["ps", "-eo", "pid,sid,args"], capture_output=True, text=True, timeout=10).stdout
    return "\n".join(line for line in out.splitlines() if fragment in line)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what()}")
        time.sleep(0.2)


SURVIVE, SURVIVE_DEPLOYMENT = "seq_survive", "seq_survive.v1.g0"


def wait_for_survive_replicas(server: Server, client: grpcclient.InferenceServerClient, timeout_s: float = 90) -> None:
    """Both seq_survive replicas running (an earlier test may have killed one) and the model ready."""
    wait_until(
        lambda: len(replica_pids(server, SURVIVE_DEPLOYMENT)) == 2 and client.is_model_ready(SURVIVE, client_timeout=5),
        timeout_s,
        lambda: ps_listing(SURVIVE),
    )


def test_replica_kill_sequences_continue_from_their_backed_up_state(server: Server) -> None:
    """seq_survive (2 instances x 2 slots) backs its implicit state up (on by default): SIGKILL a replica and
    every sequence goes on from its last answered step, with no failed request.

    1. Two sequences (one per instance: the router fills the instance with the most free slots); kill one
       replica; both go on at once (the lost one is restored in the other instance's free slot).
    2. Four sequences fill all four slots and send steps in a loop from four threads while a replica is
       killed: the in-flight steps of its two sequences are sent again (or answered from the backup) once
       Serve's replacement replica has taken them over; every running sum stays right."""
    model, deployment = "seq_survive", "seq_survive.v1.g0"
    long_s = 90.0  # a restore may wait for the replacement replica (about 10 s)
    grpc_c = grpcclient.InferenceServerClient(server.grpc_url)
    http_c = httpclient.InferenceServerClient(server.http_url, connection_timeout=long_s, network_timeout=long_s)

    def step(c: Client, value: int, sid: int, *, start: bool = False, end: bool = False) -> int:
        module = httpclient if protocol(c) == "http" else grpcclient
        kwargs: dict[str, Any] = {} if module is httpclient else {"client_timeout": long_s}
        r = c.infer(
            model, value_inputs(module, value), sequence_id=sid, sequence_start=start, sequence_end=end, **kwargs
        )
        return scalar(r)

    def two_replicas() -> bool:
        return len(replica_pids(server, deployment)) == 2 and grpc_c.is_model_ready(model, client_timeout=5)

    try:
        wait_until(two_replicas, 60, lambda: ps_listing("seq_survive"))
        pids = replica_pids(server, deployment)

        # 1. spare slots: the lost sequence moves to the surviving instance at once
        ids, sums = [new_id(), new_id()], [0, 0]
        for k, sid in enumerate(ids):
            for v in (k + 1, 10):
                sums[k] += v
                assert step(grpc_c, v, sid, start=v != 10) == sums[k]
        os.kill(pids[0], signal.SIGKILL)
        wait_until(lambda: pids[0] not in replica_pids(server, deployment), 30, lambda: "the replica to die")
        pauses = []
        for k, sid in enumerate(ids):
            t0 = time.monotonic()
            sums[k] += 5
            assert step(http_c if k else grpc_c, 5, sid) == sums[k], f"sequence {sid} after the kill"
            pauses.append(time.monotonic() - t0)
        for k, sid in enumerate(ids):
            sums[k] += 1
            assert step(grpc_c, 1, sid, end=True) == sums[k]
        print(
            f"\n[seq_survive] spare slots: 2/2 sequences continued, 0 lost; first step after the kill "
            f"{max(pauses) * 1000:.0f} ms"
        )

        # 2. all slots full, steps in flight: the lost sequences wait for the replacement replica
        wait_until(two_replicas, 90, lambda: f"{deployment} back to 2 replicas:\n{ps_listing('seq_survive')}")
        time.sleep(6)  # the router finds a new replica within 5 s
        pids = replica_pids(server, deployment)
        killed = threading.Event()
        after_kill = 15
        results: dict[int, tuple[int, int, int, float]] = {}  # k -> (steps, expected sum, failures, max step s)
        progress = [0] * 4
        since_kill = [0] * 4  # steps answered after the kill, per sequence

        def run(k: int) -> None:
            if k % 2 == 0:
                c: Client = grpcclient.InferenceServerClient(server.grpc_url)
            else:
                c = httpclient.InferenceServerClient(server.http_url, network_timeout=long_s)
            try:
                run_sequence(k, c)
            finally:
                c.close()

        def run_sequence(k: int, c: Client) -> None:
            rng = np.random.default_rng(k)
            sid, total, n, failures, worst = new_id(), 0, 0, 0, 0.0
            while True:
                # every sequence goes on until all have run after_kill steps after the kill, so the slots stay
                # full and the lost ones must wait for Serve's replacement replica
                last = killed.is_set() and min(since_kill) >= after_kill
                v = int(rng.integers(1, 100))
                t0 = time.monotonic()
                try:
                    got = step(c, v, sid, start=n == 0, end=last)
                except InferenceServerException as exc:
                    failures += 1
                    results[k] = (n, total, failures, worst)
                    raise AssertionError(f"sequence {sid} step {n} failed: {exc.message()}") from None
                worst = max(worst, time.monotonic() - t0)
                total += v
                n += 1
                progress[k] = n
                assert got == total, f"sequence {sid} step {n}: got {got}, expected {total}"
                if killed.is_set():
                    since_kill[k] += 1
                    time.sleep(0.02)
                if last:
                    break
            results[k] = (n, total, failures, worst)

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(run, k) for k in range(4)]
            wait_until(lambda: min(progress) >= 5, 60, lambda: f"steps so far {progress}")
            os.kill(pids[0], signal.SIGKILL)
            killed.set()
            errors = [f.exception(timeout=180) for f in futures]
        assert errors == [None] * 4, errors
        assert len(results) == 4 and all(r[2] == 0 for r in results.values()), results
        worst = max(r[3] for r in results.values())
        steps = sum(r[0] for r in results.values())
        print(
            f"[seq_survive] full slots, steps in flight: 4/4 sequences continued, 0 lost, 0 failed steps of "
            f"{steps}; longest step {worst:.1f} s (waiting for the replacement replica)"
        )
        wait_until(two_replicas, 90, lambda: f"{deployment} back to 2 replicas:\n{ps_listing('seq_survive')}")
    finally:
        grpc_c.close()
        http_c.close()


def test_stream_sequences_survive_a_replica_kill(server: Server) -> None:
    """gRPC streaming (tritonclient's ModelStreamInfer) through a replica kill: two seq_survive sequences on
    one stream (one per instance), two steps of each sent at a time; SIGKILL a replica between rounds. Every
    response arrives, in-band errors are none, every running sum is right."""
    model, deployment = "seq_survive", "seq_survive.v1.g0"
    probe = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        wait_for_survive_replicas(server, probe)
    finally:
        probe.close()
    ids, sums = [new_id(), new_id()], [0, 0]
    rounds = 8  # a replica is killed before round 3 is sent
    with Stream(server) as stream:
        for r in range(rounds):
            if r == 3:
                victim = replica_pids(server, deployment)[0]
                os.kill(victim, signal.SIGKILL)
                wait_until(lambda v=victim: v not in replica_pids(server, deployment), 30, lambda: "the replica to die")
            expected = {}
            for k, sid in enumerate(ids):
                for half in range(2):  # two steps of each sequence in flight at once
                    v = 1 + k + 10 * r + half
                    sums[k] += v
                    rid = f"{sid}-{r}-{half}"
                    expected[rid] = sums[k]
                    stream.send(model, v, request_id=rid, seq_id=sid, start=r == 0 and half == 0,
                                end=r == rounds - 1 and half == 1)  # fmt: skip
            got = stream.collect(len(expected))
            errors = [e.message() for _, e in got if e is not None]
            answered = sorted(res.get_response().id for res, _ in got if res is not None)
            assert errors == [], f"round {r}: {errors}; answered {answered}"
            assert {res.get_response().id: scalar(res) for res, _ in got} == expected, f"round {r}"
    print("\n[seq_survive] stream: 2/2 sequences continued through a replica kill, 0 failed responses")


def test_replica_kill_loses_only_its_own_sequences(
    server: Server, http_client: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """seq_kill: 2 instances x 2 slots. Four sequences fill all four slots (so both replicas hold some);
    SIGKILL one replica process. The next request of each sequence on it fails with UNAVAILABLE (HTTP 503)
    saying the sequence ``was lost`` and naming it; the others go on with correct sums; a lost sequence's
    further non-START requests keep failing; a START (same id or new) works; the model recovers."""
    model, deployment = "seq_kill", "seq_kill.v1.g0"
    pids = replica_pids(server, deployment)
    assert len(pids) == 2, f"expected 2 replica processes of {deployment}:\n{ps_listing('seq_kill')}"

    ids = [new_id() for _ in range(4)]
    sums = [0] * 4
    for step in range(2):
        for k, sid in enumerate(ids):
            v = k + 1 + 10 * step
            sums[k] += v
            assert scalar(infer(grpc_client, model, v, sid, start=step == 0)) == sums[k]

    victim = pids[0]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: victim not in replica_pids(server, deployment), 30, lambda: f"replica {victim} to die")

    # third request of each sequence (not END), alternating protocols so that both error mappings show up
    lost, alive = [], []
    for k, sid in enumerate(ids):
        c: Client = grpc_client if k % 2 == 0 else http_client
        try:
            r = infer(c, model, 100, sid)
        except InferenceServerException as e:
            assert e.status() == UNAVAILABLE[protocol(c)], (sid, e.status(), e.message())
            assert LOST in e.message() and str(sid) in e.message(), e.message()
            lost.append(k)
        else:
            sums[k] += 100
            assert scalar(r) == sums[k], sid
            alive.append(k)
    assert lost, "no sequence was lost with its replica"
    assert alive, "the surviving replica's sequences were lost too"

    for k in lost:  # a lost sequence stays lost for non-START requests
        for c in (grpc_client, http_client):
            with pytest.raises(InferenceServerException):
                infer(c, model, 1, ids[k])
    for k in alive:  # the survivors finish normally (and free their slots)
        sums[k] += 1000
        assert scalar(infer(grpc_client, model, 1000, ids[k], end=True)) == sums[k]

    # a lost id can START again, with fresh state, and new sequences are served
    again = ids[lost[0]]
    assert scalar(infer(grpc_client, model, 7, again, start=True)) == 7
    assert scalar(infer(http_client, model, 1, again, end=True)) == 8
    assert scalar(infer(grpc_client, model, 42, new_id(), start=True, end=True)) == 42

    # Ray Serve replaces the replica; wait for it and check that the model serves sequences again. The
    # stream sends everything at once, so it completes even if the new replica has not joined yet.
    wait_until(
        lambda: len(replica_pids(server, deployment)) == 2 and grpc_client.is_model_ready(model, client_timeout=5),
        60,
        lambda: f"{deployment} back to 2 ready replicas:\n{ps_listing('seq_kill')}",
    )
    rng = np.random.default_rng(7)
    seqs = [Seq(new_id(), random_values(rng, 3)) for _ in range(4)]
    for (k, step), r in run_on_stream(server, model, seqs).items():
        assert scalar(r) == seqs[k].sums()[step], (k, step)


def test_router_kill_keeps_live_sequences_and_serves_new_ones(
    server: Server, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """SIGKILL the sequence router: live sequences keep going (gateways know their places), Serve starts a
    new router, which rebuilds its table from the instances, and new sequences are served after it.
    seq_kill keeps idle sequences 30 s, longer than Serve takes to bring the router back."""
    model = "seq_kill"
    pids = replica_pids(server, "sequence_router")
    assert len(pids) == 1, ps_listing("sequence_router")
    ids = [new_id() for _ in range(3)]
    for sid in ids:
        assert scalar(infer(grpc_client, model, 5, sid, start=True)) == 5
    os.kill(pids[0], signal.SIGKILL)
    wait_until(lambda: pids[0] not in replica_pids(server, "sequence_router"), 30, lambda: "router to die")
    for sid in ids:  # no router needed for steps of live sequences
        assert scalar(infer(grpc_client, model, 1, sid)) == 6
    # A new sequence waits for the new router (the gateway retries), then runs; the old ones still end well.
    fresh = new_id()
    started = grpc_client.infer(
        model, value_inputs(grpcclient, 3), sequence_id=fresh, sequence_start=True, client_timeout=90
    )
    assert scalar(started) == 3
    for sid in ids:
        assert scalar(infer(grpc_client, model, 1, sid, end=True)) == 7
    assert scalar(infer(grpc_client, model, 1, fresh, end=True)) == 4
    wait_until(lambda: len(replica_pids(server, "sequence_router")) == 1, 60, lambda: ps_listing("sequence_router"))


def test_after_a_router_restart_sequences_still_survive_a_replica_kill(server: Server) -> None:
    """SIGKILL the sequence router, then a seq_survive replica: the new router took every live sequence's state
    from the instances' snapshots, so the dead replica's sequences continue from their last step."""
    model, deployment = "seq_survive", "seq_survive.v1.g0"
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        wait_for_survive_replicas(server, c)
        ids, sums = [new_id(), new_id()], [0, 0]
        for k, sid in enumerate(ids):
            for v in (k + 1, 10):
                sums[k] += v
                assert scalar(infer(c, model, v, sid, start=v != 10)) == sums[k]
        (router,) = replica_pids(server, "sequence_router")
        os.kill(router, signal.SIGKILL)
        wait_until(lambda: router not in replica_pids(server, "sequence_router"), 30, lambda: "router to die")
        # A new sequence starts only once the new router is up (and has polled the instances).
        fresh = new_id()
        r = c.infer(model, value_inputs(grpcclient, 3), sequence_id=fresh, sequence_start=True, client_timeout=90)
        assert scalar(r) == 3
        for k, sid in enumerate(ids):  # a step each, backed up with the new router
            sums[k] += 100
            assert scalar(infer(c, model, 100, sid)) == sums[k]
        victim = replica_pids(server, deployment)[0]
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: victim not in replica_pids(server, deployment), 30, lambda: "the replica to die")
        for k, sid in enumerate(ids):
            sums[k] += 1
            got = c.infer(model, value_inputs(grpcclient, 1), sequence_id=sid, sequence_end=True, client_timeout=90)
            assert scalar(got) == sums[k], f"sequence {sid} after the router restart and the replica kill"
        got = c.infer(model, value_inputs(grpcclient, 1), sequence_id=fresh, sequence_end=True, client_timeout=90)
        assert scalar(got) == 4
    finally:
        c.close()
