"""Model warmup (serve_app/runtime/warmup.py): samples built from ``model_warmup`` (zero, random and file
data, every datatype incl. BYTES, batch_size, count), run through ModelInstance.run on small ONNX models
built with onnx.helper (real onnxruntime), their errors (bad file, short file, variable dims, wrong type,
backend failure) naming the sample, and the input_data_file path checks (no way out of ``warmup/``).
Also ModelReplica (no Ray needed to construct one): a failing warmup makes the replica report the reason."""

from __future__ import annotations

import asyncio
import os
import pathlib
import struct

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper

from serve_app.backends import Backend, BackendContext
from serve_app.backends.onnxruntime import OnnxRuntimeBackend
from serve_app.errors import ErrorCode, InvalidArgument
from serve_app.inference.execution import Execution
from serve_app.protos import model_config_pb2 as mc
from serve_app.runtime import ModelInstance
from serve_app.runtime.warmup import (
    WarmupError,
    build_sample,
    build_samples,
    parse_strings,
    run_samples,
    warmup_file,
)

# wire name -> (ONNX element type, config type); every type ONNX Identity runs in onnxruntime.
TYPES: dict[str, tuple[int, str]] = {
    "BOOL": (TensorProto.BOOL, "TYPE_BOOL"),
    "UINT8": (TensorProto.UINT8, "TYPE_UINT8"),
    "UINT16": (TensorProto.UINT16, "TYPE_UINT16"),
    "UINT32": (TensorProto.UINT32, "TYPE_UINT32"),
    "UINT64": (TensorProto.UINT64, "TYPE_UINT64"),
    "INT8": (TensorProto.INT8, "TYPE_INT8"),
    "INT16": (TensorProto.INT16, "TYPE_INT16"),
    "INT32": (TensorProto.INT32, "TYPE_INT32"),
    "INT64": (TensorProto.INT64, "TYPE_INT64"),
    "FP16": (TensorProto.FLOAT16, "TYPE_FP16"),
    "FP32": (TensorProto.FLOAT, "TYPE_FP32"),
    "FP64": (TensorProto.DOUBLE, "TYPE_FP64"),
    "BYTES": (TensorProto.STRING, "TYPE_STRING"),
}
NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


def write_model(
    root: pathlib.Path,
    warmup: str,
    *,
    name: str = "m",
    types: tuple[str, ...] = tuple(TYPES),
    max_batch_size: int = 8,
    controls: tuple[str, ...] = (),
    extra: str = "",
) -> tuple[pathlib.Path, mc.ModelConfig]:
    """Identity IN_<T> -> OUT_<T> ([-1] each) for ``types``; ``controls`` are extra INT32 [1] graph inputs
    (a sequence model's control tensors, not in the config's ``input``) summed into OUT_CTL."""
    lead = ["batch"] if max_batch_size > 0 else []
    inputs, outputs, nodes, cfg_in, cfg_out = [], [], [], [], []
    for wire in types:
        et, ct = TYPES[wire]
        inputs.append(helper.make_tensor_value_info(f"IN_{wire}", et, [*lead, "n"]))
        outputs.append(helper.make_tensor_value_info(f"OUT_{wire}", et, [*lead, "n"]))
        nodes.append(helper.make_node("Identity", [f"IN_{wire}"], [f"OUT_{wire}"]))
        cfg_in.append(f'{{ name: "IN_{wire}" data_type: {ct} dims: [ -1 ] }}')
        cfg_out.append(f'{{ name: "OUT_{wire}" data_type: {ct} dims: [ -1 ] }}')
    if controls:
        for c in controls:
            inputs.append(helper.make_tensor_value_info(c, TensorProto.INT32, [*lead, 1]))
        acc = controls[0]
        for i, c in enumerate(controls[1:]):
            nodes.append(helper.make_node("Add", [acc, c], [f"acc{i}"]))
            acc = f"acc{i}"
        nodes.append(helper.make_node("Identity", [acc], ["OUT_CTL"]))
        outputs.append(helper.make_tensor_value_info("OUT_CTL", TensorProto.INT32, [*lead, 1]))
        cfg_out.append('{ name: "OUT_CTL" data_type: TYPE_INT32 dims: [ 1 ] }')
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    d = root / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(d / "1" / "model.onnx"))
    text = (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nbackend: "onnxruntime"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {', '.join(cfg_in)} ]\noutput [ {', '.join(cfg_out)} ]\n{extra}\n{warmup}"
    )
    (d / "config.pbtxt").write_text(text)
    return d, text_format.Parse(text, mc.ModelConfig())


def sample(name: str, inputs: dict[str, str], *, batch_size: int = 1, count: int = 0) -> str:
    """One model_warmup entry; ``inputs`` maps a name to its Input body (data_type, dims, data)."""
    body = " ".join(f'inputs {{ key: "{k}" value: {{ {v} }} }}' for k, v in inputs.items())
    return f'model_warmup {{ name: "{name}" batch_size: {batch_size} count: {count} {body} }}\n'


class Recording(Backend):
    """The real onnxruntime backend, recording every feed it executes."""

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        self.inner = OnnxRuntimeBackend(ctx)
        self.feeds: list[dict[str, np.ndarray]] = []
        self.produced: list[dict[str, np.ndarray]] = []

    def execute(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        self.feeds.append({k: v.copy() for k, v in inputs.items()})
        out = self.inner.execute(inputs, output_names)
        self.produced.append(out)
        return out


def instance(model_dir: pathlib.Path, config: mc.ModelConfig) -> tuple[ModelInstance, Recording]:
    ctx = BackendContext(model_name=config.name, version=1, config=config, model_file=model_dir / "1" / "model.onnx")
    backend = Recording(ctx)
    return ModelInstance(ctx, backend=backend), backend


def warm(model_dir: pathlib.Path, config: mc.ModelConfig) -> tuple[Recording, object]:
    inst, backend = instance(model_dir, config)
    report = inst.warm_up()
    return backend, report


def put_file(model_dir: pathlib.Path, name: str, data: bytes) -> pathlib.Path:
    path = model_dir / "warmup" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def serialize(strings: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(s)) + s for s in strings)


# ---------------------------------------------------------------------------------------------- data


def test_zero_data_every_datatype(tmp_path: pathlib.Path) -> None:
    inputs = {f"IN_{w}": f"data_type: {ct} dims: [ 3 ] zero_data: true" for w, (_, ct) in TYPES.items()}
    d, cfg = write_model(tmp_path, sample("zeros", inputs, batch_size=2))
    backend, report = warm(d, cfg)
    assert len(backend.feeds) == 1 and report.executions == 1 and report.samples == ["zeros"]
    (feed,) = backend.feeds
    for wire, dtype in NUMPY.items():
        arr = feed[f"IN_{wire}"]
        assert arr.shape == (2, 3) and arr.dtype == np.dtype(dtype)
        assert not arr.any()
    strings = feed["IN_BYTES"]
    assert strings.shape == (2, 3) and strings.dtype == object
    assert list(strings.ravel()) == [b""] * 6  # Triton's zero data for TYPE_STRING: empty strings
    assert list(backend.produced[0]["OUT_BYTES"].ravel()) == [b""] * 6


def test_random_data_every_datatype(tmp_path: pathlib.Path) -> None:
    inputs = {f"IN_{w}": f"data_type: {ct} dims: [ 5 ] random_data: true" for w, (_, ct) in TYPES.items()}
    d, cfg = write_model(tmp_path, sample("random", inputs, batch_size=3))
    inst, backend = instance(d, cfg)
    samples, _ = build_samples(cfg, d, rng=np.random.default_rng(7))
    report = run_samples(inst.run, samples, inst.signature.name)
    assert report.executions == 1 and report.inferences == 3
    (feed,) = backend.feeds
    for wire, dtype in NUMPY.items():
        arr = feed[f"IN_{wire}"]
        assert arr.shape == (3, 5) and arr.dtype == np.dtype(dtype)
        assert (arr[0] == arr[1]).all() or wire.startswith("FP")  # rows repeat the sample (NaN != NaN)
        assert arr[0].tobytes() == arr[2].tobytes()
    assert feed["IN_UINT64"].any()  # random bytes, not zeros
    # Triton: random_data for TYPE_STRING falls back to zero data (empty strings)
    assert list(feed["IN_BYTES"].ravel()) == [b""] * 15


def test_random_inputs_share_one_buffer(tmp_path: pathlib.Path) -> None:
    """As in Triton, one random buffer per sample: each input reads its prefix."""
    inputs = {
        "IN_UINT8": "data_type: TYPE_UINT8 dims: [ 8 ] random_data: true",
        "IN_UINT16": "data_type: TYPE_UINT16 dims: [ 4 ] random_data: true",
    }
    _, cfg = write_model(tmp_path, sample("r", inputs), types=("UINT8", "UINT16"))
    s = build_sample(cfg, cfg.model_warmup[0], tmp_path / "m", rng=np.random.default_rng(1))
    assert s.execution.inputs["IN_UINT8"][0].tobytes() == s.execution.inputs["IN_UINT16"][0].tobytes()


@pytest.mark.parametrize("wire", list(NUMPY))
def test_file_data_every_datatype(tmp_path: pathlib.Path, wire: str) -> None:
    dtype = np.dtype(NUMPY[wire])
    values = (np.arange(4) % 2).astype(dtype) if wire == "BOOL" else (np.arange(4) + 1).astype(dtype)
    ct = TYPES[wire][1]
    d, cfg = write_model(
        tmp_path,
        sample("file", {f"IN_{wire}": f'data_type: {ct} dims: [ 4 ] input_data_file: "raw.bin"'}, batch_size=2),
        types=(wire,),
    )
    put_file(d, "raw.bin", values.astype(dtype.newbyteorder("<")).tobytes())
    backend, _ = warm(d, cfg)
    arr = backend.feeds[0][f"IN_{wire}"]
    assert arr.dtype == dtype and arr.shape == (2, 4)
    np.testing.assert_array_equal(arr, np.stack([values, values]))


def test_file_longer_than_needed_uses_its_start(tmp_path: pathlib.Path) -> None:
    """Triton reads the tensor's byte size from the start of a longer file."""
    d, cfg = write_model(
        tmp_path,
        sample("long", {"IN_FP32": 'data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "f"'}),
        types=("FP32",),
    )
    put_file(d, "f", np.array([1.5, 2.5, 9.0, 9.0], "<f4").tobytes())
    backend, _ = warm(d, cfg)
    np.testing.assert_array_equal(backend.feeds[0]["IN_FP32"], [[1.5, 2.5]])


def test_file_strings(tmp_path: pathlib.Path) -> None:
    """TYPE_STRING from a file: Triton's serialization (4-byte little-endian length, then the bytes)."""
    d, cfg = write_model(
        tmp_path,
        sample("str", {"IN_BYTES": 'data_type: TYPE_STRING dims: [ 3 ] input_data_file: "s"'}, batch_size=2),
        types=("BYTES",),
    )
    put_file(d, "s", serialize([b"233", b"", "héllo".encode()]))
    backend, _ = warm(d, cfg)
    expected = [b"233", b"", "héllo".encode()] * 2
    assert list(backend.feeds[0]["IN_BYTES"].ravel()) == expected
    assert list(backend.produced[0]["OUT_BYTES"].ravel()) == expected


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (serialize([b"a", b"b"]), "holds 2 string element(s), 3 expected"),
        (serialize([b"a", b"b", b"c", b"d"]), "holds 4 string element(s), 3 expected"),
        (serialize([b"a", b"b"]) + b"\x05\x00", "ends inside the length of string element 2"),
        (serialize([b"a", b"b"]) + b"\x05\x00\x00\x00ab", "string element 2 needs 5 bytes, only 2 are left"),
    ],
)
def test_bad_string_file(tmp_path: pathlib.Path, data: bytes, message: str) -> None:
    d, cfg = write_model(
        tmp_path,
        sample("str", {"IN_BYTES": 'data_type: TYPE_STRING dims: [ 3 ] input_data_file: "s"'}),
        types=("BYTES",),
    )
    put_file(d, "s", data)
    with pytest.raises(WarmupError) as err:
        warm(d, cfg)
    assert err.value.message.startswith("model 'm': warmup sample 'str': input_data_file 's'")
    assert message in err.value.message


def test_parse_strings() -> None:
    arr = parse_strings(serialize([b"x", b"yz"]), 2, "f")
    assert arr.dtype == object and list(arr) == [b"x", b"yz"]
    assert list(parse_strings(b"", 0, "f")) == []


def test_short_file_fails_naming_sample_and_sizes(tmp_path: pathlib.Path) -> None:
    d, cfg = write_model(
        tmp_path,
        sample("short one", {"IN_FP32": 'data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "f"'}),
        types=("FP32",),
    )
    put_file(d, "f", b"\x00" * 10)
    with pytest.raises(WarmupError) as err:
        warm(d, cfg)
    assert err.value.message == (
        "model 'm': warmup sample 'short one': input 'IN_FP32' expects 64 bytes, "
        "but the data provided from input_data_file 'f' only has 10 bytes"
    )
    assert err.value.code is ErrorCode.INVALID_ARG


# ------------------------------------------------------------------------------ batch_size, count, order


def test_batch_size_repeats_the_sample(tmp_path: pathlib.Path) -> None:
    d, cfg = write_model(
        tmp_path,
        sample("b4", {"IN_INT32": 'data_type: TYPE_INT32 dims: [ 2 ] input_data_file: "f"'}, batch_size=4),
        types=("INT32",),
    )
    put_file(d, "f", np.array([7, 8], "<i4").tobytes())
    inst, backend = instance(d, cfg)
    report = inst.warm_up()
    np.testing.assert_array_equal(backend.feeds[0]["IN_INT32"], [[7, 8]] * 4)
    assert report.inferences == 4 and report.results[0].outputs["OUT_INT32"].shape == (4, 2)
    assert inst.warmup_report is report


def test_model_without_batching(tmp_path: pathlib.Path) -> None:
    """max_batch_size 0: the tensors are ``dims`` as given, no batch dimension; batch_size must be 1."""
    d, cfg = write_model(
        tmp_path,
        sample("flat", {"IN_FP32": "data_type: TYPE_FP32 dims: [ 3 ] zero_data: true"}),
        types=("FP32",),
        max_batch_size=0,
    )
    backend, report = warm(d, cfg)
    assert backend.feeds[0]["IN_FP32"].shape == (3,)
    assert report.inferences == 1
    cfg.model_warmup[0].batch_size = 2
    with pytest.raises(WarmupError, match="warmup sample 'flat': batch_size must be 1 for a model that does not"):
        build_samples(cfg, d)


def test_count_runs_the_sample_that_many_times_and_zero_means_once(tmp_path: pathlib.Path) -> None:
    zero = "data_type: TYPE_FP32 dims: [ 1 ] zero_data: true"
    warmup = sample("thrice", {"IN_FP32": zero}, count=3) + sample("default", {"IN_FP32": zero}, count=0)
    d, cfg = write_model(tmp_path, warmup, types=("FP32",))
    backend, report = warm(d, cfg)
    assert len(backend.feeds) == 4 and report.executions == 4
    assert report.samples == ["thrice", "default"]


def test_samples_run_in_order_and_batch_size_zero_is_skipped(tmp_path: pathlib.Path) -> None:
    warmup = (
        sample("first", {"IN_INT32": "data_type: TYPE_INT32 dims: [ 1 ] zero_data: true"}, batch_size=1)
        + sample("skipped", {"IN_INT32": "data_type: TYPE_INT32 dims: [ 1 ] zero_data: true"}, batch_size=0)
        + sample("second", {"IN_INT32": "data_type: TYPE_INT32 dims: [ 2 ] zero_data: true"}, batch_size=2)
    )
    d, cfg = write_model(tmp_path, warmup, types=("INT32",))
    backend, report = warm(d, cfg)
    assert [f["IN_INT32"].shape for f in backend.feeds] == [(1, 1), (2, 2)]
    assert report.samples == ["first", "second"] and report.skipped == ["skipped"]
    assert "2 sample(s), 2 execution(s)" in report.describe("m", 1)
    assert "skipped with batch_size 0: 'skipped'" in report.describe("m", 1)


def test_no_warmup_runs_nothing(tmp_path: pathlib.Path) -> None:
    d, cfg = write_model(tmp_path, "", types=("FP32",))
    backend, report = warm(d, cfg)
    assert backend.feeds == [] and report.samples == [] and report.executions == 0


def test_reshape_applies_to_warmup_inputs(tmp_path: pathlib.Path) -> None:
    """Warmup dims are the request's dims; the instance reshapes them as for any request."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["IN"], ["OUT"])],
        "r",
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["batch", 2, 2])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["batch", 2, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    d = tmp_path / "r"
    (d / "1").mkdir(parents=True)
    onnx.save(model, str(d / "1" / "model.onnx"))
    cfg = text_format.Parse(
        'name: "r" backend: "onnxruntime" max_batch_size: 4 '
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ] '
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ] '
        + sample("rs", {"IN": "data_type: TYPE_FP32 dims: [ 4 ] random_data: true"}, batch_size=2),
        mc.ModelConfig(),
    )
    backend, report = warm(d, cfg)
    assert backend.feeds[0]["IN"].shape == (2, 2, 2)
    assert report.results[0].outputs["OUT"].shape == (2, 4)


# ------------------------------------------------------------------------------------- sequence models


SEQUENCE = """sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}"""


def test_sequence_model_takes_the_control_tensors_the_sample_lists(tmp_path: pathlib.Path) -> None:
    """Like Triton's L0_warmup: the sample lists the control tensors (Triton generates none for warmup);
    they are fed as given, with the batch dimension."""
    warmup = sample(
        "sequence sample",
        {
            "IN_INT32": "data_type: TYPE_INT32 dims: [ 1 ] zero_data: true",
            "START": 'data_type: TYPE_INT32 dims: [ 1 ] input_data_file: "one"',
            "READY": 'data_type: TYPE_INT32 dims: [ 1 ] input_data_file: "one"',
        },
        batch_size=8,
    )
    d, cfg = write_model(tmp_path, warmup, types=("INT32",), controls=("START", "READY"), extra=SEQUENCE)
    put_file(d, "one", np.array([1], "<i4").tobytes())
    backend, report = warm(d, cfg)
    assert backend.feeds[0]["START"].shape == (8, 1)
    np.testing.assert_array_equal(report.results[0].outputs["OUT_CTL"], np.full((8, 1), 2, np.int32))


def test_sequence_model_without_its_control_tensors_fails_like_the_backend(tmp_path: pathlib.Path) -> None:
    warmup = sample("no controls", {"IN_INT32": "data_type: TYPE_INT32 dims: [ 1 ] zero_data: true"})
    d, cfg = write_model(tmp_path, warmup, types=("INT32",), controls=("START", "READY"), extra=SEQUENCE)
    with pytest.raises(WarmupError, match=r"^model 'm': failed to run warmup sample 'no controls': onnxruntime"):
        warm(d, cfg)


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("data_type: TYPE_FP32 dims: [ -1 ] zero_data: true", "all variable-size dimensions must be specified"),
        ("data_type: TYPE_FP32 dims: [ 2 ]", "input 'IN_FP32' must set one of 'zero_data', 'random_data'"),
        (
            "data_type: TYPE_INT32 dims: [ 2 ] zero_data: true",
            "input 'IN_FP32' has data type TYPE_INT32, the model's input is TYPE_FP32",
        ),
        (
            "data_type: TYPE_FP32 dims: [ 2, 2 ] zero_data: true",
            "input 'IN_FP32' has dims [2,2], the model's input has dims [-1]",
        ),
        ("dims: [ 2 ] zero_data: true", "input 'IN_FP32' has unsupported data type 'TYPE_INVALID'"),
        ('data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "missing"', "input_data_file 'missing' is not a file"),
    ],
)
def test_bad_sample(tmp_path: pathlib.Path, body: str, message: str) -> None:
    d, cfg = write_model(tmp_path, sample("bad", {"IN_FP32": body}), types=("FP32",))
    with pytest.raises(WarmupError) as err:
        warm(d, cfg)
    assert err.value.message.startswith("model 'm': warmup sample 'bad': ")
    assert message in err.value.message


def test_backend_failure_names_the_sample_and_stops_the_warmup(tmp_path: pathlib.Path) -> None:
    zero = "data_type: TYPE_FP32 dims: [ 2 ] zero_data: true"
    warmup = (
        sample("ok", {"IN_FP32": zero, "IN_INT32": "data_type: TYPE_INT32 dims: [ 2 ] zero_data: true"})
        + sample("missing input", {"IN_FP32": zero})
        + sample("never", {"IN_FP32": zero, "IN_INT32": "data_type: TYPE_INT32 dims: [ 2 ] zero_data: true"})
    )
    d, cfg = write_model(tmp_path, warmup, types=("FP32", "INT32"))
    inst, backend = instance(d, cfg)
    with pytest.raises(WarmupError) as err:
        inst.warm_up()
    assert err.value.message.startswith("model 'm': failed to run warmup sample 'missing input': ")
    assert "IN_INT32" in err.value.message
    assert len(backend.feeds) == 2  # 'never' did not run


def test_bf16_is_built_from_its_16_bit_patterns(tmp_path: pathlib.Path) -> None:
    """No ONNX Identity for bfloat16 in onnxruntime here: check the built tensors only."""
    cfg = text_format.Parse(
        'name: "b" max_batch_size: 2 input [ { name: "X" data_type: TYPE_BF16 dims: [ 2 ] } ] '
        'output [ { name: "Y" data_type: TYPE_BF16 dims: [ 2 ] } ] '
        + sample("bf", {"X": 'data_type: TYPE_BF16 dims: [ 2 ] input_data_file: "x"'}, batch_size=2)
        + sample("bz", {"X": "data_type: TYPE_BF16 dims: [ 2 ] zero_data: true"}),
        mc.ModelConfig(),
    )
    put_file(tmp_path, "x", np.array([0x3F80, 0x4000], "<u2").tobytes())  # 1.0, 2.0
    samples, _ = build_samples(cfg, tmp_path)
    np.testing.assert_array_equal(samples[0].execution.inputs["X"], [[0x3F80, 0x4000]] * 2)
    assert samples[0].execution.outputs == ("Y",) and samples[0].execution.batch_size == 2
    assert samples[1].execution.inputs["X"].dtype == np.uint16 and not samples[1].execution.inputs["X"].any()


# ------------------------------------------------------------------------------------- input_data_file


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("../config.pbtxt", "must not contain '..'"),
        ("sub/../../config.pbtxt", "must not contain '..'"),
        ("sub/../ok.bin", "must not contain '..'"),
        ("/etc/passwd", "must be a path relative to the model's 'warmup' directory"),
        ("", "'input_data_file' is empty"),
        ("escape_link", "leads outside the model's 'warmup' directory"),
        ("dir_link/config.pbtxt", "leads outside the model's 'warmup' directory"),
        ("sub", "is not a file"),
        ("loop", "input_data_file 'loop'"),
    ],
)
def test_input_data_file_must_stay_in_warmup_dir(tmp_path: pathlib.Path, name: str, message: str) -> None:
    model_dir = tmp_path / "m"
    put_file(model_dir, "ok.bin", b"\x00" * 8)
    (model_dir / "config.pbtxt").write_text("secret")
    (model_dir / "warmup" / "sub").mkdir()
    os.symlink(model_dir / "config.pbtxt", model_dir / "warmup" / "escape_link")
    os.symlink(model_dir, model_dir / "warmup" / "dir_link")
    os.symlink(model_dir / "warmup" / "loop", model_dir / "warmup" / "loop")
    with pytest.raises(InvalidArgument) as err:
        warmup_file(model_dir, name)
    assert message in str(err.value)


def test_input_data_file_inside_is_accepted(tmp_path: pathlib.Path) -> None:
    model_dir = tmp_path / "m"
    ok = put_file(model_dir, "ok.bin", b"\x00" * 8)
    put_file(model_dir, "sub/nested.bin", b"\x01")
    os.symlink(ok, model_dir / "warmup" / "inner_link")  # a link that stays inside is fine
    assert warmup_file(model_dir, "ok.bin") == ok.resolve()
    assert warmup_file(model_dir, "sub/nested.bin").read_bytes() == b"\x01"
    assert warmup_file(model_dir, "./inner_link") == ok.resolve()


def test_escaping_file_fails_the_warmup_naming_the_sample(tmp_path: pathlib.Path) -> None:
    d, cfg = write_model(
        tmp_path,
        sample("sneaky", {"IN_UINT8": 'data_type: TYPE_UINT8 dims: [ 4 ] input_data_file: "../1/model.onnx"'}),
        types=("UINT8",),
    )
    with pytest.raises(WarmupError, match=r"warmup sample 'sneaky': input_data_file '\.\./1/model\.onnx' must not"):
        warm(d, cfg)


# ------------------------------------------------------------------------------------------ ModelReplica


def test_replica_reports_a_failing_warmup_and_serves_a_good_one(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from serve_app.rayserve.model_replica import ModelReplica

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the replica sets it for KIND_CPU; restored after
    zero = "data_type: TYPE_FP32 dims: [ 2 ] zero_data: true"
    good_dir, good = write_model(tmp_path, sample("fine", {"IN_FP32": zero}, count=2), name="good", types=("FP32",))
    bad_dir, bad = write_model(
        tmp_path,
        sample("fine", {"IN_FP32": zero})
        + sample("broken", {"IN_FP32": 'data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "nope"'}),
        name="bad",
        types=("FP32",),
    )

    def replica(model_dir: pathlib.Path, cfg: mc.ModelConfig) -> ModelReplica:
        return ModelReplica(cfg.name, 1, cfg.SerializeToString(), str(model_dir / "1" / "model.onnx"), "KIND_CPU")

    ok = replica(good_dir, good)
    assert asyncio.run(ok.status()) == (True, "")
    ex = Execution(inputs={"IN_FP32": np.ones((1, 2), np.float32)}, outputs=("OUT_FP32",), batch_size=1)
    (res,) = asyncio.run(ok.execute([ex]))
    assert res.error is None and res.outputs["OUT_FP32"].tolist() == [[1.0, 1.0]]

    failed = replica(bad_dir, bad)
    ready, reason = asyncio.run(failed.status())
    assert not ready
    assert (
        reason
        == "model 'bad': warmup sample 'broken': input_data_file 'nope' is not a file in the model's 'warmup' directory"
    )
    (res,) = asyncio.run(failed.execute([ex]))
    assert (
        res.error is not None
        and "failed to load" in res.error.message
        and "warmup sample 'broken'" in res.error.message
    )
    asyncio.run(ok.stop())
    asyncio.run(failed.stop())
