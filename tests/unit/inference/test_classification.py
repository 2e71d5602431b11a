"""Triton's classification extension: top-k as "value:index[:label]" strings."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.errors import InvalidArgument
from serve_app.inference.classification import apply_classification, classification_count, classify
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, RequestedOutput
from serve_app.protos import model_config_pb2 as mc


def strings(arr: np.ndarray) -> list:
    return [[x.decode() for x in row] for row in arr] if arr.ndim == 2 else [x.decode() for x in arr]


def test_float_values_print_like_std_to_string_with_labels() -> None:
    data = np.array([[0.1, 9.0, 3.5]], dtype=np.float32)
    out = classify(data, 2, ("cat", "dog", "bird"), batched=True)
    assert out.shape == (1, 2) and out.dtype == np.object_
    assert strings(out) == [["9.000000:1:dog", "3.500000:2:bird"]]


def test_integers_without_labels() -> None:
    data = np.array([[3, 9, 1], [7, 0, 8]], dtype=np.int32)
    assert strings(classify(data, 1, (), batched=True)) == [["9:1"], ["8:2"]]


def test_k_larger_than_the_classes_is_capped() -> None:
    out = classify(np.array([[1.0, 2.0]], dtype=np.float64), 5, ("a",), batched=True)
    assert strings(out) == [["2.000000:1", "1.000000:0:a"]]


def test_unbatched_model_gives_a_flat_result() -> None:
    out = classify(np.array([0.5, 0.25, 1.0], dtype=np.float32), 2, (), batched=False)
    assert out.shape == (2,) and strings(out) == ["1.000000:2", "0.500000:0"]


def test_rows_are_flattened_per_batch_element() -> None:
    data = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
    assert strings(classify(data, 1, (), batched=True)) == [["3.000000:3"], ["7.000000:3"]]


def signature(datatype: int = mc.TYPE_FP32) -> ModelSignature:
    config = mc.ModelConfig(name="m", max_batch_size=4)
    config.input.add(name="IN", data_type=mc.TYPE_FP32, dims=[3])
    config.output.add(name="OUT", data_type=datatype, dims=[3])
    return ModelSignature.from_config(config, "1")


def test_requested_counts_and_their_checks() -> None:
    req = InferRequest("m", outputs=[RequestedOutput("OUT", {"classification": 2})])
    assert classification_count(req, signature()) == {"OUT": 2}
    assert classification_count(InferRequest("m", outputs=[RequestedOutput("OUT")]), signature()) == {}
    for bad in (0, -1, True, "2", 1.5):
        with pytest.raises(InvalidArgument, match="must be a positive integer"):
            classification_count(
                InferRequest("m", outputs=[RequestedOutput("OUT", {"classification": bad})]), signature()
            )
    with pytest.raises(InvalidArgument, match="non-numeric type 'BYTES'"):
        classification_count(req, signature(mc.TYPE_STRING))


def test_apply_replaces_only_the_classified_outputs() -> None:
    a = np.array([[1.0, 3.0, 2.0]], dtype=np.float32)
    resp = InferResponse(
        "m", "1", outputs=[InferTensor("OUT", "FP32", a.shape, a), InferTensor("X", "FP32", a.shape, a)]
    )
    apply_classification(resp, {"OUT": 1}, {"OUT": ("a", "b", "c")}, batched=True)
    assert resp.outputs[0].datatype == "BYTES" and resp.outputs[0].shape == (1, 1)
    assert strings(resp.outputs[0].data) == [["3.000000:1:b"]]
    assert resp.outputs[1].datatype == "FP32"
