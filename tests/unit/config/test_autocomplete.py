"""Generated config: what Triton derives from the directory and the ONNX model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from serve_app.backends import complete_io
from serve_app.backends.onnxruntime_config import DEFAULT_MAX_BATCH_SIZE
from serve_app.config import (
    autocomplete_config,
    default_model_filename,
    parse_config,
    validate_config,
)
from serve_app.errors import InvalidConfig
from serve_app.protos import model_config_pb2 as mc

Dim = int | str | None
Tensor = tuple[str, int, Sequence[Dim]]


def make_onnx(path: Path, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> Path:
    """An ONNX model whose i-th output is Identity of the i-th input."""
    nodes = [helper.make_node("Identity", [i[0]], [o[0]]) for i, o in zip(inputs, outputs, strict=True)]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(*t) for t in inputs],
        [helper.make_tensor_value_info(*t) for t in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def complete(tmp_path: Path, model_file: Path | None, text: str = "", name: str = "m") -> mc.ModelConfig:
    config = parse_config(text, model=name, path="config.pbtxt")
    return autocomplete_config(config, model=name, model_dir=tmp_path, model_file=model_file, complete_io=complete_io)


def io(config_ios: Sequence[mc.ModelInput] | Sequence[mc.ModelOutput]) -> list[tuple[str, str, list[int]]]:
    return [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config_ios]


FP32 = TensorProto.FLOAT


@pytest.fixture
def fixed(tmp_path: Path) -> Path:
    return make_onnx(tmp_path / "1" / "model.onnx", [("x", FP32, [2, 3])], [("y", FP32, [2, 3])])


@pytest.fixture
def batched(tmp_path: Path) -> Path:
    return make_onnx(
        tmp_path / "1" / "model.onnx",
        [("a", FP32, ["batch", 16]), ("b", TensorProto.INT64, [None, 4, "w"])],
        [("c", FP32, ["batch", 16]), ("d", TensorProto.INT64, ["n", 4, "w"])],
    )


def test_fills_name_platform_and_file(tmp_path: Path, fixed: Path) -> None:
    config = complete(tmp_path, fixed)
    assert config.name == "m"
    assert (config.platform, config.backend) == ("onnxruntime_onnx", "onnxruntime")
    assert config.default_model_filename == "model.onnx"


def test_fixed_first_dim_means_no_batching(tmp_path: Path, fixed: Path) -> None:
    config = complete(tmp_path, fixed)
    assert config.max_batch_size == 0
    assert io(config.input) == [("x", "TYPE_FP32", [2, 3])]
    assert io(config.output) == [("y", "TYPE_FP32", [2, 3])]
    assert config.WhichOneof("scheduling_choice") is None
    validate_config(config, model="m", path="p")


def test_variable_first_dims_enable_batching(tmp_path: Path, batched: Path) -> None:
    config = complete(tmp_path, batched)
    assert config.max_batch_size == DEFAULT_MAX_BATCH_SIZE == 4
    assert io(config.input) == [("a", "TYPE_FP32", [16]), ("b", "TYPE_INT64", [4, -1])]
    assert io(config.output) == [("c", "TYPE_FP32", [16]), ("d", "TYPE_INT64", [4, -1])]
    # Like Triton: a default max_batch_size > 1 with no scheduler gets a dynamic batcher,
    # whose preferred size normalizes to max_batch_size.
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert list(config.dynamic_batching.preferred_batch_size) == [4]
    validate_config(config, model="m", path="p")


def test_one_fixed_tensor_prevents_batching(tmp_path: Path) -> None:
    model = make_onnx(
        tmp_path / "model.onnx",
        [("a", FP32, ["batch", 2]), ("b", FP32, [1, 2])],
        [("c", FP32, ["batch", 2]), ("d", FP32, [1, 2])],
    )
    config = complete(tmp_path, model)
    assert config.max_batch_size == 0
    assert io(config.input) == [("a", "TYPE_FP32", [-1, 2]), ("b", "TYPE_FP32", [1, 2])]


def test_existing_scheduler_is_kept(tmp_path: Path, batched: Path) -> None:
    config = complete(tmp_path, batched, "sequence_batching { }")
    assert config.max_batch_size == 4
    assert config.WhichOneof("scheduling_choice") == "sequence_batching"


def test_configured_max_batch_size_strips_batch_dim(tmp_path: Path, batched: Path) -> None:
    config = complete(tmp_path, batched, "max_batch_size: 8")
    assert config.max_batch_size == 8
    assert io(config.input) == [("a", "TYPE_FP32", [16]), ("b", "TYPE_INT64", [4, -1])]
    assert config.WhichOneof("scheduling_choice") is None


def test_configured_batching_on_unbatchable_model(tmp_path: Path, fixed: Path) -> None:
    with pytest.raises(InvalidConfig) as info:
        complete(tmp_path, fixed, "max_batch_size: 8")
    message = str(info.value)
    assert f"model 'm', file '{fixed}': input[0].dims:" in message
    assert "does not support batching" in message


def test_given_inputs_keep_batching_off(tmp_path: Path, batched: Path) -> None:
    text = """
    input [ { name: "a" data_type: TYPE_FP32 dims: [ -1, 16 ] },
            { name: "b" data_type: TYPE_INT64 dims: [ -1, 4, -1 ] } ]
    """
    config = complete(tmp_path, batched, text)
    assert config.max_batch_size == 0
    assert io(config.input) == [("a", "TYPE_FP32", [-1, 16]), ("b", "TYPE_INT64", [-1, 4, -1])]
    assert io(config.output) == [("c", "TYPE_FP32", [-1, 16]), ("d", "TYPE_INT64", [-1, 4, -1])]


def test_given_entries_get_missing_fields(tmp_path: Path, batched: Path) -> None:
    text = """
    max_batch_size: 2
    input [ { name: "b" }, { name: "a" data_type: TYPE_FP16 } ]
    output [ { name: "c" dims: [ 4, 4 ] } ]
    """
    config = complete(tmp_path, batched, text)
    # Given entries keep their order and values; a given list is not extended.
    assert io(config.input) == [("b", "TYPE_INT64", [4, -1]), ("a", "TYPE_FP16", [16])]
    assert io(config.output) == [("c", "TYPE_FP32", [4, 4])]


def test_unknown_names_are_left_for_the_backend(tmp_path: Path, fixed: Path) -> None:
    config = complete(tmp_path, fixed, 'input { name: "nope" }')
    assert io(config.input) == [("nope", "TYPE_INVALID", [])]
    assert io(config.output) == [("y", "TYPE_FP32", [2, 3])]


def test_complete_config_does_not_open_the_model(tmp_path: Path) -> None:
    text = """
    platform: "onnxruntime_onnx"
    input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] } ]
    """
    bogus = tmp_path / "model.onnx"
    bogus.write_bytes(b"not a model")
    config = complete(tmp_path, bogus, text)
    assert io(config.input) == [("a", "TYPE_FP32", [1])]


def test_unreadable_model_names_the_file(tmp_path: Path) -> None:
    bogus = tmp_path / "model.onnx"
    bogus.write_bytes(b"not a model")
    with pytest.raises(InvalidConfig, match=rf"model 'm', file '{bogus}': unable to read the ONNX model"):
        complete(tmp_path, bogus)


@pytest.mark.parametrize(
    ("onnx_type", "config_type"),
    [
        (TensorProto.STRING, "TYPE_STRING"),
        (TensorProto.FLOAT16, "TYPE_FP16"),
        (TensorProto.BOOL, "TYPE_BOOL"),
        (TensorProto.DOUBLE, "TYPE_FP64"),
        (TensorProto.UINT8, "TYPE_UINT8"),
        (TensorProto.INT32, "TYPE_INT32"),
    ],
)
def test_data_types(tmp_path: Path, onnx_type: int, config_type: str) -> None:
    model = make_onnx(tmp_path / "model.onnx", [("in", onnx_type, [3])], [("out", onnx_type, [3])])
    config = complete(tmp_path, model)
    assert io(config.input) == [("in", config_type, [3])]
    assert io(config.output) == [("out", config_type, [3])]


def test_string_batched_input(tmp_path: Path) -> None:
    model = make_onnx(
        tmp_path / "model.onnx", [("text", TensorProto.STRING, ["b", 1])], [("echo", TensorProto.STRING, ["b", 1])]
    )
    config = complete(tmp_path, model)
    assert config.max_batch_size == 4
    assert io(config.input) == [("text", "TYPE_STRING", [1])]


def test_batch_only_tensor_gets_empty_reshape(tmp_path: Path) -> None:
    model = make_onnx(tmp_path / "model.onnx", [("x", FP32, ["b"])], [("y", FP32, ["b"])])
    config = complete(tmp_path, model)
    assert config.max_batch_size == 4
    assert list(config.input[0].dims) == [1]
    assert config.input[0].HasField("reshape")
    assert list(config.input[0].reshape.shape) == []
    validate_config(config, model="m", path="p")


def test_input_is_not_modified(tmp_path: Path, batched: Path) -> None:
    config = parse_config("max_batch_size: 2", model="m", path="p")
    autocomplete_config(config, model="m", model_dir=tmp_path, model_file=batched, complete_io=complete_io)
    assert config == parse_config("max_batch_size: 2", model="m", path="p")


def test_relative_model_file_is_taken_from_the_model_dir(tmp_path: Path, fixed: Path) -> None:
    config = complete(tmp_path, Path("1/model.onnx"))
    assert io(config.input) == [("x", "TYPE_FP32", [2, 3])]


@pytest.mark.parametrize(
    ("filename", "platform", "backend"),
    [("model.pt", "pytorch_libtorch", "pytorch"), ("model.plan", "tensorrt_plan", "tensorrt")],
)
def test_platform_from_other_extensions(tmp_path: Path, filename: str, platform: str, backend: str) -> None:
    model_file = tmp_path / "1" / filename
    model_file.parent.mkdir()
    model_file.write_bytes(b"opaque")  # not opened: only ONNX models are inspected
    config = complete(tmp_path, model_file)
    assert (config.platform, config.backend, config.default_model_filename) == (platform, backend, filename)
    assert len(config.input) == 0


def test_given_platform_wins_over_extension(tmp_path: Path) -> None:
    model_file = tmp_path / "weights.bin"
    model_file.write_bytes(b"opaque")
    config = complete(tmp_path, model_file, 'backend: "pytorch" default_model_filename: "weights.bin"')
    assert (config.platform, config.backend, config.default_model_filename) == (
        "pytorch_libtorch",
        "pytorch",
        "weights.bin",
    )


def test_ensemble_without_file(tmp_path: Path) -> None:
    config = complete(tmp_path, None, 'platform: "ensemble" ensemble_scheduling { }')
    assert config.platform == "ensemble"
    assert config.backend == ""
    assert config.default_model_filename == ""
    assert not config.HasField("optimization")


def test_triton_defaults(tmp_path: Path, fixed: Path) -> None:
    config = complete(tmp_path, fixed)
    assert config.version_policy.WhichOneof("policy_choice") == "latest"
    assert config.version_policy.latest.num_versions == 1
    assert config.optimization.input_pinned_memory.enable
    assert config.optimization.output_pinned_memory.enable
    config = complete(tmp_path, fixed, "sequence_batching { }")
    assert config.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    config = complete(tmp_path, fixed, "version_policy { all { } }")
    assert config.version_policy.WhichOneof("policy_choice") == "all"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('platform: "onnxruntime_onnx"', "model.onnx"),
        ('backend: "onnxruntime"', "model.onnx"),
        ('platform: "pytorch_libtorch"', "model.pt"),
        ('backend: "pytorch"', "model.pt"),
        ('platform: "tensorrt_plan"', "model.plan"),
        ('platform: "tensorrt_plan" default_model_filename: "engine.plan"', "engine.plan"),
        ('platform: "ensemble"', ""),
        ('backend: "python"', "model.py"),
        ('backend: "python" default_model_filename: "serve.py"', "serve.py"),
        ("", ""),
    ],
)
def test_default_model_filename(text: str, expected: str) -> None:
    assert default_model_filename(parse_config(text, model="m", path="p")) == expected
