"""ImplicitState: initial states (zeros, zero_data, data_file under <model>/initial_state/) and per-slot values."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from google.protobuf import text_format

from serve_app.errors import InvalidConfig
from serve_app.protos import model_config_pb2 as mc
from serve_app.sequence.implicit_state import ImplicitState


def config(states: str) -> mc.ModelConfig:
    return text_format.Parse(f'name: "acc" max_batch_size: 4 sequence_batching {{ {states} }}', mc.ModelConfig())


def state(data_type: str = "TYPE_INT32", dims: str = "[ -1 ]", initial: str = "", name: str = "", out: str = "") -> str:
    name = name or "INPUT_STATE"
    out = out or name.replace("INPUT", "OUTPUT")
    init = f'initial_state: {{ {initial} name: "init" }}' if initial else ""
    return f'state [ {{ input_name: "{name}" output_name: "{out}" data_type: {data_type} dims: {dims} {init} }} ]'


def implicit(states: str, model_dir: pathlib.Path | None = None) -> ImplicitState:
    return ImplicitState(config(states), model_dir or pathlib.Path("/nonexistent"))


def test_no_state() -> None:
    s = implicit("")
    assert not s and s.specs == () and s.output_names == ()
    assert s.row_states(0, start=False) == {}


@pytest.mark.parametrize(
    ("data_type", "dims", "shape", "dtype"),
    [
        ("TYPE_INT32", "[ -1 ]", (1,), np.int32),
        ("TYPE_FP32", "[ 3, -1 ]", (3, 1), np.float32),
        ("TYPE_INT64", "[ 2, 2 ]", (2, 2), np.int64),
        ("TYPE_FP16", "[ -1, -1, 4 ]", (1, 1, 4), np.float16),
        ("TYPE_BOOL", "[ 2 ]", (2,), np.bool_),
    ],
)
def test_default_initial_state_is_zeros_with_variable_dims_one(
    data_type: str, dims: str, shape: tuple[int, ...], dtype: type
) -> None:
    s = implicit(state(data_type, dims))
    assert bool(s)
    (spec,) = s.specs
    assert (spec.input_name, spec.output_name) == ("INPUT_STATE", "OUTPUT_STATE")
    assert spec.initial.shape == shape and spec.initial.dtype == dtype
    assert not spec.initial.any()


def test_zero_data_uses_its_own_dims() -> None:
    s = implicit(state("TYPE_FP32", "[ -1, 3 ]", "data_type: TYPE_FP32 dims: [ 2, 3 ] zero_data: true"))
    (spec,) = s.specs
    assert spec.initial.shape == (2, 3) and spec.initial.dtype == np.float32 and not spec.initial.any()


def test_initial_dims_must_be_fixed() -> None:
    with pytest.raises(
        InvalidConfig, match="'initial_state' field for state input name 'INPUT_STATE' contains variable"
    ):
        implicit(state("TYPE_INT32", "[ -1 ]", "data_type: TYPE_INT32 dims: [ -1 ] zero_data: true"))


@pytest.mark.parametrize(
    ("states", "message"),
    [
        (
            state("TYPE_INT32", "[ 1 ]", "data_type: TYPE_FP32 dims: [ 1 ] zero_data: true"),
            "The data type used for 'initial_state' field of state 'INPUT_STATE' does not match the state data type.",
        ),
        (
            state("TYPE_INT32", "[ -1 ]", "data_type: TYPE_INT32 dims: [ 2, 3 ] zero_data: true"),
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input "
            "'INPUT_STATE'. 2 != 1",
        ),
        (
            state("TYPE_INT32", "[ 4 ]", "data_type: TYPE_INT32 dims: [ 3 ] zero_data: true"),
            "'initial_state' dim for input name 'INPUT_STATE' doesn't match 'state' dim description. 3 != 4",
        ),
        (
            'state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] '
            "initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ]",
            "Field 'name' must be set when using initial_state for state input 'INPUT_STATE'.",
        ),
        (
            'state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] '
            'initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "a" } '
            'initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "b" } } ]',
            "initial_state field for state input 'INPUT_STATE' must contain exactly one or zero element. "
            "Found '2' elements.",
        ),
    ],
)
def test_initial_state_checked_as_triton_does(states: str, message: str) -> None:
    with pytest.raises(InvalidConfig) as exc:
        implicit(states)
    assert exc.value.message == f"model 'acc': sequence_batching.state[0].initial_state: {message}"


@pytest.mark.parametrize("initial", ["", "data_type: TYPE_STRING dims: [ 2, 1 ] zero_data: true"])
def test_string_state_starts_as_empty_strings(initial: str) -> None:
    """Triton zeroes a string state's element lengths: every element is an empty string."""
    (spec,) = implicit(state("TYPE_STRING", "[ 2, -1 ]", initial)).specs
    assert spec.initial.shape == (2, 1) and spec.initial.dtype == np.object_
    assert spec.initial.ravel().tolist() == [b"", b""]


def serialized(*items: bytes) -> bytes:
    """BYTES elements as Triton serializes them: a 4-byte little-endian length before each."""
    return b"".join(len(i).to_bytes(4, "little") + i for i in items)


def test_string_state_from_data_file(tmp_path: pathlib.Path) -> None:
    write_initial(tmp_path, "greeting", serialized(b"hello", b"", "wörld".encode()))
    initial = 'data_type: TYPE_STRING dims: [ 3 ] data_file: "greeting"'
    (spec,) = implicit(state("TYPE_STRING", "[ -1 ]", initial), tmp_path).specs
    assert spec.initial.ravel().tolist() == [b"hello", b"", "wörld".encode()]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (serialized(b"a", b"b"), "holds 2 string element(s), 3 expected"),
        (serialized(b"a", b"b", b"c") + b"\x01", "ends inside the length of string element 3"),
        (serialized(b"a", b"b") + (9).to_bytes(4, "little") + b"x", "string element 2 needs 9 bytes"),
    ],
)
def test_string_data_file_must_hold_the_declared_elements(tmp_path: pathlib.Path, data: bytes, fragment: str) -> None:
    write_initial(tmp_path, "bad", data)
    with pytest.raises(InvalidConfig) as exc:
        implicit(state("TYPE_STRING", "[ 3 ]", 'data_type: TYPE_STRING dims: [ 3 ] data_file: "bad"'), tmp_path)
    message = exc.value.message
    assert "'acc'" in message and "sequence_batching.state[0].initial_state[0].data_file 'bad'" in message
    assert fragment in message


def write_initial(model_dir: pathlib.Path, name: str, data: bytes) -> None:
    (model_dir / "initial_state").mkdir(parents=True, exist_ok=True)
    (model_dir / "initial_state" / name).write_bytes(data)


def test_data_file_read_row_major(tmp_path: pathlib.Path) -> None:
    values = np.arange(6, dtype=np.int32).reshape(2, 3)
    write_initial(tmp_path, "init.bin", values.tobytes())
    s = implicit(
        state("TYPE_INT32", "[ -1, -1 ]", 'data_type: TYPE_INT32 dims: [ 2, 3 ] data_file: "init.bin"'), tmp_path
    )
    (spec,) = s.specs
    np.testing.assert_array_equal(spec.initial, values)
    assert spec.initial.dtype == np.int32 and spec.initial.flags.writeable


def test_data_file_in_a_subdirectory(tmp_path: pathlib.Path) -> None:
    (tmp_path / "initial_state" / "sub").mkdir(parents=True)
    (tmp_path / "initial_state" / "sub" / "x.bin").write_bytes(np.array([1.5, -2.0], dtype=np.float32).tobytes())
    s = implicit(state("TYPE_FP32", "[ 2 ]", 'data_type: TYPE_FP32 dims: [ 2 ] data_file: "sub/x.bin"'), tmp_path)
    assert s.specs[0].initial.tolist() == [1.5, -2.0]


@pytest.mark.parametrize("size", [0, 8])
def test_data_file_too_short_rejected(tmp_path: pathlib.Path, size: int) -> None:
    write_initial(tmp_path, "init.bin", b"\0" * size)
    with pytest.raises(InvalidConfig) as exc:
        implicit(state("TYPE_INT32", "[ 3 ]", 'data_type: TYPE_INT32 dims: [ 3 ] data_file: "init.bin"'), tmp_path)
    msg = exc.value.message
    assert "'acc'" in msg
    assert f"initial_state setting expects 12 bytes, but the data provided from init.bin only has {size} bytes." in msg


def test_a_longer_data_file_gives_its_first_bytes(tmp_path: pathlib.Path) -> None:
    """As Triton reads it: the state's bytes from the start of the file, the rest ignored."""
    write_initial(tmp_path, "init.bin", np.arange(5, dtype=np.int32).tobytes())
    s = implicit(state("TYPE_INT32", "[ 3 ]", 'data_type: TYPE_INT32 dims: [ 3 ] data_file: "init.bin"'), tmp_path)
    assert s.specs[0].initial.tolist() == [0, 1, 2]


def test_data_file_missing(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidConfig, match="cannot read"):
        implicit(state("TYPE_INT32", "[ 1 ]", 'data_type: TYPE_INT32 dims: [ 1 ] data_file: "missing"'), tmp_path)


@pytest.mark.parametrize("path", ["../config.pbtxt", "../../secret", "sub/../../x", "/etc/passwd"])
def test_data_file_outside_initial_state_rejected(tmp_path: pathlib.Path, path: str) -> None:
    model_dir = tmp_path / "model"
    write_initial(model_dir, "ok", b"\0" * 4)
    (model_dir / "config.pbtxt").write_bytes(b"\0" * 4)  # exists and has the right size: still refused
    (tmp_path / "secret").write_bytes(b"\0" * 4)
    with pytest.raises(InvalidConfig) as exc:
        implicit(state("TYPE_INT32", "[ 1 ]", f'data_type: TYPE_INT32 dims: [ 1 ] data_file: "{path}"'), model_dir)
    msg = exc.value.message
    assert path in msg and ("must not contain '..'" in msg or "must be a path relative to" in msg), msg


def test_several_states() -> None:
    s = implicit(
        'state [ { input_name: "A_IN" output_name: "A_OUT" data_type: TYPE_INT32 dims: [ 1 ] },'
        ' { input_name: "B_IN" output_name: "B_OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]'
    )
    assert [sp.input_name for sp in s.specs] == ["A_IN", "B_IN"]
    assert s.output_names == ("A_OUT", "B_OUT")
    rows = s.row_states(0, start=True)
    assert list(rows) == ["A_IN", "B_IN"] and rows["B_IN"].shape == (2,)


def test_row_states_store_and_drop_batched() -> None:
    s = implicit(state("TYPE_INT32", "[ 2 ]"))
    initial = s.specs[0].initial
    assert s.row_states(3, start=False)["INPUT_STATE"] is initial  # nothing stored yet: the initial state
    outputs = {"OUTPUT_STATE": np.array([[1, 2], [3, 4], [5, 6]], dtype=np.int32), "OTHER": np.zeros(3)}
    s.store(3, outputs, row=1)
    s.store(0, outputs, row=2)
    assert s.row_states(3, start=False)["INPUT_STATE"].tolist() == [3, 4]
    assert s.row_states(0, start=False)["INPUT_STATE"].tolist() == [5, 6]
    assert s.row_states(3, start=True)["INPUT_STATE"] is initial  # START: the initial state again
    assert s.row_states(None, start=False)["INPUT_STATE"] is initial  # an empty row
    s.drop(3)
    s.drop(3)  # dropping twice is harmless
    assert s.row_states(3, start=False)["INPUT_STATE"] is initial
    assert s.row_states(0, start=False)["INPUT_STATE"].tolist() == [5, 6]


def test_store_unbatched_keeps_the_whole_output() -> None:
    s = implicit(state("TYPE_FP32", "[ 3 ]"))
    s.store(0, {"OUTPUT_STATE": np.array([1.0, 2.0, 3.0], dtype=np.float32)}, row=None)
    assert s.row_states(0, start=False)["INPUT_STATE"].tolist() == [1.0, 2.0, 3.0]


def test_stored_state_can_change_shape() -> None:
    # With variable dims the output state need not match the input state's shape.
    s = implicit(state("TYPE_INT32", "[ -1 ]"))
    s.store(0, {"OUTPUT_STATE": np.array([[7, 8, 9]], dtype=np.int32)}, row=0)
    assert s.row_states(0, start=False)["INPUT_STATE"].shape == (3,)
    assert s.row_states(1, start=False)["INPUT_STATE"].shape == (1,)
