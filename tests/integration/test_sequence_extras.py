"""In process (no Ray): a TYPE_STRING implicit state, sequences through an ensemble (flags in, sequence
parameters out), and a backlogged sequence failing when its request timeout passes, through the service as
both front ends call it."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from serve_app.errors import InvalidArgument, Unavailable
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, ParamValue
from serve_app.service import InferenceService
from tests.e2e.sequence_models import accumulator, sequence_ensemble, string_accumulator
from tests.integration.conftest import infer, local_service

BACKLOG_TIMEOUT = "timeout of the corresponding sequence has been expired"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceService]:
    repo = tmp_path_factory.mktemp("sequence_extras")
    string_accumulator(repo)
    accumulator(repo, "seq_accum", max_batch_size=4, instances=1, idle_us=30_000_000)
    sequence_ensemble(repo)
    accumulator(repo, "one_slot", max_batch_size=1, instances=1, idle_us=30_000_000,
                strategy="  oldest { max_candidate_sequences: 1 }\n")  # fmt: skip
    host = local_service(pathlib.Path(repo))
    yield host.service
    host.close()


def request(model: str, data: np.ndarray, datatype: str, **params: ParamValue) -> InferRequest:
    parameters = {("sequence_id" if k == "seq" else f"sequence_{k}" if k in ("start", "end") else k): v
                  for k, v in params.items()}  # fmt: skip
    return InferRequest(model, inputs=[InferTensor("INPUT", datatype, data.shape, data)], parameters=parameters)


def text(value: str) -> np.ndarray:
    data = np.empty((1, 1), dtype=object)
    data[0, 0] = value.encode()
    return data


def number(value: int) -> np.ndarray:
    return np.array([[value]], dtype=np.int32)


def first(response: InferResponse) -> Any:
    return response.outputs[0].data.ravel()[0]


async def test_string_state_runs_on(svc: InferenceService) -> None:
    assert first(await infer(svc, request("seq_text", text("ab"), "BYTES", seq=5, start=True))) == b"<ab"
    assert first(await infer(svc, request("seq_text", text("cd"), "BYTES", seq=5))) == b"<abcd"
    assert first(await infer(svc, request("seq_text", text("!"), "BYTES", seq=5, end=True))) == b"<abcd!"


async def test_ensemble_passes_flags_and_answers_with_them(svc: InferenceService) -> None:
    sums, params = [], []
    for value, flags in [(3, {"start": True}), (4, {}), (5, {"end": True})]:
        response = await infer(svc, request("seq_ensemble", number(value), "INT32", seq="s1", **flags))
        sums.append(int(first(response)))
        params.append(response.parameters)
    assert sums == [3, 7, 12]
    assert params == [
        {"sequence_id": "s1", "sequence_start": True, "sequence_end": False},
        {"sequence_id": "s1", "sequence_start": False, "sequence_end": False},
        {"sequence_id": "s1", "sequence_start": False, "sequence_end": True},
    ]
    with pytest.raises(InvalidArgument, match="in ensemble 'seq_ensemble', inference request for sequence s1"):
        await infer(svc, request("seq_ensemble", number(1), "INT32", seq="s1"))


async def test_a_backlogged_start_fails_when_its_timeout_passes(svc: InferenceService) -> None:
    await infer(svc, request("one_slot", number(1), "INT32", seq=1, start=True))
    with pytest.raises(Unavailable, match=BACKLOG_TIMEOUT):
        await asyncio.wait_for(infer(svc, request("one_slot", number(2), "INT32", seq=2, start=True, timeout=1000)), 10)
    with pytest.raises(InvalidArgument, match="must specify the START flag"):
        await infer(svc, request("one_slot", number(2), "INT32", seq=2))
    assert first(await infer(svc, request("one_slot", number(2), "INT32", seq=1, end=True))) == 3
