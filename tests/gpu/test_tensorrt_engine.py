"""TensorRT on a real GPU: engines built here from small ONNX models, served by TensorRTBackend.

Each test builds a ``model.plan`` with the TensorRT builder and OnnxParser (with
optimization profiles), then loads it the way a model instance does.  Skipped,
with the reason naming what is missing, where ``tensorrt``, ``cuda-python`` or a
CUDA GPU is absent (CI and the development machines have none of them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serve_app import datatypes
from serve_app.backends import BackendContext
from serve_app.backends.tensorrt import TensorRTBackend, import_cudart, read_plan_metadata
from serve_app.backends.tensorrt_logic import complete_config_from_engine
from serve_app.config import normalize_config, validate_config
from serve_app.errors import InvalidArgument, InvalidConfig
from serve_app.inference.execution import Execution
from serve_app.protos import model_config_pb2 as mc
from serve_app.runtime import ModelInstance

pytestmark = pytest.mark.gpu

Shapes = Mapping[str, tuple[Sequence[int], Sequence[int], Sequence[int]]]


def _unavailable() -> str:
    """Why these tests can't run here, or "" when they can."""
    try:
        import tensorrt  # noqa: F401
    except ImportError as exc:
        return f"tensorrt is not installed ({exc}); install the 'gpu' extra"
    try:
        cudart = import_cudart("gpu-test")
    except InvalidConfig as exc:
        return f"cuda-python is not installed: {exc}"
    try:
        result = cudart.cudaGetDeviceCount()
    except Exception as exc:  # no driver library at all
        return f"no CUDA GPU is visible (cudaGetDeviceCount raised {exc!r})"
    err, count = result[0], (result[1] if len(result) > 1 else 0)
    if err != cudart.cudaError_t.cudaSuccess or count < 1:
        return f"no CUDA GPU is visible (cudaGetDeviceCount: {getattr(err, 'name', err)}, {count} device(s))"
    return ""


@pytest.fixture(scope="module")
def trt() -> Any:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    import tensorrt

    return tensorrt


@pytest.fixture(scope="module")
def onnx_helper() -> Any:
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (the 'test' extra has it)")
    return onnx


def build_plan(trt: Any, onnx_model: Any, plan: Path, profiles: Sequence[tuple[Shapes, Shapes]]) -> Path:
    """Build ``plan`` from an ONNX model; each profile is (dims ranges, shape-tensor value ranges)."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_model.SerializeToString()):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise AssertionError(f"OnnxParser failed: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 28)
    for shapes, values in profiles:
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            profile.set_shape(name, lo, opt, hi)
        for name, (lo, opt, hi) in values.items():
            profile.set_shape_input(name, lo, opt, hi)
        config.add_optimization_profile(profile)
    blob = builder.build_serialized_network(network, config)
    assert blob is not None, "TensorRT failed to build the engine"
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_bytes(bytes(blob))
    return plan


def add_sub_model(onnx: Any) -> Any:
    from onnx import TensorProto, helper

    fp32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "Y"], ["SUM"]), helper.make_node("Sub", ["X", "Y"], ["DIFF"])],
        "add_sub",
        [
            helper.make_tensor_value_info("X", fp32, ["batch", 4]),
            helper.make_tensor_value_info("Y", fp32, ["batch", 4]),
        ],
        [
            helper.make_tensor_value_info("SUM", fp32, ["batch", 4]),
            helper.make_tensor_value_info("DIFF", fp32, ["batch", 4]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def reshape_model(onnx: Any) -> Any:
    """OUT = Reshape(DATA, SHAPE): SHAPE is a network input used as a shape, so a shape tensor."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["DATA", "SHAPE"], ["OUT"])],
        "reshape",
        [
            helper.make_tensor_value_info("DATA", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("SHAPE", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["a", "b"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


ADD_SUB_PROFILES = [
    ({"X": ((1, 4), (2, 4), (4, 4)), "Y": ((1, 4), (2, 4), (4, 4))}, {}),
    ({"X": ((5, 4), (8, 4), (16, 4)), "Y": ((5, 4), (8, 4), (16, 4))}, {}),
]


@pytest.fixture(scope="module")
def add_sub_plan(trt: Any, onnx_helper: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    plan = tmp_path_factory.mktemp("add_sub") / "1" / "model.plan"
    return build_plan(trt, add_sub_model(onnx_helper), plan, ADD_SUB_PROFILES)


def add_sub_config(profiles: Sequence[str] = ("0", "1"), pinned: bool = True) -> mc.ModelConfig:
    config = mc.ModelConfig(name="add_sub_trt", platform="tensorrt_plan", backend="tensorrt", max_batch_size=16)
    for name in ("X", "Y"):
        config.input.add(name=name, data_type=mc.TYPE_FP32, dims=[4])
    for name in ("SUM", "DIFF"):
        config.output.add(name=name, data_type=mc.TYPE_FP32, dims=[4])
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, count=1, profile=list(profiles))
    config.optimization.input_pinned_memory.enable = pinned
    config.optimization.output_pinned_memory.enable = pinned
    return config


def context(config: mc.ModelConfig, plan: Path) -> BackendContext:
    return BackendContext(
        model_name=config.name, version=1, config=config, model_file=plan, device_kind="KIND_GPU", gpu_ids=(0,)
    )


def batch(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    return rng.standard_normal((n, 4)).astype(np.float32), rng.standard_normal((n, 4)).astype(np.float32)


@pytest.mark.parametrize("pinned", [True, False])
def test_add_sub_uses_each_profile(add_sub_plan: Path, pinned: bool) -> None:
    backend = TensorRTBackend(context(add_sub_config(pinned=pinned), add_sub_plan))
    try:
        assert sorted(backend._contexts) == [0, 1]
        for n in (1, 3, 4, 5, 12, 16):  # 1..4 fit profile 0, 5..16 profile 1
            x, y = batch(n)
            out = backend.execute({"X": x, "Y": y}, ["SUM", "DIFF"])
            np.testing.assert_allclose(out["SUM"], x + y, rtol=1e-6)
            np.testing.assert_allclose(out["DIFF"], x - y, rtol=1e-6)
        x, y = batch(2)
        assert set(backend.execute({"X": x, "Y": y}, ["DIFF"])) == {"DIFF"}
    finally:
        backend.close()


def test_instance_group_profile_limits_the_shapes(add_sub_plan: Path) -> None:
    config = add_sub_config(profiles=("0",))
    config.max_batch_size = 4
    backend = TensorRTBackend(context(config, add_sub_plan))
    try:
        assert sorted(backend._contexts) == [0]
        x, y = batch(12)
        with pytest.raises(InvalidArgument, match="no optimization profile"):
            backend.execute({"X": x, "Y": y}, ["SUM"])
    finally:
        backend.close()


def test_config_that_exceeds_the_profiles_fails_to_load(add_sub_plan: Path) -> None:
    config = add_sub_config(profiles=("0",))  # max_batch_size 16, profile 0 takes 4
    with pytest.raises(InvalidConfig, match="max-batch 4"):
        TensorRTBackend(context(config, add_sub_plan))


def test_model_instance_runs_the_engine(add_sub_plan: Path) -> None:
    instance = ModelInstance(context(add_sub_config(), add_sub_plan))
    try:
        x, y = batch(6)
        result = instance.run(Execution({"X": x, "Y": y}, ("SUM", "DIFF"), 6))
        assert result.error is None, result.error
        np.testing.assert_allclose(result.outputs["SUM"], x + y, rtol=1e-6)
        np.testing.assert_allclose(result.outputs["DIFF"], x - y, rtol=1e-6)
    finally:
        instance.close()


def test_autocomplete_from_the_plan(add_sub_plan: Path) -> None:
    meta = read_plan_metadata(add_sub_plan, model="add_sub_trt")
    base = mc.ModelConfig(name="add_sub_trt", platform="tensorrt_plan", backend="tensorrt")
    config = complete_config_from_engine(base, meta, model="add_sub_trt", path=str(add_sub_plan))
    assert config.max_batch_size == 4  # profile 0 only: no group lists profiles
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("X", mc.TYPE_FP32, [4]),
        ("Y", mc.TYPE_FP32, [4]),
    ]
    assert config.HasField("dynamic_batching")
    base.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, profile=["0", "1"])
    config = complete_config_from_engine(base, meta, model="add_sub_trt", path=str(add_sub_plan))
    assert config.max_batch_size == 16
    normalize_config(config)
    validate_config(config, model="add_sub_trt", path=str(add_sub_plan))


RESHAPE_PROFILES = [({"DATA": ((1,), (6,), (64,))}, {"SHAPE": ((1, 1), (2, 3), (8, 8))})]


@pytest.fixture(scope="module")
def reshape_plan(trt: Any, onnx_helper: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    plan = tmp_path_factory.mktemp("reshape") / "1" / "model.plan"
    return build_plan(trt, reshape_model(onnx_helper), plan, RESHAPE_PROFILES)


def test_shape_tensor_values_shape_the_output(reshape_plan: Path) -> None:
    meta = read_plan_metadata(reshape_plan, model="reshape_trt")
    shape_input = meta.tensor("SHAPE")
    assert shape_input is not None and shape_input.is_shape_tensor
    base = mc.ModelConfig(name="reshape_trt", platform="tensorrt_plan", backend="tensorrt")
    config = complete_config_from_engine(base, meta, model="reshape_trt", path=str(reshape_plan))
    assert config.max_batch_size == 0
    assert [(t.name, t.is_shape_tensor) for t in config.input] == [("DATA", False), ("SHAPE", True)]
    backend = TensorRTBackend(context(config, reshape_plan))
    try:
        data = np.arange(6, dtype=np.float32)
        shape_dtype = datatypes.from_config(mc.DataType.Name(config.input[1].data_type)).numpy
        for shape in ((2, 3), (3, 2), (1, 6)):
            values = np.array(shape, dtype=shape_dtype)
            out = backend.execute({"DATA": data, "SHAPE": values}, ["OUT"])
            np.testing.assert_array_equal(out["OUT"], data.reshape(shape))
        with pytest.raises(InvalidArgument, match="no optimization profile"):
            backend.execute({"DATA": np.arange(90, dtype=np.float32), "SHAPE": np.array([9, 10])}, ["OUT"])
    finally:
        backend.close()
