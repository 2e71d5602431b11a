"""SequenceControls: the START / END / READY / CORRID tensors the sequence batcher feeds a model, per batch row."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from serve_app.errors import InvalidArgument
from serve_app.protos import model_config_pb2 as mc
from serve_app.sequence.controls import RowControl, SequenceControls


def controls(control_inputs: str, max_batch_size: int = 4) -> SequenceControls:
    text = f"""
        name: "seq"
        max_batch_size: {max_batch_size}
        sequence_batching {{ control_input [ {control_inputs} ] }}
    """
    return SequenceControls.from_model_config(text_format.Parse(text, mc.ModelConfig()))


def bool_control(name: str, kind: str, values: str) -> str:
    return f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} {values} }} ] }}'


def corrid_control(data_type: str, name: str = "CORRID") -> str:
    return f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {data_type} }} ] }}'


ALL_INT32 = ", ".join(
    bool_control(n, n, "int32_false_true: [ 0, 1 ]") for n in ("START", "END", "READY")
) + ", " + corrid_control("TYPE_UINT64")  # fmt: skip

# A START row, a middle row, an END row, a START+END row, and an empty row (no request in that slot).
ROWS = [
    RowControl(start=True, end=False, ready=True, corr_id=11),
    RowControl(start=False, end=False, ready=True, corr_id=12),
    RowControl(start=False, end=True, ready=True, corr_id=13),
    RowControl(start=True, end=True, ready=True, corr_id=14),
    RowControl(),
]


def test_names_in_config_order_with_corrid_last() -> None:
    c = controls(corrid_control("TYPE_UINT64", "ID") + ", " + bool_control("S", "START", "int32_false_true: [0, 1]"))
    assert c.names == ("S", "ID")
    assert controls("").names == ()
    assert controls("").tensors([RowControl(ready=True, corr_id=1)], batched=True) == {}


def test_int32_controls_per_row() -> None:
    t = controls(ALL_INT32).tensors(ROWS, batched=True)
    assert set(t) == {"START", "END", "READY", "CORRID"}
    for name in ("START", "END", "READY"):
        assert t[name].dtype == np.int32 and t[name].shape == (5, 1)
    assert t["START"].ravel().tolist() == [1, 0, 0, 1, 0]
    assert t["END"].ravel().tolist() == [0, 0, 1, 1, 0]
    assert t["READY"].ravel().tolist() == [1, 1, 1, 1, 0]
    assert t["CORRID"].dtype == np.uint64 and t["CORRID"].shape == (5, 1)
    assert t["CORRID"].ravel().tolist() == [11, 12, 13, 14, 0]


def test_configured_false_and_true_values() -> None:
    c = controls(
        ", ".join(
            [
                bool_control("S", "START", "int32_false_true: [ 7, -3 ]"),
                bool_control("E", "END", "fp32_false_true: [ 0.5, 2.5 ]"),
                bool_control("R", "READY", "bool_false_true: [ false, true ]"),
            ]
        )
    )
    t = c.tensors(ROWS, batched=True)
    assert t["S"].dtype == np.int32 and t["S"].ravel().tolist() == [-3, 7, 7, -3, 7]
    assert t["E"].dtype == np.float32 and t["E"].ravel().tolist() == [0.5, 0.5, 2.5, 2.5, 0.5]
    assert t["R"].dtype == np.bool_ and t["R"].ravel().tolist() == [True, True, True, True, False]


def test_inverted_bool_values() -> None:
    c = controls(bool_control("R", "READY", "bool_false_true: [ true, false ]"))
    assert c.tensors(ROWS, batched=True)["R"].ravel().tolist() == [False, False, False, False, True]


def test_empty_rows_are_all_false_even_with_stray_flags() -> None:
    # A row that is not ready carries no request: START and END are false whatever the row says, CORRID 0.
    stray = RowControl(start=True, end=True, ready=False, corr_id=99)
    t = controls(ALL_INT32).tensors([stray], batched=True)
    assert {k: v.ravel().tolist() for k, v in t.items()} == {"START": [0], "END": [0], "READY": [0], "CORRID": [0]}


def test_unbatched_shape_is_one_element() -> None:
    t = controls(ALL_INT32, max_batch_size=0).tensors([RowControl(True, False, True, 5)], batched=False)
    assert {k: v.shape for k, v in t.items()} == {"START": (1,), "END": (1,), "READY": (1,), "CORRID": (1,)}
    assert t["START"].tolist() == [1] and t["CORRID"].tolist() == [5]


def test_batched_single_row_shape() -> None:
    t = controls(ALL_INT32).tensors([RowControl(False, True, True, 5)], batched=True)
    assert all(v.shape == (1, 1) for v in t.values())


@pytest.mark.parametrize(
    ("data_type", "dtype", "corr", "expected"),
    [
        ("TYPE_UINT64", np.uint64, 2**64 - 1, 2**64 - 1),
        ("TYPE_UINT64", np.uint64, 2**32 + 5, 2**32 + 5),
        ("TYPE_INT64", np.int64, 2**32 + 5, 2**32 + 5),
        ("TYPE_INT64", np.int64, 2**63, -(2**63)),
        ("TYPE_INT64", np.int64, 2**64 - 1, -1),
        ("TYPE_UINT32", np.uint32, 2**32 + 5, 5),
        ("TYPE_UINT32", np.uint32, 2**32 - 1, 2**32 - 1),
        ("TYPE_INT32", np.int32, 2**32 + 5, 5),
        ("TYPE_INT32", np.int32, 2**31, -(2**31)),
        ("TYPE_INT32", np.int32, 2**32 - 1, -1),
        ("TYPE_INT32", np.int32, 2**64 - 1, -1),
    ],
)
def test_numeric_corrid_keeps_the_low_bits(data_type: str, dtype: type, corr: int, expected: int) -> None:
    c = controls(corrid_control(data_type))
    t = c.tensors([RowControl(ready=True, corr_id=corr), RowControl()], batched=True)["CORRID"]
    assert t.dtype == dtype and t.shape == (2, 1)
    assert t.ravel().tolist() == [expected, 0]


def test_string_corrid() -> None:
    c = controls(corrid_control("TYPE_STRING"))
    rows = [RowControl(ready=True, corr_id="abc"), RowControl(ready=True, corr_id=17), RowControl()]
    t = c.tensors(rows, batched=True)["CORRID"]
    assert t.dtype == np.object_ and t.shape == (3, 1)
    assert t.ravel().tolist() == [b"abc", b"17", b""]
    unbatched = c.tensors([RowControl(ready=True, corr_id="x")], batched=False)["CORRID"]
    assert unbatched.shape == (1,) and unbatched.tolist() == [b"x"]


@pytest.mark.parametrize("data_type", ["TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32"])
def test_check_corr_id_rejects_strings_for_numeric_corrid(data_type: str) -> None:
    c = controls(corrid_control(data_type))
    with pytest.raises(InvalidArgument) as exc:
        c.check_corr_id("abc")
    assert "'CORRID'" in exc.value.message and "'seq'" in exc.value.message
    assert data_type in exc.value.message and "'abc'" in exc.value.message
    c.check_corr_id(12)  # integers are fine


def test_check_corr_id_accepts_anything_otherwise() -> None:
    controls(corrid_control("TYPE_STRING")).check_corr_id("abc")
    controls(corrid_control("TYPE_STRING")).check_corr_id(3)
    controls(bool_control("S", "START", "int32_false_true: [0, 1]")).check_corr_id("abc")  # no CORRID control
    controls("").check_corr_id("abc")
