"""The TensorRT backend without a GPU: its pure rules, and the backend over a fake TensorRT.

The pure part (``serve_app.backends.tensorrt_logic``) is tested directly.  The
backend itself (``serve_app.backends.tensorrt``) runs here against fakes of the
``tensorrt`` module and of cuda-python's runtime API that keep "device" memory
in host buffers, so the order of calls (profile contexts, input shapes, tensor
addresses, host memory for shape tensors, copies through pinned buffers) is
checked on any machine.  What only a real engine shows is in tests/gpu.
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from serve_app.backends import BackendContext, create_backend, tensorrt as trt_backend
from serve_app.backends.tensorrt_logic import (
    CONFIG_TO_TRT,
    TRT_TO_CONFIG,
    EngineMetadata,
    EngineTensor,
    ProfileRange,
    check_config,
    complete_config_from_engine,
    config_type_name,
    engine_can_batch,
    instance_profiles,
    nbytes,
    numpy_dtype,
    output_shape,
    profile_batch_limit,
    select_profile,
    shape_tensor_values,
    trt_dtype_name,
)
from serve_app.config import normalize_config, validate_config
from serve_app.errors import InternalError, InvalidArgument, InvalidConfig
from serve_app.inference.execution import Execution
from serve_app.protos import model_config_pb2 as mc
from serve_app.runtime import ModelInstance

# --------------------------------------------------------------------------- data types


def test_every_trt_type_maps_to_a_config_type_and_numpy() -> None:
    expected = {
        "FLOAT": ("TYPE_FP32", np.float32),
        "HALF": ("TYPE_FP16", np.float16),
        "BF16": ("TYPE_BF16", np.uint16),  # numpy has no bfloat16: its bits travel as uint16
        "INT8": ("TYPE_INT8", np.int8),
        "INT32": ("TYPE_INT32", np.int32),
        "INT64": ("TYPE_INT64", np.int64),
        "BOOL": ("TYPE_BOOL", np.bool_),
        "UINT8": ("TYPE_UINT8", np.uint8),
    }
    assert set(TRT_TO_CONFIG) == set(expected)
    for trt_name, (config_name, np_type) in expected.items():
        assert config_type_name(trt_name) == config_name
        assert numpy_dtype(trt_name) == np.dtype(np_type)
        assert CONFIG_TO_TRT[config_name] == trt_name


@pytest.mark.parametrize("name", ["FP8", "INT4", "FP4", "E8M0"])
def test_trt_types_triton_lacks_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"TensorRT data type {name} has no Triton data type"):
        config_type_name(name)


def test_trt_dtype_name_reads_enum_members() -> None:
    assert trt_dtype_name(SimpleNamespace(name="HALF")) == "HALF"

    class Printed:
        def __str__(self) -> str:
            return "DataType.INT64"

    assert trt_dtype_name(Printed()) == "INT64"


# --------------------------------------------------------------------------- profiles


def rng(lo: Sequence[int], opt: Sequence[int], hi: Sequence[int]) -> ProfileRange:
    return ProfileRange(tuple(lo), tuple(opt), tuple(hi))


def test_profile_range_contains_and_distance() -> None:
    r = rng((1, 4), (2, 4), (8, 4))
    assert r.contains((1, 4)) and r.contains((8, 4))
    assert not r.contains((9, 4)) and not r.contains((2, 5)) and not r.contains((2,))
    assert r.distance((5, 4)) == 3


def groups(*profiles: Sequence[str]) -> mc.ModelConfig:
    config = mc.ModelConfig(name="m", platform="tensorrt_plan")
    for p in profiles:
        config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, profile=list(p))
    return config


def test_instance_profiles_default_to_profile_zero() -> None:
    assert instance_profiles(groups(), None, 3) == (0,)
    assert instance_profiles(groups(()), 0, 3) == (0,)


def test_instance_profiles_of_one_group() -> None:
    config = groups(("2", "0"), ("1",))
    assert instance_profiles(config, 0, 3) == (0, 2)
    assert instance_profiles(config, 1, 3) == (1,)


def test_instance_profiles_without_a_group_index_take_the_union() -> None:
    assert instance_profiles(groups(("2",), ()), None, 3) == (0, 2)
    assert instance_profiles(groups(("2",), ("1",)), None, 3) == (1, 2)


@pytest.mark.parametrize("bad", ["3", "-1", "x", ""])
def test_instance_profiles_out_of_range(bad: str) -> None:
    with pytest.raises(ValueError, match=rf"instance_group\[1\]\.profile: profile '{bad}' is not an optimization"):
        instance_profiles(groups(("0",), (bad,)), None, 3)


def two_profile_engine() -> EngineMetadata:
    x = EngineTensor("X", True, "FLOAT", (-1, 4))
    y = EngineTensor("Y", False, "FLOAT", (-1, 4))
    return EngineMetadata(
        (x, y),
        (
            {"X": rng((1, 4), (2, 4), (4, 4))},
            {"X": rng((1, 4), (8, 4), (16, 4))},
        ),
    )


def test_select_profile_takes_the_nearest_opt() -> None:
    meta = two_profile_engine()
    assert select_profile(meta, (0, 1), {"X": (2, 4)}, model="m") == 0
    assert select_profile(meta, (0, 1), {"X": (4, 4)}, model="m") == 0  # 2 from opt 2, 4 from opt 8
    assert select_profile(meta, (0, 1), {"X": (5, 4)}, model="m") == 1  # outside profile 0
    assert select_profile(meta, (1,), {"X": (2, 4)}, model="m") == 1  # only what the instance may use


def test_select_profile_ties_go_to_the_lowest_index() -> None:
    meta = EngineMetadata((EngineTensor("X", True, "FLOAT", (-1,)),), ({"X": rng((1,), (4,), (8,))},) * 2)
    assert select_profile(meta, (0, 1), {"X": (6,)}, model="m") == 0


def test_select_profile_explains_why_none_fits() -> None:
    with pytest.raises(InvalidArgument) as err:
        select_profile(two_profile_engine(), (0, 1), {"X": (20, 4)}, model="m")
    assert err.value.message == (
        "model 'm': no optimization profile of this instance (profiles [0, 1]) accepts the request's inputs: "
        "profile 0: input 'X' shape [20,4] is outside [1,4]..[4,4]; "
        "profile 1: input 'X' shape [20,4] is outside [1,4]..[16,4]"
    )


def test_select_profile_checks_shape_tensor_values() -> None:
    s = EngineTensor("S", True, "INT32", (2,), is_shape_tensor=True, on_host=True)
    meta = EngineMetadata((s,), ({"S": rng((1, 1), (2, 2), (4, 4))}, {"S": rng((1, 1), (8, 8), (16, 16))}))
    assert select_profile(meta, (0, 1), {}, {"S": (3, 3)}, model="m") == 0
    assert select_profile(meta, (0, 1), {}, {"S": (5, 1)}, model="m") == 1
    with pytest.raises(InvalidArgument, match=r"input 'S' values \[17,1\] is outside \[1,1\]..\[16,16\]"):
        select_profile(meta, (1,), {}, {"S": (17, 1)}, model="m")


def test_batch_limit_and_batchability() -> None:
    meta = EngineMetadata(
        (
            EngineTensor("A", True, "FLOAT", (-1, 3)),
            EngineTensor("B", True, "FLOAT", (-1, 3)),
            EngineTensor("O", False, "FLOAT", (-1, 3)),
        ),
        (
            {"A": rng((1, 3), (4, 3), (8, 3)), "B": rng((1, 3), (4, 3), (6, 3))},
            {"A": rng((1, 3), (4, 3), (32, 3)), "B": rng((1, 3), (4, 3), (32, 3))},
        ),
    )
    assert engine_can_batch(meta)
    assert profile_batch_limit(meta, (0,)) == 6  # the smallest max over the inputs
    assert profile_batch_limit(meta, (0, 1)) == 32  # the largest over the profiles
    static = EngineMetadata((EngineTensor("A", True, "FLOAT", (1, 3)), EngineTensor("O", False, "FLOAT", (1, 3))))
    assert not engine_can_batch(static)
    scalar_out = EngineMetadata((EngineTensor("A", True, "FLOAT", (-1,)), EngineTensor("O", False, "FLOAT", ())))
    assert not engine_can_batch(scalar_out)


# --------------------------------------------------------------------------- per execution


def test_shape_tensor_values_without_batching() -> None:
    got = shape_tensor_values("S", np.array([2, 3], np.int32), engine_shape=(2,), batch_size=None, model="m")
    assert got.tolist() == [2, 3] and got.dtype == np.int64
    with pytest.raises(InvalidArgument, match="shape tensor 'S' needs 2 values, got 3"):
        shape_tensor_values("S", np.array([1, 2, 3]), engine_shape=(2,), batch_size=None, model="m")


def test_shape_tensor_values_put_the_batch_size_first() -> None:
    got = shape_tensor_values("S", np.array([2, 3]), engine_shape=(3,), batch_size=5, model="m")
    assert got.tolist() == [5, 2, 3]


def test_shape_tensor_values_of_a_merged_batch_are_taken_once() -> None:
    merged = np.array([2, 3, 2, 3, 2, 3])
    assert shape_tensor_values("S", merged, engine_shape=(3,), batch_size=6, model="m").tolist() == [6, 2, 3]
    with pytest.raises(InvalidArgument, match=r"needs 2 values \(the batch size is added first\), got 4"):
        shape_tensor_values("S", np.array([2, 3, 4, 3]), engine_shape=(3,), batch_size=2, model="m")


def test_output_shape() -> None:
    assert output_shape("O", (3, 4), model="m") == (3, 4)
    with pytest.raises(InternalError, match="data-dependent output shapes are not supported"):
        output_shape("O", (3, -1), model="m")
    with pytest.raises(InternalError, match="reports no shape"):
        output_shape("O", None, model="m")
    assert nbytes((3, 4), np.dtype(np.float16)) == 24
    assert nbytes((), np.dtype(np.int64)) == 8


# --------------------------------------------------------------------------- config vs engine


def add_sub_meta(max_batch: int = 8) -> EngineMetadata:
    tensors = (
        EngineTensor("X", True, "FLOAT", (-1, 4)),
        EngineTensor("Y", True, "FLOAT", (-1, 4)),
        EngineTensor("SUM", False, "FLOAT", (-1, 4)),
        EngineTensor("DIFF", False, "FLOAT", (-1, 4)),
    )
    r = rng((1, 4), (2, 4), (max_batch, 4))
    return EngineMetadata(tensors, ({"X": r, "Y": r}, {"X": rng((1, 4), (16, 4), (32, 4)), "Y": r}))


def add_sub_config(max_batch_size: int = 8) -> mc.ModelConfig:
    config = mc.ModelConfig(name="m", platform="tensorrt_plan", backend="tensorrt", max_batch_size=max_batch_size)
    for name in ("X", "Y"):
        config.input.add(name=name, data_type=mc.TYPE_FP32, dims=[4])
    for name in ("SUM", "DIFF"):
        config.output.add(name=name, data_type=mc.TYPE_FP32, dims=[4])
    return config


def test_check_config_accepts_a_matching_config() -> None:
    check_config(add_sub_config(), add_sub_meta(), (0,))
    reshaped = add_sub_config()
    reshaped.input[0].ClearField("dims")
    reshaped.input[0].dims.extend([2, 2])
    reshaped.input[0].reshape.shape.extend([4])
    check_config(reshaped, add_sub_meta(), (0,))  # the reshape is what the engine sees


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda c: setattr(c.input[0], "name", "Z"),
            "input[0].name: unexpected inference input 'Z', allowed inputs are: X, Y",
        ),
        (
            lambda c: setattr(c.output[1], "name", "PROD"),
            "output[1].name: unexpected inference output 'PROD', allowed outputs are: DIFF, SUM",
        ),
        (lambda c: c.input.pop(), "input: the TensorRT engine's input(s) ['Y'] are not in the model configuration"),
        (
            lambda c: setattr(c.input[1], "data_type", mc.TYPE_FP16),
            "input[1]: 'Y' has data type TYPE_FP16 but the TensorRT engine expects TYPE_FP32",
        ),
        (
            lambda c: setattr(c.input[1], "is_shape_tensor", True),
            "input[1]: 'Y' is incorrectly specified as a shape tensor: the engine's is an execution tensor",
        ),
        (
            lambda c: c.output[0].dims.append(2),
            "output[0]: the TensorRT engine's 'SUM' has shape [-1,4] but the configuration specifies [-1,4,2] "
            "(an initial batch dimension because max_batch_size > 0, followed by the configured dims)",
        ),
        (
            lambda c: setattr(c, "max_batch_size", 0),
            "input[0]: the TensorRT engine's 'X' has shape [-1,4] but the configuration specifies [4]",
        ),
        (
            lambda c: setattr(c, "max_batch_size", 9),
            "max_batch_size: configuration specified max-batch 9 but the TensorRT engine's profiles [0] only "
            "support max-batch 8",
        ),
    ],
    ids=["input-name", "output-name", "missing-input", "data-type", "shape-flag", "dims", "no-batch", "max-batch"],
)
def test_check_config_rejects(change: Callable[[mc.ModelConfig], Any], message: str) -> None:
    config = add_sub_config()
    change(config)
    with pytest.raises(ValueError) as err:
        check_config(config, add_sub_meta(), (0,))
    assert str(err.value) == message


def test_check_config_batch_limit_follows_the_instance_profiles() -> None:
    check_config(add_sub_config(8), add_sub_meta(), (0, 1))
    with pytest.raises(ValueError, match="only support max-batch 8"):
        check_config(add_sub_config(16), add_sub_meta(), (0, 1))  # profile 1 takes 32 X but only 8 Y


def test_check_config_leaves_sequence_fed_inputs_out() -> None:
    meta = add_sub_meta()
    meta = EngineMetadata((*meta.tensors, EngineTensor("START", True, "INT32", (-1, 1))), meta.profiles)
    config = add_sub_config()
    with pytest.raises(ValueError, match=r"\['START'\] are not in the model configuration"):
        check_config(config, meta, (0,))
    config.sequence_batching.control_input.add(name="START")
    check_config(config, meta, (0,))


def shape_meta() -> EngineMetadata:
    return EngineMetadata(
        (
            EngineTensor("X", True, "FLOAT", (-1, -1)),
            EngineTensor("S", True, "INT64", (3,), is_shape_tensor=True, on_host=True),
            EngineTensor("OUT", False, "FLOAT", (-1, -1, -1)),
        ),
        ({"X": rng((1, 1), (2, 6), (8, 64)), "S": rng((1, 1, 1), (2, 2, 3), (8, 8, 8))},),
    )


def shape_config() -> mc.ModelConfig:
    config = mc.ModelConfig(name="m", platform="tensorrt_plan", backend="tensorrt", max_batch_size=8)
    config.input.add(name="X", data_type=mc.TYPE_FP32, dims=[-1])
    config.input.add(name="S", data_type=mc.TYPE_INT64, dims=[2], is_shape_tensor=True)
    config.output.add(name="OUT", data_type=mc.TYPE_FP32, dims=[-1, -1])
    return config


def test_check_config_shape_tensors() -> None:
    check_config(shape_config(), shape_meta(), (0,))
    config = shape_config()
    config.input[1].is_shape_tensor = False
    with pytest.raises(ValueError, match="'S' is incorrectly specified as an execution tensor"):
        check_config(config, shape_meta(), (0,))
    config = shape_config()
    config.input[1].dims[0] = 3
    with pytest.raises(ValueError, match=r"engine shape \[3\] \(the batch size is its first value\), so its dims"):
        check_config(config, shape_meta(), (0,))


# --------------------------------------------------------------------------- auto-complete


def complete(config: mc.ModelConfig, meta: EngineMetadata) -> mc.ModelConfig:
    return complete_config_from_engine(config, meta, model="m", path="1/model.plan")


def ios(items: Sequence[mc.ModelInput] | Sequence[mc.ModelOutput]) -> list[tuple[str, str, list[int], bool]]:
    return [(t.name, mc.DataType.Name(t.data_type), list(t.dims), t.HasField("reshape")) for t in items]


def bare() -> mc.ModelConfig:
    return mc.ModelConfig(name="m", platform="tensorrt_plan", backend="tensorrt")


def test_complete_a_batching_engine() -> None:
    out = complete(bare(), add_sub_meta())
    assert out.max_batch_size == 8  # profile 0: no group lists profiles
    assert out.HasField("dynamic_batching")
    assert ios(out.input) == [("X", "TYPE_FP32", [4], False), ("Y", "TYPE_FP32", [4], False)]
    assert ios(out.output) == [("SUM", "TYPE_FP32", [4], False), ("DIFF", "TYPE_FP32", [4], False)]
    normalize_config(out)
    validate_config(out, model="m", path="config.pbtxt")
    check_config(out, add_sub_meta(), (0,))


def test_complete_uses_the_groups_profiles() -> None:
    config = bare()
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, profile=["1"])
    meta = add_sub_meta()
    meta = EngineMetadata(
        meta.tensors, (meta.profiles[0], {"X": rng((1, 4), (8, 4), (32, 4))} | {"Y": rng((1, 4), (8, 4), (24, 4))})
    )
    assert complete(config, meta).max_batch_size == 24


def test_complete_a_static_engine_does_not_batch() -> None:
    meta = EngineMetadata(
        (EngineTensor("X", True, "FLOAT", (1, 16)), EngineTensor("Y", False, "HALF", (1, 16))),
        ({"X": rng((1, 16), (1, 16), (1, 16))},),
    )
    out = complete(bare(), meta)
    assert out.max_batch_size == 0 and not out.HasField("dynamic_batching")
    assert ios(out.input) == [("X", "TYPE_FP32", [1, 16], False)]
    assert ios(out.output) == [("Y", "TYPE_FP16", [1, 16], False)]


def test_complete_batch_only_tensors_get_an_empty_reshape() -> None:
    meta = EngineMetadata(
        (EngineTensor("X", True, "INT32", (-1,)), EngineTensor("Y", False, "INT32", (-1,))),
        ({"X": rng((1,), (1,), (4,))},),
    )
    out = complete(bare(), meta)
    assert out.max_batch_size == 4
    assert ios(out.input) == [("X", "TYPE_INT32", [1], True)]
    normalize_config(out)
    validate_config(out, model="m", path="config.pbtxt")


def test_complete_shape_tensors() -> None:
    out = complete(bare(), shape_meta())
    assert out.max_batch_size == 8
    assert [(t.name, list(t.dims), t.is_shape_tensor) for t in out.input] == [("X", [-1], False), ("S", [2], True)]
    check_config(out, shape_meta(), (0,))
    config = bare()
    config.input.add(name="X", is_shape_tensor=True)
    with pytest.raises(InvalidConfig, match="'X' is incorrectly specified as a shape tensor"):
        complete(config, shape_meta())


def test_complete_fills_only_what_is_missing() -> None:
    config = bare()
    config.input.add(name="Y")
    config.input.add(name="X", data_type=mc.TYPE_FP32)
    config.output.add(name="DIFF", dims=[4])
    out = complete(config, add_sub_meta())
    assert out.max_batch_size == 8  # DIFF's dims [4] + batch = the engine's rank: a batch hint
    assert ios(out.input) == [("Y", "TYPE_FP32", [4], False), ("X", "TYPE_FP32", [4], False)]
    assert ios(out.output) == [("DIFF", "TYPE_FP32", [4], False)]  # a listed subset stays a subset


def test_complete_configured_dims_without_a_batch_keep_it_off() -> None:
    config = bare()
    config.input.add(name="X", dims=[-1, 4])
    out = complete(config, add_sub_meta())
    assert out.max_batch_size == 0
    assert list(out.input[0].dims) == [-1, 4]


def test_complete_errors() -> None:
    config = bare()
    config.max_batch_size = 9
    with pytest.raises(InvalidConfig, match="configuration specified max-batch 9 but the TensorRT engine only"):
        complete(config, add_sub_meta())
    static = EngineMetadata(
        (EngineTensor("X", True, "FLOAT", (2, 4)), EngineTensor("Y", False, "FLOAT", (2, 4))),
        ({"X": rng((2, 4), (2, 4), (2, 4))},),
    )
    config = bare()
    config.input.add(name="X", dims=[4])
    with pytest.raises(InvalidConfig, match="hint at a batch dimension but the TensorRT engine does not support"):
        complete(config, static)
    config = bare()
    config.input.add(name="X", dims=[4])
    config.input.add(name="Y", dims=[-1, 4])
    with pytest.raises(InvalidConfig, match="'X' imply a batch dimension but those of 'Y' do not"):
        complete(config, add_sub_meta())
    config = bare()
    config.instance_group.add(profile=["7"])
    with pytest.raises(InvalidConfig, match=r"unable to autofill: instance_group\[0\].profile: profile '7'"):
        complete(config, add_sub_meta())
    fp8 = EngineMetadata((EngineTensor("X", True, "FP8", (-1,)), EngineTensor("Y", False, "FLOAT", (-1,))), ({},))
    with pytest.raises(InvalidConfig, match=r"input\[0\].data_type: 'X': TensorRT data type FP8 has no Triton"):
        complete(bare(), fp8)


def test_complete_leaves_sequence_fed_inputs_out() -> None:
    meta = add_sub_meta()
    meta = EngineMetadata((*meta.tensors, EngineTensor("START", True, "INT32", (-1, 1))), meta.profiles)
    config = bare()
    config.sequence_batching.control_input.add(name="START")
    assert [t.name for t in complete(config, meta).input] == ["X", "Y"]


# --------------------------------------------------------------------------- the backend over fakes


class FakeEnum:
    def __init__(self, name: str, value: int) -> None:
        self.name, self.value = name, value

    def __int__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"Fake.{self.name}"


INPUT, OUTPUT = FakeEnum("INPUT", 1), FakeEnum("OUTPUT", 2)
DEVICE, HOST = FakeEnum("DEVICE", 0), FakeEnum("HOST", 1)
DTYPES = {np.dtype(np.float32): "FLOAT", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}


@dataclass
class FakeTensor:
    name: str
    is_input: bool
    dtype: np.dtype
    shape: tuple[int, ...]
    shape_tensor: bool = False


@dataclass
class FakeEngine:
    """An engine: tensors, profiles (name -> (min, opt, max)), and what it computes."""

    tensors: list[FakeTensor]
    profiles: list[dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]]
    shapes: Callable[[Mapping[str, tuple[int, ...]], Mapping[str, np.ndarray]], dict[str, tuple[int, ...]]]
    compute: Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    runs: list[int] = field(default_factory=list)  # the profile of each execution
    fail_execution: bool = False

    def _t(self, name: str) -> FakeTensor:
        return next(t for t in self.tensors if t.name == name)

    @property
    def num_io_tensors(self) -> int:
        return len(self.tensors)

    @property
    def num_optimization_profiles(self) -> int:
        return len(self.profiles)

    def get_tensor_name(self, i: int) -> str:
        return self.tensors[i].name

    def get_tensor_mode(self, name: str) -> FakeEnum:
        return INPUT if self._t(name).is_input else OUTPUT

    def get_tensor_dtype(self, name: str) -> FakeEnum:
        return FakeEnum(DTYPES[self._t(name).dtype], 0)

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._t(name).shape

    def is_shape_inference_io(self, name: str) -> bool:
        return self._t(name).shape_tensor

    def get_tensor_location(self, name: str) -> FakeEnum:
        return HOST if self._t(name).shape_tensor else DEVICE

    def get_tensor_profile_shape(self, name: str, profile: int) -> list[tuple[int, ...]]:
        assert not self._t(name).shape_tensor
        return list(self.profiles[profile][name])

    def get_tensor_profile_values(self, profile: int, name: str) -> list[list[int]]:
        # TensorRT's bindings take (profile_index, name), whatever their argument names say
        assert isinstance(profile, int) and self._t(name).shape_tensor
        return [list(v) for v in self.profiles[profile][name]]

    def create_execution_context(self) -> FakeContext:
        return FakeContext(self)


class FakeContext:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.profile = 0
        self.input_shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}

    def set_optimization_profile_async(self, profile: int, stream: int) -> bool:
        assert isinstance(stream, int)
        self.profile = profile
        return True

    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool:
        shape = tuple(int(d) for d in shape)
        t = self.engine._t(name)
        if not t.shape_tensor:
            lo, _, hi = self.engine.profiles[self.profile][name]
            if len(shape) != len(lo) or not all(a <= d <= b for a, d, b in zip(lo, shape, hi, strict=True)):
                return False
        self.input_shapes[name] = shape
        return True

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.addresses[name] = int(address)
        return True

    def _read(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        dtype = self.engine._t(name).dtype
        size = math.prod(shape) * dtype.itemsize
        raw = (ctypes.c_uint8 * size).from_address(self.addresses[name])
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()

    def _values(self) -> dict[str, np.ndarray]:
        """Shape tensors are read from their (host) address, as TensorRT does."""
        return {
            t.name: self._read(t.name, self.input_shapes.get(t.name, t.shape))
            for t in self.engine.tensors
            if t.is_input and t.shape_tensor
        }

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.engine.shapes(self.input_shapes, self._values())[name]

    def execute_async_v3(self, stream: int) -> bool:
        assert isinstance(stream, int)
        if self.engine.fail_execution:
            return False
        self.engine.runs.append(self.profile)
        tensors = {
            t.name: self._read(t.name, self.input_shapes[t.name])
            for t in self.engine.tensors
            if t.is_input and not t.shape_tensor
        }
        for name, arr in self.engine.compute(tensors, self._values()).items():
            data = np.ascontiguousarray(arr, dtype=self.engine._t(name).dtype)
            ctypes.memmove(self.addresses[name], data.ctypes.data, data.nbytes)
        return True


class FakeTrt(SimpleNamespace):
    """The parts of the ``tensorrt`` module the backend uses; plans are looked up by their bytes."""

    def __init__(self, engines: Mapping[bytes, FakeEngine]) -> None:
        class ILogger:
            def __init__(self) -> None:
                pass

        class Logger:
            WARNING = FakeEnum("WARNING", 2)

            def __init__(self, severity: Any = None) -> None:
                pass

        class Runtime:
            def __init__(self, logger: Any) -> None:
                self.logger = logger

            def deserialize_cuda_engine(self, data: bytes) -> FakeEngine | None:
                engine = engines.get(bytes(data))
                if engine is None:
                    self.logger.log(FakeEnum("ERROR", 1), "the plan is not a TensorRT engine")
                return engine

        super().__init__(
            ILogger=ILogger,
            Logger=Logger,
            Runtime=Runtime,
            TensorIOMode=SimpleNamespace(INPUT=INPUT, OUTPUT=OUTPUT),
            TensorLocation=SimpleNamespace(DEVICE=DEVICE, HOST=HOST),
        )


class FakeStream:
    def __int__(self) -> int:
        return 4242


class FakeCudart:
    """cuda-python's runtime API with "device" memory in host buffers."""

    cudaError_t = SimpleNamespace(cudaSuccess=0)
    cudaMemcpyKind = SimpleNamespace(cudaMemcpyHostToDevice="h2d", cudaMemcpyDeviceToHost="d2h")

    def __init__(self) -> None:
        self.device: dict[int, Any] = {}
        self.pinned: dict[int, Any] = {}
        self.copies: list[tuple[str, bool]] = []  # (kind, whether the host side was pinned)
        self.current_device: int | None = None

    def _alloc(self, table: dict[int, Any], size: int) -> tuple[int, int]:
        buf = ctypes.create_string_buffer(size)
        table[ctypes.addressof(buf)] = buf
        return 0, ctypes.addressof(buf)

    def cudaGetDeviceCount(self) -> tuple[int, int]:
        return 0, 1

    def cudaSetDevice(self, device: int) -> tuple[int]:
        self.current_device = device
        return (0,)

    def cudaMalloc(self, size: int) -> tuple[int, int]:
        return self._alloc(self.device, size)

    def cudaFree(self, ptr: int) -> tuple[int]:
        del self.device[ptr]
        return (0,)

    def cudaMallocHost(self, size: int) -> tuple[int, int]:
        return self._alloc(self.pinned, size)

    def cudaFreeHost(self, ptr: int) -> tuple[int]:
        del self.pinned[ptr]
        return (0,)

    def cudaMemcpyAsync(self, dst: int, src: int, size: int, kind: str, stream: Any) -> tuple[int]:
        assert isinstance(stream, FakeStream)
        device, host = (dst, src) if kind == "h2d" else (src, dst)
        assert device in self.device, "one side of a copy must be device memory"
        self.copies.append((kind, host in self.pinned))
        ctypes.memmove(dst, src, size)
        return (0,)

    def cudaStreamCreate(self) -> tuple[int, FakeStream]:
        return 0, FakeStream()

    def cudaStreamSynchronize(self, stream: Any) -> tuple[int]:
        return (0,)

    def cudaStreamDestroy(self, stream: Any) -> tuple[int]:
        return (0,)


def add_sub_engine() -> FakeEngine:
    f32 = np.dtype(np.float32)

    def shapes(inp: Mapping[str, tuple[int, ...]], _values: Any) -> dict[str, tuple[int, ...]]:
        return {"SUM": inp["X"], "DIFF": inp["X"]}

    def compute(t: Mapping[str, np.ndarray], _values: Any) -> dict[str, np.ndarray]:
        return {"SUM": t["X"] + t["Y"], "DIFF": t["X"] - t["Y"]}

    p0 = ((1, 4), (2, 4), (4, 4))
    p1 = ((1, 4), (8, 4), (16, 4))
    return FakeEngine(
        [
            FakeTensor("X", True, f32, (-1, 4)),
            FakeTensor("Y", True, f32, (-1, 4)),
            FakeTensor("SUM", False, f32, (-1, 4)),
            FakeTensor("DIFF", False, f32, (-1, 4)),
        ],
        [{"X": p0, "Y": p0}, {"X": p1, "Y": p1}],
        shapes,
        compute,
    )


def reshape_engine(batching: bool) -> FakeEngine:
    """OUT = X reshaped by the shape tensor S (whose first value is the batch size when batching)."""
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    n = 3 if batching else 2

    def shapes(_inp: Any, values: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
        return {"OUT": tuple(int(v) for v in values["S"])}

    def compute(t: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"OUT": t["X"].reshape(tuple(int(v) for v in values["S"]))}

    x_shape = (-1, -1) if batching else (-1,)
    x_range = ((1, 1), (2, 6), (8, 64)) if batching else ((1,), (6,), (64,))
    return FakeEngine(
        [
            FakeTensor("X", True, f32, x_shape),
            FakeTensor("S", True, i64, (n,), shape_tensor=True),
            FakeTensor("OUT", False, f32, (-1,) * n),
        ],
        [{"X": x_range, "S": ((1,) * n, (2,) * n, (8,) * n)}],
        shapes,
        compute,
    )


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., tuple[Any, FakeCudart, Path]]:
    """Install fakes; returns make(engine) -> (plan path, cudart)."""
    engines: dict[bytes, FakeEngine] = {}
    cudart = FakeCudart()
    monkeypatch.setattr(trt_backend, "import_tensorrt", lambda model: FakeTrt(engines))
    monkeypatch.setattr(trt_backend, "import_cudart", lambda model: cudart)

    def make(engine: FakeEngine, name: str = "engine") -> tuple[Any, FakeCudart, Path]:
        key = f"plan:{name}".encode()
        engines[key] = engine
        plan = tmp_path / name / "1" / "model.plan"
        plan.parent.mkdir(parents=True, exist_ok=True)
        plan.write_bytes(key)
        return engine, cudart, plan

    return make


def ctx_for(config: mc.ModelConfig, plan: Path, **extra: Any) -> Any:
    base = {
        "model_name": config.name,
        "version": 1,
        "config": config,
        "model_file": plan,
        "device_kind": "KIND_GPU",
        "gpu_ids": (0,),
    }
    if extra:  # BackendContext has no such field yet: a duck-typed context
        return SimpleNamespace(**base, **extra, parameter=lambda key, default="": default)
    return BackendContext(**base)


def xy(n: int) -> dict[str, np.ndarray]:
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
    return {"X": x, "Y": np.full((n, 4), 0.5, dtype=np.float32)}


def test_read_engine_metadata(fakes: Any) -> None:
    engine, _, _ = fakes(reshape_engine(batching=True))
    meta = trt_backend.read_engine_metadata(FakeTrt({}), engine)
    assert [(t.name, t.is_input, t.dtype, t.shape, t.is_shape_tensor, t.on_host) for t in meta.tensors] == [
        ("X", True, "FLOAT", (-1, -1), False, False),
        ("S", True, "INT64", (3,), True, True),
        ("OUT", False, "FLOAT", (-1, -1, -1), False, False),
    ]
    assert meta.profiles == ({"X": rng((1, 1), (2, 6), (8, 64)), "S": rng((1, 1, 1), (2, 2, 2), (8, 8, 8))},)


@pytest.mark.parametrize("pinned", [True, False])
def test_backend_runs_on_the_nearest_profile(fakes: Any, pinned: bool) -> None:
    engine, cudart, plan = fakes(add_sub_engine())
    config = add_sub_config(16)
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, profile=["0", "1"])
    config.optimization.input_pinned_memory.enable = pinned
    config.optimization.output_pinned_memory.enable = pinned
    backend = trt_backend.TensorRTBackend(ctx_for(config, plan))
    assert sorted(backend._contexts) == [0, 1]
    assert {p: c.profile for p, c in backend._contexts.items()} == {0: 0, 1: 1}
    for n in (2, 4, 9, 16):
        out = backend.execute(xy(n), ["SUM", "DIFF"])
        np.testing.assert_array_equal(out["SUM"], xy(n)["X"] + 0.5)
        np.testing.assert_array_equal(out["DIFF"], xy(n)["X"] - 0.5)
    assert engine.runs == [0, 0, 1, 1]
    assert cudart.copies and all(on_pinned == pinned for _, on_pinned in cudart.copies)
    assert bool(cudart.pinned) == pinned
    assert set(backend.execute(xy(1), ["DIFF"])) == {"DIFF"}
    assert cudart.copies[-1] == ("d2h", pinned)  # one copy back: only DIFF was asked for
    backend.close()
    assert not cudart.device and not cudart.pinned


def test_backend_reports_shapes_no_profile_takes(fakes: Any) -> None:
    _, _, plan = fakes(add_sub_engine())
    config = add_sub_config(4)
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, profile=["0"])
    backend = trt_backend.TensorRTBackend(ctx_for(config, plan))
    with pytest.raises(InvalidArgument, match=r"profiles \[0\]\) accepts the request's inputs: profile 0: input 'X'"):
        backend.execute(xy(9), ["SUM"])
    with pytest.raises(InvalidArgument, match="input 'Y' is required by the TensorRT engine"):
        backend.execute({"X": xy(1)["X"]}, ["SUM"])
    with pytest.raises(InvalidArgument, match="input 'Y' has data type float64"):
        backend.execute({"X": xy(1)["X"], "Y": np.zeros((1, 4))}, ["SUM"])


def test_backend_uses_the_instance_group_it_is_told(fakes: Any) -> None:
    engine, _, plan = fakes(add_sub_engine())
    config = add_sub_config(16)
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, profile=["0"])
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, profile=["1"])
    backend = trt_backend.TensorRTBackend(ctx_for(config, plan, instance_group=1))
    assert sorted(backend._contexts) == [1]
    backend.execute(xy(2), ["SUM"])
    assert engine.runs == [1]
    union = trt_backend.TensorRTBackend(ctx_for(config, plan))  # group unknown: both groups' profiles
    assert sorted(union._contexts) == [0, 1]


def test_backend_shape_tensor_values_go_in_host_memory(fakes: Any) -> None:
    _, cudart, plan = fakes(reshape_engine(batching=False))
    config = mc.ModelConfig(name="r", platform="tensorrt_plan", backend="tensorrt")
    config.input.add(name="X", data_type=mc.TYPE_FP32, dims=[-1])
    config.input.add(name="S", data_type=mc.TYPE_INT64, dims=[2], is_shape_tensor=True)
    config.output.add(name="OUT", data_type=mc.TYPE_FP32, dims=[-1, -1])
    backend = trt_backend.TensorRTBackend(ctx_for(config, plan))
    x = np.arange(6, dtype=np.float32)
    for shape in ((2, 3), (3, 2)):
        out = backend.execute({"X": x, "S": np.array(shape, dtype=np.int64)}, ["OUT"])
        np.testing.assert_array_equal(out["OUT"], x.reshape(shape))
    # only X and OUT crossed to the "device": S was read from host memory
    assert len(cudart.copies) == 4
    context = backend._contexts[0]
    assert context.addresses["S"] not in cudart.device


def test_backend_shape_tensor_gets_the_batch_size_first(fakes: Any) -> None:
    _, _, plan = fakes(reshape_engine(batching=True))
    backend = trt_backend.TensorRTBackend(ctx_for(shape_config(), plan))
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    out = backend.execute({"X": x, "S": np.array([2, 3], dtype=np.int64)}, ["OUT"])
    np.testing.assert_array_equal(out["OUT"], x.reshape(2, 2, 3))
    merged = np.array([2, 3, 2, 3], dtype=np.int64)  # two requests' values, concatenated
    out = backend.execute({"X": x, "S": merged}, ["OUT"])
    assert out["OUT"].shape == (2, 2, 3)


def test_model_instance_over_the_backend(fakes: Any) -> None:
    _, _, plan = fakes(add_sub_engine())
    ctx = ctx_for(add_sub_config(4), plan)
    instance = ModelInstance(ctx)  # through the engine registry: backend "tensorrt"
    assert isinstance(instance.backend, trt_backend.TensorRTBackend)
    result = instance.run(Execution(xy(3), ("SUM",), 3))
    assert result.error is None
    np.testing.assert_array_equal(result.outputs["SUM"], xy(3)["X"] + 0.5)
    bad = instance.run(Execution(xy(7), ("SUM",), 7))
    assert isinstance(bad.error, InvalidArgument)
    instance.close()


def test_backend_load_errors(fakes: Any) -> None:
    _, _, plan = fakes(add_sub_engine())
    config = add_sub_config(8)
    cpu = BackendContext("m", 1, config, plan, device_kind="KIND_CPU")
    with pytest.raises(InvalidConfig, match="TensorRT models run on GPUs only; use an instance group of kind KIND_GPU"):
        create_backend(cpu)
    garbage = plan.parent / "garbage.plan"
    garbage.write_bytes(b"not a plan")
    with pytest.raises(InvalidConfig, match="could not deserialize the engine: the plan is not a TensorRT engine"):
        trt_backend.TensorRTBackend(ctx_for(config, garbage))
    config.input[0].data_type = mc.TYPE_INT32
    with pytest.raises(InvalidConfig, match="model 'm': input\\[0\\]: 'X' has data type TYPE_INT32"):
        trt_backend.TensorRTBackend(ctx_for(config, plan))
    config = add_sub_config(8)
    config.instance_group.add(profile=["2"])
    with pytest.raises(InvalidConfig, match=r"instance_group\[0\].profile: profile '2' is not an optimization profile"):
        trt_backend.TensorRTBackend(ctx_for(config, plan))


def test_backend_execution_errors(fakes: Any) -> None:
    engine, _, plan = fakes(add_sub_engine())
    backend = trt_backend.TensorRTBackend(ctx_for(add_sub_config(4), plan))
    engine.fail_execution = True
    with pytest.raises(InternalError, match="TensorRT execution failed"):
        backend.execute(xy(1), ["SUM"])
    engine.fail_execution = False
    engine.shapes = lambda inp, values: {"SUM": (-1, 4), "DIFF": inp["X"]}
    with pytest.raises(InternalError, match="data-dependent output shapes are not supported"):
        backend.execute(xy(1), ["SUM"])


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="tensorrt is installed here")
def test_missing_tensorrt_names_the_gpu_extra(tmp_path: Path) -> None:
    ctx = BackendContext("m", 1, add_sub_config(), tmp_path / "model.plan", device_kind="KIND_GPU", gpu_ids=(0,))
    with pytest.raises(InvalidConfig) as err:
        create_backend(ctx)
    assert "the TensorRT backend needs the 'tensorrt' package" in err.value.message
    assert "install the 'gpu' extra (pip install 'serve_app[gpu]')" in err.value.message
