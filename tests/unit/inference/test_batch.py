"""Batch helpers: shape keys, merging inputs, choosing outputs, splitting results."""

from __future__ import annotations

import numpy as np

from serve_app.inference.batch import merge_inputs, shape_key, split_outputs, union_outputs
from serve_app.inference.types import InferRequest, InferTensor, RequestedOutput

ALL_OUTPUTS = ("OUT_A", "OUT_B", "OUT_C")


def tensor(name: str, data: np.ndarray) -> InferTensor:
    return InferTensor(name, "FP32", tuple(data.shape), data)


def request(*inputs: InferTensor, outputs: tuple[str, ...] = ()) -> InferRequest:
    return InferRequest("m", inputs=list(inputs), outputs=[RequestedOutput(n) for n in outputs])


def rows(n: int, width: int = 2, start: float = 0.0) -> np.ndarray:
    return (np.arange(n * width, dtype=np.float32) + start).reshape(n, width)


# -- shape_key -----------------------------------------------------------------
def test_shape_key_ignores_batch_dimension_when_batched() -> None:
    one = request(tensor("X", rows(1, 3)))
    four = request(tensor("X", rows(4, 3)))
    assert shape_key(one, batched=True) == shape_key(four, batched=True) == (("X", (3,)),)


def test_shape_key_keeps_every_dimension_when_not_batched() -> None:
    one = request(tensor("X", rows(1, 3)))
    four = request(tensor("X", rows(4, 3)))
    assert shape_key(one, batched=False) == (("X", (1, 3)),)
    assert shape_key(four, batched=False) == (("X", (4, 3)),)
    assert shape_key(one, batched=False) != shape_key(four, batched=False)


def test_shape_key_differs_on_non_batch_dimensions() -> None:
    a = request(tensor("X", rows(2, 3)))
    b = request(tensor("X", rows(2, 4)))
    assert shape_key(a, batched=True) != shape_key(b, batched=True)


def test_shape_key_differs_on_input_names() -> None:
    a = request(tensor("X", rows(1)))
    b = request(tensor("Y", rows(1)))
    assert shape_key(a, batched=True) != shape_key(b, batched=True)


def test_shape_key_is_independent_of_input_order() -> None:
    a = request(tensor("X", rows(1, 2)), tensor("Y", rows(1, 5)))
    b = request(tensor("Y", rows(3, 5)), tensor("X", rows(3, 2)))
    assert shape_key(a, batched=True) == shape_key(b, batched=True) == (("X", (2,)), ("Y", (5,)))


def test_shape_key_is_hashable() -> None:
    key = shape_key(request(tensor("X", rows(1, 2))), batched=True)
    assert {key: 1}[key] == 1


# -- merge_inputs ----------------------------------------------------------------
def test_merge_single_request_returns_arrays_unchanged() -> None:
    x, y = rows(2), rows(2, 3)
    merged = merge_inputs([request(tensor("X", x), tensor("Y", y))])
    assert list(merged) == ["X", "Y"]
    assert merged["X"] is x
    assert merged["Y"] is y


def test_merge_concatenates_rows_in_request_order() -> None:
    a, b, c = rows(1, start=0), rows(2, start=100), rows(3, start=200)
    merged = merge_inputs([request(tensor("X", a)), request(tensor("X", b)), request(tensor("X", c))])
    assert merged["X"].shape == (6, 2)
    assert merged["X"].dtype == np.float32
    np.testing.assert_array_equal(merged["X"], np.concatenate([a, b, c]))


def test_merge_matches_inputs_by_name_whatever_their_order() -> None:
    x1, y1 = rows(1, start=0), rows(1, 3, start=10)
    x2, y2 = rows(2, start=50), rows(2, 3, start=60)
    merged = merge_inputs([request(tensor("X", x1), tensor("Y", y1)), request(tensor("Y", y2), tensor("X", x2))])
    assert list(merged) == ["X", "Y"]
    np.testing.assert_array_equal(merged["X"], np.concatenate([x1, x2]))
    np.testing.assert_array_equal(merged["Y"], np.concatenate([y1, y2]))


def test_merge_of_several_requests_copies() -> None:
    a, b = rows(1), rows(1, start=5)
    merged = merge_inputs([request(tensor("X", a)), request(tensor("X", b))])
    assert not np.shares_memory(merged["X"], a)
    assert not np.shares_memory(merged["X"], b)


def test_merge_bytes_tensors() -> None:
    a = np.array([[b"a"]], dtype=np.object_)
    b = np.array([[b"b"], [b"c"]], dtype=np.object_)
    ra = request(InferTensor("S", "BYTES", (1, 1), a))
    rb = request(InferTensor("S", "BYTES", (2, 1), b))
    merged = merge_inputs([ra, rb])
    assert merged["S"].shape == (3, 1)
    assert merged["S"].tolist() == [[b"a"], [b"b"], [b"c"]]


# -- union_outputs ---------------------------------------------------------------
def test_union_all_when_one_request_asks_for_none() -> None:
    reqs = [request(outputs=("OUT_B",)), request(), request(outputs=("OUT_A",))]
    assert union_outputs(reqs, ALL_OUTPUTS) == ALL_OUTPUTS


def test_union_all_for_single_request_asking_none() -> None:
    assert union_outputs([request()], ALL_OUTPUTS) == ALL_OUTPUTS


def test_union_in_model_order() -> None:
    reqs = [request(outputs=("OUT_C",)), request(outputs=("OUT_A", "OUT_C"))]
    assert union_outputs(reqs, ALL_OUTPUTS) == ("OUT_A", "OUT_C")


def test_union_of_single_request() -> None:
    assert union_outputs([request(outputs=("OUT_B",))], ALL_OUTPUTS) == ("OUT_B",)


def test_union_without_duplicates() -> None:
    reqs = [request(outputs=("OUT_B",)), request(outputs=("OUT_B",))]
    assert union_outputs(reqs, ALL_OUTPUTS) == ("OUT_B",)


# -- split_outputs ---------------------------------------------------------------
def test_split_gives_each_request_its_rows() -> None:
    out_a, out_b = rows(6, start=0), rows(6, 3, start=100)
    parts = split_outputs({"OUT_A": out_a, "OUT_B": out_b}, [1, 2, 3])
    assert len(parts) == 3
    assert [list(p) for p in parts] == [["OUT_A", "OUT_B"]] * 3
    np.testing.assert_array_equal(parts[0]["OUT_A"], out_a[0:1])
    np.testing.assert_array_equal(parts[1]["OUT_A"], out_a[1:3])
    np.testing.assert_array_equal(parts[2]["OUT_A"], out_a[3:6])
    np.testing.assert_array_equal(parts[0]["OUT_B"], out_b[0:1])
    np.testing.assert_array_equal(parts[1]["OUT_B"], out_b[1:3])
    np.testing.assert_array_equal(parts[2]["OUT_B"], out_b[3:6])
    assert [p["OUT_B"].shape for p in parts] == [(1, 3), (2, 3), (3, 3)]


def test_split_returns_views() -> None:
    out = rows(3)
    parts = split_outputs({"OUT_A": out}, [1, 2])
    for p in parts:
        assert not p["OUT_A"].flags.owndata
        assert np.shares_memory(p["OUT_A"], out)


def test_split_single_request_returns_outputs_unchanged() -> None:
    out = rows(4)
    outputs = {"OUT_A": out}
    parts = split_outputs(outputs, [4])
    assert parts == [outputs]
    assert parts[0]["OUT_A"] is out


def test_merge_then_split_round_trips() -> None:
    datas = [rows(2, start=0), rows(1, start=10), rows(3, start=20)]
    merged = merge_inputs([request(tensor("X", d)) for d in datas])
    parts = split_outputs({"OUT_A": merged["X"] * 2}, [2, 1, 3])
    for d, p in zip(datas, parts, strict=True):
        np.testing.assert_array_equal(p["OUT_A"], d * 2)
