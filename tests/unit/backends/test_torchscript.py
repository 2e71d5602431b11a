"""TorchScriptBackend on models scripted here: Triton's ``<name>__<index>`` naming, forward-argument naming,
config-order fallback, multiple outputs, every datatype, batches, implicit state and controls under the
sequence batcher, and the load errors (STRING, unsupported types, missing PyTorch, bad files)."""

from __future__ import annotations

import asyncio
import pathlib
import sys
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

# torch.jit.script/save are deprecated in favour of torch.export, but TorchScript is what Triton serves.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

from serve_app.backends import BackendContext, create_backend  # noqa: E402
from serve_app.backends.torchscript import INSTALL_HINT, TorchScriptBackend  # noqa: E402
from serve_app.errors import InternalError, InvalidArgument, InvalidConfig  # noqa: E402
from serve_app.inference.execution import Execution, ExecutionResult  # noqa: E402
from serve_app.repository import ModelRepository  # noqa: E402
from serve_app.runtime import ModelInstance  # noqa: E402
from serve_app.sequence.instance import SequenceInstance  # noqa: E402
from serve_app.sequence.messages import SequenceStep  # noqa: E402
from tests.e2e import torchscript_models  # noqa: E402

# ------------------------------------------------------------------------------------------- models


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Sub(torch.nn.Module):
    """Its argument order differs from the config's input order: only names can match them."""

    def forward(self, subtrahend: torch.Tensor, minuend: torch.Tensor) -> torch.Tensor:
        return minuend - subtrahend


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class InPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x


class Three(torch.nn.Module):
    """Three outputs of different types from one input."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x + 1, (x * 10).to(torch.int64), x > 0


class AsList(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x + 1, x - 1]


class DictIn(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["A"] * inputs["B"]


class DictOut(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"PLUS": x + 1, "MINUS": x - 1}


class WithDefault(torch.nn.Module):
    def forward(self, x: torch.Tensor, scale: float = 3.0) -> torch.Tensor:
        return x * scale


class NeedsInt(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x * n


class Accumulator(torch.nn.Module):
    """By name: INPUT, INPUT_STATE and START are arguments; the state output comes back by name too."""

    def forward(self, INPUT: torch.Tensor, INPUT_STATE: torch.Tensor, START: torch.Tensor) -> dict[str, torch.Tensor]:
        new = INPUT_STATE * (1 - START) + INPUT
        return {"OUTPUT__0": new, "OUTPUT_STATE": new}


class Scalar(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()


# ------------------------------------------------------------------------------------------- helpers


def io(kind: str, *tensors: tuple[str, str, str]) -> str:
    body = ",\n".join(f'  {{ name: "{n}" data_type: TYPE_{t} dims: {d} }}' for n, t, d in tensors)
    return f"{kind} [\n{body}\n]\n"


def write(root: pathlib.Path, name: str, module: torch.nn.Module, config: str, max_batch_size: int = 8) -> None:
    d = root / name
    (d / "1").mkdir(parents=True)
    torch.jit.script(module).save(str(d / "1" / "model.pt"))
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: {max_batch_size}\n' + config
    )


def context(root: pathlib.Path, name: str) -> BackendContext:
    """The model's config as the server sees it: parsed, completed and validated by the repository."""
    source = ModelRepository(root).load(name)
    return BackendContext(name, 1, source.config, source.versions[1])


def instance(
    root: pathlib.Path, name: str, module: torch.nn.Module, config: str, max_batch_size: int = 8
) -> ModelInstance:
    write(root, name, module, config, max_batch_size)
    return ModelInstance(context(root, name))


def run(inst: ModelInstance, inputs: dict[str, np.ndarray], outputs: tuple[str, ...], batch: int = 1) -> dict[str, Any]:
    result = inst.run(Execution(inputs, outputs, batch))
    assert result.error is None, result.error
    assert set(result.outputs) == set(outputs)
    return result.outputs


def failure(inst: ModelInstance, inputs: dict[str, np.ndarray], outputs: tuple[str, ...]) -> Exception:
    result = inst.run(Execution(inputs, outputs, 1))
    assert result.error is not None
    return result.error


ADD_SUB_IO = io("input", ("INPUT__0", "FP32", "[ 4 ]"), ("INPUT__1", "FP32", "[ 4 ]")) + io(
    "output", ("OUTPUT__0", "FP32", "[ 4 ]"), ("OUTPUT__1", "FP32", "[ 4 ]")
)


def read_only(arr: np.ndarray) -> np.ndarray:
    """As the gateway hands tensors over: a read-only view of request bytes."""
    return np.frombuffer(arr.tobytes(), dtype=arr.dtype).reshape(arr.shape)


# ------------------------------------------------------------------------------------------- naming


def test_index_naming_and_multiple_outputs(tmp_path: pathlib.Path) -> None:
    inst = instance(tmp_path, "add_sub", AddSub(), ADD_SUB_IO)
    assert isinstance(inst.backend, TorchScriptBackend)
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), np.float32)
    out = run(inst, {"INPUT__0": read_only(a), "INPUT__1": read_only(b)}, ("OUTPUT__0", "OUTPUT__1"), 2)
    np.testing.assert_array_equal(out["OUTPUT__0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT__1"], a - b)
    assert out["OUTPUT__0"].dtype == np.float32 and out["OUTPUT__0"].shape == (2, 4)
    # one output only, and inputs given in the other order: the index decides, not the dict order
    out = run(inst, {"INPUT__1": b[:1], "INPUT__0": a[:1]}, ("OUTPUT__1",))
    np.testing.assert_array_equal(out["OUTPUT__1"], a[:1] - b[:1])


def test_index_naming_follows_the_index_not_the_config_order(tmp_path: pathlib.Path) -> None:
    config = io("input", ("B__1", "FP32", "[ 4 ]"), ("A__0", "FP32", "[ 4 ]")) + io(
        "output", ("DIFF__1", "FP32", "[ 4 ]"), ("SUM__0", "FP32", "[ 4 ]")
    )
    inst = instance(tmp_path, "swapped", AddSub(), config)
    a, b = np.full((1, 4), 5, np.float32), np.full((1, 4), 2, np.float32)
    out = run(inst, {"A__0": a, "B__1": b}, ("SUM__0", "DIFF__1"))
    assert out["SUM__0"].ravel().tolist() == [7] * 4
    assert out["DIFF__1"].ravel().tolist() == [3] * 4


def test_forward_argument_naming(tmp_path: pathlib.Path) -> None:
    config = io("input", ("minuend", "INT64", "[ 3 ]"), ("subtrahend", "INT64", "[ 3 ]")) + io(
        "output", ("OUT__0", "INT64", "[ 3 ]")
    )
    inst = instance(tmp_path, "sub", Sub(), config)
    m, s = np.array([[10, 20, 30]], np.int64), np.array([[1, 2, 3]], np.int64)
    assert run(inst, {"minuend": m, "subtrahend": s}, ("OUT__0",))["OUT__0"].tolist() == [[9, 18, 27]]


def test_config_order_when_names_follow_no_rule(tmp_path: pathlib.Path) -> None:
    # neither forward() argument names nor <name>__<index>: Triton falls back to the config's order
    config = io("input", ("first", "INT32", "[ 2 ]"), ("second", "INT32", "[ 2 ]")) + io(
        "output", ("OUT__0", "INT32", "[ 2 ]")
    )
    inst = instance(tmp_path, "ordered", Sub(), config)
    x, y = np.array([[5, 5]], np.int32), np.array([[1, 2]], np.int32)
    # Sub(subtrahend=first, minuend=second) = second - first
    assert run(inst, {"first": x, "second": y}, ("OUT__0",))["OUT__0"].tolist() == [[-4, -3]]


def test_outputs_of_mixed_types_and_a_list_result(tmp_path: pathlib.Path) -> None:
    config = io("input", ("X__0", "FP32", "[ 2 ]")) + io(
        "output", ("P__0", "FP32", "[ 2 ]"), ("T__1", "INT64", "[ 2 ]"), ("POS__2", "BOOL", "[ 2 ]")
    )
    inst = instance(tmp_path, "three", Three(), config)
    x = np.array([[-1.0, 2.0]], np.float32)
    out = run(inst, {"X__0": x}, ("P__0", "T__1", "POS__2"))
    assert out["P__0"].tolist() == [[0.0, 3.0]]
    assert out["T__1"].dtype == np.int64 and out["T__1"].tolist() == [[-10, 20]]
    assert out["POS__2"].dtype == np.bool_ and out["POS__2"].tolist() == [[False, True]]

    config = io("input", ("X__0", "FP32", "[ 2 ]")) + io("output", ("A__0", "FP32", "[ 2 ]"), ("B__1", "FP32", "[ 2 ]"))
    inst = instance(tmp_path, "as_list", AsList(), config)
    out = run(inst, {"X__0": x}, ("B__1",))
    assert out["B__1"].tolist() == [[-2.0, 1.0]]


def test_dict_input_and_dict_output(tmp_path: pathlib.Path) -> None:
    config = io("input", ("A", "FP32", "[ 2 ]"), ("B", "FP32", "[ 2 ]")) + io("output", ("OUT__0", "FP32", "[ 2 ]"))
    inst = instance(tmp_path, "dict_in", DictIn(), config)
    a, b = np.array([[2.0, 3.0]], np.float32), np.array([[4.0, 5.0]], np.float32)
    assert run(inst, {"A": a, "B": b}, ("OUT__0",))["OUT__0"].tolist() == [[8.0, 15.0]]

    # Triton's validation wants <name>__<index> outputs, so a dict's keys carry the index too
    config = io("input", ("X__0", "FP32", "[ 2 ]")) + io(
        "output", ("PLUS", "FP32", "[ 2 ]"), ("MINUS", "FP32", "[ 2 ]")
    )
    write(tmp_path, "dict_out", DictOut(), config)
    ctx = context_unvalidated(tmp_path, "dict_out")
    out = TorchScriptBackend(ctx).execute({"X__0": a}, ["MINUS", "PLUS"])
    assert out["MINUS"].tolist() == [[1.0, 2.0]] and out["PLUS"].tolist() == [[3.0, 4.0]]


def context_unvalidated(root: pathlib.Path, name: str) -> BackendContext:
    from google.protobuf import text_format

    from serve_app.protos import model_config_pb2 as mc

    config = text_format.Parse((root / name / "config.pbtxt").read_text(), mc.ModelConfig())
    config.backend = "pytorch"
    return BackendContext(name, 1, config, root / name / "1" / "model.pt")


def test_arguments_with_defaults_may_be_left_out(tmp_path: pathlib.Path) -> None:
    config = io("input", ("x", "FP32", "[ 1 ]")) + io("output", ("OUT__0", "FP32", "[ 1 ]"))
    inst = instance(tmp_path, "default", WithDefault(), config)
    assert run(inst, {"x": np.array([[2.0]], np.float32)}, ("OUT__0",))["OUT__0"].tolist() == [[6.0]]


# ------------------------------------------------------------------------------------------- datatypes

DATATYPES = ["BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]


def sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(0)
    if datatype == "BOOL":
        return rng.random(shape) < 0.5
    dtype = np.dtype({"FP16": "float16", "FP32": "float32", "FP64": "float64"}.get(datatype, datatype.lower()))
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_round_trips(tmp_path: pathlib.Path, datatype: str) -> None:
    config = io("input", ("IN__0", datatype, "[ -1 ]")) + io("output", ("OUT__0", datatype, "[ -1 ]"))
    inst = instance(tmp_path, f"identity_{datatype.lower()}", Identity(), config)
    x = sample(datatype, (3, 5))
    out = run(inst, {"IN__0": read_only(x)}, ("OUT__0",), 3)["OUT__0"]
    assert out.dtype == x.dtype
    np.testing.assert_array_equal(out, x)


def test_bf16_travels_as_its_bit_pattern(tmp_path: pathlib.Path) -> None:
    config = io("input", ("IN__0", "BF16", "[ 3 ]")) + io("output", ("OUT__0", "BF16", "[ 3 ]"))
    inst = instance(tmp_path, "double_bf16", Double(), config)
    values = torch.tensor([[1.5, -2.0, 0.25]], dtype=torch.bfloat16)
    bits = values.view(torch.uint16).numpy()
    out = run(inst, {"IN__0": read_only(bits)}, ("OUT__0",))["OUT__0"]
    assert out.dtype == np.uint16
    assert torch.from_numpy(out.copy()).view(torch.bfloat16).tolist() == [[3.0, -4.0, 0.5]]


def test_read_only_inputs_are_copied_not_written(tmp_path: pathlib.Path) -> None:
    config = io("input", ("IN__0", "FP32", "[ 2 ]")) + io("output", ("OUT__0", "FP32", "[ 2 ]"))
    inst = instance(tmp_path, "in_place", InPlace(), config)
    x = read_only(np.array([[1.0, 2.0]], np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it wraps a non-writable array
        out = run(inst, {"IN__0": x}, ("OUT__0",))["OUT__0"]
    assert out.tolist() == [[2.0, 3.0]]
    assert x.tolist() == [[1.0, 2.0]]


def test_an_output_of_the_wrong_type_is_reported(tmp_path: pathlib.Path) -> None:
    config = io("input", ("IN__0", "FP32", "[ 2 ]")) + io("output", ("OUT__0", "FP64", "[ 2 ]"))
    inst = instance(tmp_path, "wrong_type", Identity(), config)
    err = failure(inst, {"IN__0": np.zeros((1, 2), np.float32)}, ("OUT__0",))
    assert isinstance(err, InternalError) and "config says TYPE_FP64" in str(err)


# ------------------------------------------------------------------------------------------- batching


def test_batches_of_several_sizes(tmp_path: pathlib.Path) -> None:
    inst = instance(tmp_path, "add_sub", AddSub(), ADD_SUB_IO)
    for batch in (1, 3, 8):
        a = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
        b = np.full((batch, 4), 0.5, np.float32)
        out = run(inst, {"INPUT__0": a, "INPUT__1": b}, ("OUTPUT__0", "OUTPUT__1"), batch)
        assert out["OUTPUT__0"].shape == (batch, 4)
        np.testing.assert_array_equal(out["OUTPUT__1"], a - b)


def test_unbatched_model(tmp_path: pathlib.Path) -> None:
    inst = instance(tmp_path, "add_sub0", AddSub(), ADD_SUB_IO, max_batch_size=0)
    a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    out = run(inst, {"INPUT__0": a, "INPUT__1": b}, ("OUTPUT__0",), 0)
    assert out["OUTPUT__0"].shape == (4,) and out["OUTPUT__0"].tolist() == [1, 2, 3, 4]


# ------------------------------------------------------------------------------------------- errors


def test_a_missing_output_index_fails_the_execution(tmp_path: pathlib.Path) -> None:
    config = io("input", ("INPUT__0", "FP32", "[ 4 ]"), ("INPUT__1", "FP32", "[ 4 ]")) + io(
        "output", ("OUTPUT__0", "FP32", "[ 4 ]"), ("OUTPUT__2", "FP32", "[ 4 ]")
    )
    inst = instance(tmp_path, "missing", AddSub(), config)
    feed = {"INPUT__0": np.zeros((1, 4), np.float32), "INPUT__1": np.zeros((1, 4), np.float32)}
    assert run(inst, feed, ("OUTPUT__0",))["OUTPUT__0"].shape == (1, 4)  # the others still work
    err = failure(inst, feed, ("OUTPUT__2",))
    assert isinstance(err, InvalidArgument)
    assert "OUTPUT__2 in the model configuration refers to an output index which doesn't exist" in str(err)
    assert "This model has 2 outputs" in str(err)


def test_a_dict_without_the_output_fails_the_execution(tmp_path: pathlib.Path) -> None:
    config = io("input", ("X__0", "FP32", "[ 2 ]")) + io("output", ("PLUS__0", "FP32", "[ 2 ]"))
    inst = instance(tmp_path, "dict_missing", DictOut(), config)
    err = failure(inst, {"X__0": np.zeros((1, 2), np.float32)}, ("PLUS__0",))
    assert "did not produce output 'PLUS__0'" in str(err)


def test_a_failing_forward_is_an_internal_error(tmp_path: pathlib.Path) -> None:
    inst = instance(tmp_path, "add_sub", AddSub(), ADD_SUB_IO)
    err = failure(
        inst, {"INPUT__0": np.zeros((1, 4), np.float32), "INPUT__1": np.zeros((1, 3), np.float32)}, ("OUTPUT__0",)
    )
    assert isinstance(err, InternalError) and "PyTorch execute failure" in str(err)


def test_a_missing_input_fails_the_execution(tmp_path: pathlib.Path) -> None:
    inst = instance(tmp_path, "add_sub", AddSub(), ADD_SUB_IO)
    err = failure(inst, {"INPUT__0": np.zeros((1, 4), np.float32)}, ("OUTPUT__0",))
    assert isinstance(err, InvalidArgument) and "'b'" in str(err)


def test_a_scalar_output_is_refused(tmp_path: pathlib.Path) -> None:
    config = io("input", ("X__0", "FP32", "[ 2 ]")) + io("output", ("S__0", "FP32", "[ 1 ]"))
    inst = instance(tmp_path, "scalar", Scalar(), config, max_batch_size=0)
    err = failure(inst, {"X__0": np.zeros(2, np.float32)}, ("S__0",))
    assert "is a scalar which is not supported" in str(err)


def load_error(root: pathlib.Path, name: str, module: torch.nn.Module, config: str, max_batch_size: int = 8) -> str:
    write(root, name, module, config, max_batch_size)
    ctx = context(root, name)
    with pytest.raises(InvalidConfig) as info:
        ModelInstance(ctx)
    return str(info.value)


def test_a_string_tensor_fails_the_load(tmp_path: pathlib.Path) -> None:
    config = io("input", ("IN__0", "STRING", "[ 1 ]")) + io("output", ("OUT__0", "STRING", "[ 1 ]"))
    message = load_error(tmp_path, "strings", Identity(), config)
    assert "model 'strings'" in message and "'IN__0' is TYPE_STRING" in message
    assert "pytorch backend does not support" in message


def test_unsigned_wide_types_fail_the_load(tmp_path: pathlib.Path) -> None:
    config = io("input", ("IN__0", "UINT32", "[ 1 ]")) + io("output", ("OUT__0", "UINT32", "[ 1 ]"))
    message = load_error(tmp_path, "u32", Identity(), config)
    assert "TYPE_UINT32" in message and "does not support" in message


def test_a_uint64_corrid_control_fails_the_load(tmp_path: pathlib.Path) -> None:
    corrid = '{ name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }'
    config = sequence_config("INPUT_STATE", "OUTPUT_STATE", "START", "INPUT", extra_control=corrid)
    message = load_error(tmp_path, "corrid", Accumulator(), config)
    assert "'CORRID'" in message and "TYPE_UINT64" in message


def test_an_argument_no_input_feeds_fails_the_load(tmp_path: pathlib.Path) -> None:
    config = io("input", ("INPUT__0", "FP32", "[ 4 ]")) + io("output", ("OUTPUT__0", "FP32", "[ 4 ]"))
    message = load_error(tmp_path, "short", AddSub(), config)
    assert "forward() argument(s) 'b' are fed by no input" in message


def test_an_index_beyond_the_arguments_fails_the_load(tmp_path: pathlib.Path) -> None:
    config = io("input", ("A__0", "FP32", "[ 4 ]"), ("B__5", "FP32", "[ 4 ]")) + io(
        "output", ("OUT__0", "FP32", "[ 4 ]")
    )
    message = load_error(tmp_path, "far", AddSub(), config)
    assert "'B__5' refers to forward() argument 5" in message


def test_a_non_tensor_argument_fails_the_load(tmp_path: pathlib.Path) -> None:
    config = io("input", ("x", "FP32", "[ 1 ]"), ("n", "INT64", "[ 1 ]")) + io("output", ("OUT__0", "FP32", "[ 1 ]"))
    message = load_error(tmp_path, "needs_int", NeedsInt(), config)
    assert "forward() argument 'n' has type 'int'" in message


def test_a_file_that_is_not_torchscript_fails_the_load(tmp_path: pathlib.Path) -> None:
    write(
        tmp_path,
        "garbage",
        Identity(),
        io("input", ("I__0", "FP32", "[ 1 ]")) + io("output", ("O__0", "FP32", "[ 1 ]")),
    )
    (tmp_path / "garbage" / "1" / "model.pt").write_bytes(b"not a zip archive")
    with pytest.raises(InvalidConfig, match="model 'garbage': failed to load"):
        ModelInstance(context(tmp_path, "garbage"))


def test_missing_pytorch_fails_only_the_load(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "add_sub", AddSub(), ADD_SUB_IO)
    ctx = context(tmp_path, "add_sub")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(InvalidConfig) as info:
        create_backend(ctx)
    assert INSTALL_HINT in str(info.value) and "model 'add_sub'" in str(info.value)


def test_thread_count_parameters(tmp_path: pathlib.Path) -> None:
    before = torch.get_num_threads()
    try:
        config = ADD_SUB_IO + 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }\n'
        instance(tmp_path, "one_thread", AddSub(), config)
        assert torch.get_num_threads() == 1
        config = ADD_SUB_IO + 'parameters { key: "intra_op_thread_count" value: { string_value: "two" } }\n'
        message = load_error(tmp_path, "bad_threads", AddSub(), config)
        assert "parameter 'intra_op_thread_count' must be an integer, got 'two'" in message
    finally:
        torch.set_num_threads(before)


def test_kind_gpu_without_cuda_runs_on_the_cpu(tmp_path: pathlib.Path) -> None:
    write(tmp_path, "add_sub", AddSub(), ADD_SUB_IO)
    ctx = context(tmp_path, "add_sub")
    gpu = BackendContext(ctx.model_name, 1, ctx.config, ctx.model_file, device_kind="KIND_GPU", gpu_ids=(0,))
    backend = TorchScriptBackend(gpu)
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert str(backend._device) == expected
    out = backend.execute(
        {"INPUT__0": np.ones((1, 4), np.float32), "INPUT__1": np.ones((1, 4), np.float32)}, ["OUTPUT__0"]
    )
    assert out["OUTPUT__0"].tolist() == [[2.0] * 4]


# ------------------------------------------------------------------------------------------- sequences


def sequence_config(state_in: str, state_out: str, start: str, input_name: str, extra_control: str = "") -> str:
    controls = f'{{ name: "{start}" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }}'
    controls += f", {extra_control}" if extra_control else ""
    return (
        io("input", (input_name, "INT32", "[ 1 ]"))
        + io("output", ("OUTPUT__0", "INT32", "[ 1 ]"))
        + "sequence_batching {\n  direct { }\n"
        f"  control_input [ {controls} ]\n"
        f'  state [ {{ input_name: "{state_in}" output_name: "{state_out}" data_type: TYPE_INT32 dims: [ 1 ] '
        'initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "z" } } ]\n}\n'
    )


def sequence(
    root: pathlib.Path, name: str, module: torch.nn.Module, config: str
) -> tuple[ModelInstance, SequenceInstance]:
    inst = instance(root, name, module, config, max_batch_size=4)

    async def run_one(ex: Execution) -> ExecutionResult:
        return inst.run(ex)

    seq = SequenceInstance(inst.ctx.config, root / name, run_one, instance_id="i0")
    return inst, seq


def seq_step(corr: int, slot: int, value: int, *, start: bool = False, end: bool = False, gen: int = 1) -> SequenceStep:
    return SequenceStep(corr, slot, gen, start, end, {"INPUT": np.array([[value]], np.int32)}, ("OUTPUT__0",), 1)


async def drive(seq: SequenceInstance, steps: list[SequenceStep]) -> list[int]:
    results = await asyncio.gather(*(seq.step(s) for s in steps))
    values = []
    for r in results:
        assert r.error is None and not r.not_here, r
        values.append(int(r.outputs["OUTPUT__0"].ravel()[0]))
    return values


async def test_implicit_state_and_controls_by_forward_argument_name(tmp_path: pathlib.Path) -> None:
    # INPUT_STATE and START are in no config input: they reach forward() by name; the state output
    # comes back from the returned dict by name
    config = sequence_config("INPUT_STATE", "OUTPUT_STATE", "START", "INPUT")
    _, seq = sequence(tmp_path, "acc_by_name", Accumulator(), config)
    assert await drive(seq, [seq_step(7, 0, 5, start=True)]) == [5]
    # two sequences in two slots share one execution
    assert await drive(seq, [seq_step(7, 0, 2), seq_step(8, 1, 100, start=True)]) == [7, 100]
    assert await drive(seq, [seq_step(7, 0, 1, end=True), seq_step(8, 1, 1, end=True)]) == [8, 101]
    assert await drive(seq, [seq_step(9, 0, 3, start=True, end=True, gen=2)]) == [3]


async def test_implicit_state_by_index_as_triton(tmp_path: pathlib.Path) -> None:
    # The e2e model: INPUT__0, INPUT_STATE__1, START__2 in; OUTPUT__0 and OUTPUT_STATE__1 out (a tuple)
    torchscript_models.accumulator(tmp_path, "ts_accum")
    inst = ModelInstance(context(tmp_path, "ts_accum"))

    async def run_one(ex: Execution) -> ExecutionResult:
        return inst.run(ex)

    seq = SequenceInstance(inst.ctx.config, tmp_path / "ts_accum", run_one, instance_id="i0")

    def s(corr: int, slot: int, value: int, start: bool = False) -> SequenceStep:
        return SequenceStep(corr, slot, 1, start, False, {"INPUT__0": np.array([[value]], np.int32)}, ("OUTPUT__0",), 1)

    assert await drive(seq, [s(1, 0, 4, True), s(2, 1, 10, True)]) == [4, 10]
    assert await drive(seq, [s(1, 0, 4), s(2, 1, -1)]) == [8, 9]
    assert await drive(seq, [s(1, 0, 1, True)]) == [1]  # START again: from zero


def test_e2e_add_sub_model(tmp_path: pathlib.Path) -> None:
    torchscript_models.add_sub(tmp_path, extra_config=torchscript_models.ADD_SUB_BATCHING)
    inst = ModelInstance(context(tmp_path, "ts_add_sub"))
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.ones((2, 16), np.float32)
    out = run(inst, {"INPUT__0": a, "INPUT__1": b}, ("OUTPUT__0", "OUTPUT__1"), 2)
    np.testing.assert_array_equal(out["OUTPUT__0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT__1"], a - b)
