"""The sequence batcher in process: real ONNX models (built here with onnx.helper), the real repository,
service, router, instances and both front ends, without Ray.

Models (one repository, one service for this module, apart from the shared one):

- ``acc_direct`` / ``acc_oldest``: an accumulator with implicit state (OUTPUT = INPUT + INPUT_STATE) that
  also echoes its START and CORRID controls; direct with 4 slots, oldest with 3 candidates;
- ``ctl_direct`` / ``ctl_oldest``: echo every control (START as FP32, END as BOOL, READY as INT32, CORRID as
  INT32 for direct and STRING for oldest);
- ``acc_nobatch``: an unbatched accumulator whose initial state comes from ``initial_state/<file>``;
- ``acc_idle``: a direct accumulator with one slot and a 30 ms idle timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc

from serve_app.errors import InvalidArgument, ServeError
from serve_app.inference.types import InferRequest, InferTensor, RequestedOutput
from serve_app.keys import ModelKey
from serve_app.service import InferenceService
from serve_app.stats import ModelStats
from tests.integration.conftest import infer as service_infer, local_service
from tests.support.sequence_repository import (
    ACC_DIRECT,
    ACC_IDLE,
    ACC_NOBATCH,
    ACC_OLDEST,
    CTL_DIRECT,
    CTL_OLDEST,
    INITIAL,
    build_sequence_repository,
)

Stub = service_pb2_grpc.GRPCInferenceServiceStub

START_FLAG = "must specify the START flag on the first request of the sequence"
NON_ZERO = "must specify a non-zero or non-empty correlation ID"


@pytest.fixture(scope="session")
def sequence_service(tmp_path_factory: pytest.TempPathFactory) -> InferenceService:
    return local_service(build_sequence_repository(tmp_path_factory.mktemp("sequence_repo"))).service


@pytest.fixture(scope="module")
def service(sequence_service: InferenceService) -> InferenceService:
    """This module's service: the conftest's ``http`` and ``grpc_stub`` fixtures speak to it."""
    return sequence_service


@pytest.fixture
def svc(sequence_service: InferenceService) -> Iterator[InferenceService]:
    yield sequence_service
    # Every test ends its sequences: nothing is left in a slot or in a backlog for the next one.
    router = sequence_service.executor.router  # type: ignore[attr-defined]
    for key in (f"{m}:1" for m in (ACC_DIRECT, ACC_OLDEST, CTL_DIRECT, CTL_OLDEST, ACC_NOBATCH, ACC_IDLE)):
        try:
            table = router.assigner(key)
        except ServeError:
            continue  # not used yet
        assert table.active == {} and table.backlog == [], key


# --------------------------------------------------------------------------- helpers


def seq_request(
    model: str,
    corr: int | str,
    value: int,
    *,
    start: bool = False,
    end: bool = False,
    batched: bool = True,
    outputs: tuple[str, ...] = (),
) -> InferRequest:
    params: dict[str, Any] = {"sequence_id": corr}
    if start:
        params["sequence_start"] = True
    if end:
        params["sequence_end"] = True
    data = np.array([[value]] if batched else [value], dtype=np.int32)
    return InferRequest(
        model,
        inputs=[InferTensor("INPUT", "INT32", data.shape, data)],
        outputs=[RequestedOutput(o) for o in outputs],
        parameters=params,
    )


async def infer(svc: InferenceService, *args: Any, **kw: Any) -> dict[str, Any]:
    resp = await service_infer(svc, seq_request(*args, **kw))
    return {t.name: t.data.ravel().tolist()[0] for t in resp.outputs}


async def run_sequence(svc: InferenceService, model: str, corr: int | str, values: list[int]) -> list[dict[str, Any]]:
    return [await infer(svc, model, corr, v, start=i == 0, end=i == len(values) - 1) for i, v in enumerate(values)]


def sums(values: list[int], initial: int = 0) -> list[int]:
    return list(np.cumsum([initial, *values])[1:])


def stats(svc: InferenceService, model: str) -> ModelStats:
    return svc.local_stats().get(ModelKey(model, 1)) or ModelStats(model, "1")


def executions_by_size(after: ModelStats, before: ModelStats) -> dict[int, int]:
    """Executions per batch size (rows, empty direct rows included) between two snapshots."""
    count = {size: t["compute_infer"].count for size, t in after.batches.items()}
    for size, t in before.batches.items():
        count[size] -= t["compute_infer"].count
    return {size: n for size, n in count.items() if n}


# --------------------------------------------------------------------------- InferenceService


@pytest.mark.parametrize("model", [ACC_DIRECT, ACC_OLDEST])
async def test_accumulates_many_concurrent_sequences(svc: InferenceService, model: str) -> None:
    """More sequences than slots at once: the extra ones wait in the backlog; each keeps its own state."""
    before = stats(svc, model)
    seqs = {corr: [corr % 7 + i for i in range(5)] for corr in range(101, 113)}  # 12 sequences, 3 or 4 slots
    results = await asyncio.gather(*(run_sequence(svc, model, c, v) for c, v in seqs.items()))
    for (corr, values), outs in zip(seqs.items(), results, strict=True):
        assert [o["OUTPUT"] for o in outs] == sums(values), corr
        assert [o["OUTPUT_STATE"] for o in outs] == sums(values)
        assert [o["OUT_START"] for o in outs] == [1, 0, 0, 0, 0]
        assert {o["OUT_CORRID"] for o in outs} == {corr}
    after = stats(svc, model)
    assert after.inference_count - before.inference_count == 60
    executions = after.execution_count - before.execution_count
    assert 0 < executions < 60  # some steps of different sequences were batched together
    sizes = executions_by_size(after, before)
    assert sum(sizes.values()) == executions
    assert max(sizes) <= (4 if model == ACC_DIRECT else 3)  # direct: rows 0..3; oldest: 3 candidates at most


async def test_direct_batches_span_slots_up_to_the_highest_occupied(svc: InferenceService) -> None:
    before = stats(svc, CTL_DIRECT)
    a = await infer(svc, CTL_DIRECT, 1, 10, start=True)  # slot 0: rows [0]
    b = await infer(svc, CTL_DIRECT, 2, 20, start=True)  # slot 1: rows [0 (empty), 1]
    assert await infer(svc, CTL_DIRECT, 1, 11, end=True) == {  # rows [0, 1 (empty)]
        "OUTPUT": 11,
        "OUT_START": 0.0,
        "OUT_END": True,
        "OUT_READY": 1,
        "OUT_CORRID": 1,
    }
    c = await infer(svc, CTL_DIRECT, 2, 21, end=True)  # slot 0 is free again but slot 1 is held: rows [0, 1]
    assert (a["OUT_START"], a["OUT_END"], b["OUT_START"], c["OUT_END"]) == (1.0, False, 1.0, True)
    after = stats(svc, CTL_DIRECT)
    assert executions_by_size(after, before) == {1: 1, 2: 3}
    assert after.execution_count - before.execution_count == 4
    assert after.inference_count - before.inference_count == 4


@pytest.mark.parametrize(
    ("corr", "int32"), [(5, 5), (2**32 + 5, 5), (2**31, -(2**31)), (2**64 - 1, -1), (2**31 - 1, 2**31 - 1)]
)
async def test_control_values_and_int32_corrid(svc: InferenceService, corr: int, int32: int) -> None:
    outs = await run_sequence(svc, CTL_DIRECT, corr, [1, 2, 3])
    assert [o["OUTPUT"] for o in outs] == [1, 2, 3]
    assert [o["OUT_START"] for o in outs] == [1.0, 0.0, 0.0]
    assert [o["OUT_END"] for o in outs] == [False, False, True]
    assert [o["OUT_READY"] for o in outs] == [1, 1, 1]
    assert [o["OUT_CORRID"] for o in outs] == [int32] * 3


@pytest.mark.parametrize(("corr", "wire"), [("abc", b"abc"), ("seq 1/ü", "seq 1/ü".encode()), (12, b"12")])
async def test_oldest_string_corrid(svc: InferenceService, corr: int | str, wire: bytes) -> None:
    outs = await run_sequence(svc, CTL_OLDEST, corr, [4, 5])
    assert [o["OUT_CORRID"] for o in outs] == [wire, wire]
    assert [o["OUT_START"] for o in outs] == [1.0, 0.0]
    assert [o["OUT_END"] for o in outs] == [False, True]


async def test_single_start_end_request(svc: InferenceService) -> None:
    out = await infer(svc, CTL_OLDEST, "once", 9, start=True, end=True)
    assert (out["OUT_START"], out["OUT_END"], out["OUT_READY"], out["OUT_CORRID"]) == (1.0, True, 1, b"once")


async def test_requested_outputs_only(svc: InferenceService) -> None:
    out = await infer(svc, ACC_DIRECT, 77, 3, start=True, outputs=("OUTPUT_STATE",))
    assert out == {"OUTPUT_STATE": 3}
    assert await infer(svc, ACC_DIRECT, 77, 4, end=True, outputs=("OUTPUT",)) == {"OUTPUT": 7}


async def test_start_mid_sequence_restarts_the_state(svc: InferenceService) -> None:
    assert (await infer(svc, ACC_DIRECT, 5, 10, start=True))["OUTPUT"] == 10
    assert (await infer(svc, ACC_DIRECT, 5, 10))["OUTPUT"] == 20
    restarted = await infer(svc, ACC_DIRECT, 5, 1, start=True)
    assert (restarted["OUTPUT"], restarted["OUT_START"]) == (1, 1)
    assert (await infer(svc, ACC_DIRECT, 5, 2, end=True))["OUTPUT"] == 3


async def test_unbatched_model_with_initial_state_from_a_file(svc: InferenceService) -> None:
    outs = [
        await infer(svc, ACC_NOBATCH, 3, v, start=i == 0, end=i == 2, batched=False) for i, v in enumerate((1, 2, 3))
    ]
    assert [o["OUTPUT"] for o in outs] == [INITIAL + 1, INITIAL + 3, INITIAL + 6]
    assert [o["OUT_START"] for o in outs] == [1, 0, 0]
    resp = await service_infer(svc, seq_request(ACC_NOBATCH, 4, 1, start=True, end=True, batched=False))
    assert resp.outputs[0].shape == (1,)


async def test_errors(svc: InferenceService) -> None:
    cases: list[tuple[InferRequest, str]] = [
        (seq_request(ACC_DIRECT, 0, 1, start=True), NON_ZERO),
        (seq_request(ACC_DIRECT, "", 1, start=True), NON_ZERO),
        (
            seq_request(ACC_DIRECT, 424242, 1),
            f"inference request for sequence 424242 to model '{ACC_DIRECT}' {START_FLAG}",
        ),
        (seq_request(ACC_DIRECT, "word", 1, start=True), "expects a TYPE_UINT64 correlation ID"),
        (seq_request(CTL_DIRECT, "word", 1, start=True), "expects a TYPE_INT32 correlation ID"),
    ]
    no_id = seq_request(ACC_DIRECT, 1, 1, start=True)
    no_id.parameters.pop("sequence_id")
    cases.append((no_id, NON_ZERO))
    flag = seq_request(ACC_DIRECT, 1, 1)
    flag.parameters["sequence_start"] = 1
    cases.append((flag, "parameter 'sequence_start'"))
    batch2 = seq_request(ACC_DIRECT, 1, 1, start=True)
    batch2.inputs = [InferTensor("INPUT", "INT32", (2, 1), np.ones((2, 1), dtype=np.int32))]
    cases.append((batch2, "must specify batch-size 1 due to requirements of sequence batcher"))
    for request, fragment in cases:
        with pytest.raises(InvalidArgument) as exc:
            await service_infer(svc, request)
        assert fragment in exc.value.message, (request.parameters, exc.value.message)


async def test_request_after_end_needs_start(svc: InferenceService) -> None:
    await run_sequence(svc, ACC_DIRECT, 31, [1, 2])
    with pytest.raises(InvalidArgument, match=START_FLAG):
        await service_infer(svc, seq_request(ACC_DIRECT, 31, 3))
    # ... and START begins it again from the initial state.
    assert (await infer(svc, ACC_DIRECT, 31, 3, start=True, end=True))["OUTPUT"] == 3


async def test_idle_sequence_loses_its_slot_to_the_backlog(svc: InferenceService) -> None:
    assert (await infer(svc, ACC_IDLE, 1, 5, start=True))["OUTPUT"] == 5
    # Sequence 2 waits for the only slot, which 1 gives up after 30 ms of idleness.
    second = asyncio.create_task(infer(svc, ACC_IDLE, 2, 7, start=True, end=True))
    assert (await asyncio.wait_for(second, 5))["OUTPUT"] == 7
    with pytest.raises(InvalidArgument, match=START_FLAG):
        await service_infer(svc, seq_request(ACC_IDLE, 1, 1))


async def test_sequence_statistics(svc: InferenceService) -> None:
    before = stats(svc, ACC_OLDEST)
    await run_sequence(svc, ACC_OLDEST, 61, [1, 1, 1])
    with pytest.raises(InvalidArgument):
        await service_infer(svc, seq_request(ACC_OLDEST, 61, 1))
    after = stats(svc, ACC_OLDEST)
    assert after.inference_count - before.inference_count == 3
    assert after.execution_count - before.execution_count == 3  # one sequence: one request per execution
    assert after.inference["success"].count - before.inference["success"].count == 3
    assert after.failure_count - before.failure_count == 1
    assert after.pending == 0


# --------------------------------------------------------------------------- HTTP


def http_body(corr: int | str | None, value: int, **flags: bool) -> dict[str, Any]:
    params: dict[str, Any] = {f"sequence_{k}": v for k, v in flags.items()}
    if corr is not None:
        params["sequence_id"] = corr
    return {
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
        "parameters": params,
    }


def http_outputs(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    return {o["name"]: o["data"][0] for o in r.json()["outputs"]}


async def test_http_sequence(http: httpx.AsyncClient, svc: InferenceService) -> None:
    path = f"/v2/models/{ACC_DIRECT}/infer"
    outs = []
    for i, v in enumerate((2, 3, 4)):
        r = await http.post(path, json=http_body(2**63 + 1, v, start=i == 0, end=i == 2))
        outs.append(http_outputs(r))
    assert [o["OUTPUT"] for o in outs] == [2, 5, 9]
    assert [o["OUT_START"] for o in outs] == [1, 0, 0]
    assert {o["OUT_CORRID"] for o in outs} == {2**63 + 1}


async def test_http_string_id_on_the_oldest_model(http: httpx.AsyncClient, svc: InferenceService) -> None:
    path = f"/v2/models/{CTL_OLDEST}/infer"
    first = http_outputs(await http.post(path, json=http_body("client-a", 1, start=True)))
    last = http_outputs(await http.post(path, json=http_body("client-a", 2, end=True)))
    assert (first["OUT_CORRID"], first["OUT_START"], last["OUT_END"]) == ("client-a", 1.0, True)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (http_body(None, 1, start=True), NON_ZERO),
        (http_body(0, 1, start=True), NON_ZERO),
        (http_body("", 1, start=True), NON_ZERO),
        (http_body(987654, 1), START_FLAG),
        (http_body("text", 1, start=True), "expects a TYPE_UINT64 correlation ID"),
        (http_body(-4, 1, start=True), "unsigned 64-bit"),
        ({**http_body(1, 1), "parameters": {"sequence_id": 1, "sequence_start": "yes"}}, "must be a boolean"),
        (
            {
                "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [2, 1], "data": [1, 2]}],
                "parameters": {"sequence_id": 1, "sequence_start": True},
            },
            "must specify batch-size 1 due to requirements of sequence batcher",
        ),
    ],
)
async def test_http_errors(http: httpx.AsyncClient, svc: InferenceService, body: dict[str, Any], fragment: str) -> None:
    r = await http.post(f"/v2/models/{ACC_DIRECT}/infer", json=body)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]


async def test_http_statistics(http: httpx.AsyncClient, svc: InferenceService) -> None:
    before = stats(svc, ACC_NOBATCH).inference_count
    path = f"/v2/models/{ACC_NOBATCH}/infer"
    body = http_body(8, 1, start=True, end=True)
    body["inputs"][0]["shape"] = [1]
    assert http_outputs(await http.post(path, json=body))["OUTPUT"] == INITIAL + 1
    r = await http.get(f"/v2/models/{ACC_NOBATCH}/stats")
    assert r.status_code == 200
    (entry,) = r.json()["model_stats"]
    assert entry["inference_count"] == before + 1


# --------------------------------------------------------------------------- gRPC


def grpc_request(
    model: str, corr: int | str | None, value: int, request_id: str = "", **flags: bool
) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model, id=request_id)
    if isinstance(corr, str):
        req.parameters["sequence_id"].string_param = corr
    elif corr is not None:
        req.parameters["sequence_id"].int64_param = corr
    for key, flag in flags.items():
        req.parameters[f"sequence_{key}"].bool_param = flag
    req.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
    req.raw_input_contents.append(np.array([[value]], dtype=np.int32).tobytes())
    return req


def grpc_outputs(resp: pb.ModelInferResponse) -> dict[str, Any]:
    dtypes = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_}
    out: dict[str, Any] = {}
    for meta, raw in zip(resp.outputs, resp.raw_output_contents, strict=True):
        if meta.datatype == "BYTES":
            out[meta.name] = raw[4:]  # one length-prefixed element
        else:
            out[meta.name] = np.frombuffer(raw, dtype=dtypes[meta.datatype]).item()
    return out


async def test_grpc_sequence_int_and_string_ids(grpc_stub: Stub, svc: InferenceService) -> None:
    outs = [
        grpc_outputs(await grpc_stub.ModelInfer(grpc_request(ACC_OLDEST, 4242, v, start=i == 0, end=i == 2)))
        for i, v in enumerate((1, 10, 100))
    ]
    assert [o["OUTPUT"] for o in outs] == [1, 11, 111]
    assert {o["OUT_CORRID"] for o in outs} == {4242}
    outs = [
        grpc_outputs(await grpc_stub.ModelInfer(grpc_request(CTL_OLDEST, "grpc-seq", v, start=i == 0, end=i == 1)))
        for i, v in enumerate((1, 2))
    ]
    assert [o["OUT_CORRID"] for o in outs] == [b"grpc-seq", b"grpc-seq"]
    assert [(o["OUT_START"], o["OUT_END"]) for o in outs] == [(1.0, False), (0.0, True)]


async def test_grpc_negative_int64_id_is_the_uint64_bit_pattern(grpc_stub: Stub, svc: InferenceService) -> None:
    out = grpc_outputs(await grpc_stub.ModelInfer(grpc_request(ACC_DIRECT, -2, 6, start=True, end=True)))
    assert (out["OUTPUT"], out["OUT_CORRID"]) == (6, 2**64 - 2)


@pytest.mark.parametrize(
    ("corr", "flags", "fragment"),
    [
        (None, {"start": True}, NON_ZERO),
        (0, {"start": True}, NON_ZERO),
        ("", {"start": True}, NON_ZERO),
        (55555, {}, START_FLAG),
        ("str", {"start": True}, "expects a TYPE_UINT64 correlation ID"),
    ],
)
async def test_grpc_errors(
    grpc_stub: Stub, svc: InferenceService, corr: int | str | None, flags: dict[str, bool], fragment: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await grpc_stub.ModelInfer(grpc_request(ACC_DIRECT, corr, 1, **flags))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in (exc.value.details() or "")


async def _stream(stub: Stub, requests: list[pb.ModelInferRequest]) -> dict[str, pb.ModelStreamInferResponse]:
    async def gen() -> AsyncIterator[pb.ModelInferRequest]:
        for r in requests:
            yield r

    answers: dict[str, pb.ModelStreamInferResponse] = {}
    async for resp in stub.ModelStreamInfer(gen()):
        rid = resp.infer_response.id
        assert rid not in answers, rid
        answers[rid] = resp
    assert len(answers) == len(requests)
    return answers


@pytest.mark.parametrize("model", [ACC_DIRECT, ACC_OLDEST])
async def test_grpc_stream_interleaved_sequences(grpc_stub: Stub, svc: InferenceService, model: str) -> None:
    """Many more sequences than slots, their steps interleaved on one stream: every response is checked."""
    steps = 4
    values = {corr: [(corr * 3 + i) % 11 - 5 for i in range(steps)] for corr in range(5001, 5017)}  # 16 sequences
    requests = [
        grpc_request(model, corr, vals[i], f"{corr}/{i}", start=i == 0, end=i == steps - 1)
        for i in range(steps)
        for corr, vals in values.items()
    ]
    # An in-band error in the middle does not end the stream.
    requests.insert(len(requests) // 2, grpc_request(model, 999_999, 1, "bad"))
    answers = await asyncio.wait_for(_stream(grpc_stub, requests), 30)
    assert START_FLAG in answers.pop("bad").error_message
    for corr, vals in values.items():
        expected = sums(vals)
        for i in range(steps):
            resp = answers[f"{corr}/{i}"]
            assert resp.error_message == "", resp.error_message
            out = grpc_outputs(resp.infer_response)
            assert out["OUTPUT"] == expected[i], (corr, i)
            assert out["OUT_CORRID"] == corr
            assert out["OUT_START"] == (1 if i == 0 else 0)


async def test_grpc_stream_control_echo_string_ids(grpc_stub: Stub, svc: InferenceService) -> None:
    ids = [f"s{n}" for n in range(10)]  # 10 sequences, 4 candidates
    requests = [
        grpc_request(CTL_OLDEST, corr, n * 10 + i, f"{corr}/{i}", start=i == 0, end=i == 2)
        for i in range(3)
        for n, corr in enumerate(ids)
    ]
    answers = await asyncio.wait_for(_stream(grpc_stub, requests), 30)
    for n, corr in enumerate(ids):
        for i in range(3):
            resp = answers[f"{corr}/{i}"]
            assert resp.error_message == "", resp.error_message
            out = grpc_outputs(resp.infer_response)
            assert out == {
                "OUTPUT": n * 10 + i,
                "OUT_START": 1.0 if i == 0 else 0.0,
                "OUT_END": i == 2,
                "OUT_READY": 1,
                "OUT_CORRID": corr.encode(),
            }
