"""ONNX Runtime session options and execution providers, decided from the config.

``select_providers`` is a pure function of (config, device kind, GPU ids,
available providers), so every GPU case is tested here without a GPU; the CPU
path is also run end to end through a real CPU session.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, save

from serve_app.backends import BackendContext, create_backend
from serve_app.backends.onnxruntime import (
    CPU_EP,
    CUDA_EP,
    OPENVINO_EP,
    TENSORRT_EP,
    providers,
    select_providers,
    session_options,
)
from serve_app.config import parse_config
from serve_app.errors import InvalidConfig
from serve_app.protos import model_config_pb2 as mc

CPU_ONLY = ("AzureExecutionProvider", CPU_EP)
GPU = (TENSORRT_EP, CUDA_EP, CPU_EP)
ALL = (TENSORRT_EP, CUDA_EP, OPENVINO_EP, CPU_EP)


def config(text: str = "") -> mc.ModelConfig:
    text = 'name: "m"\nplatform: "onnxruntime_onnx"\nbackend: "onnxruntime"\n' + text
    return parse_config(text, model="m", path="config.pbtxt")


def select(
    text: str = "", kind: str = "KIND_GPU", gpu_ids: Sequence[int] = (0,), available: Sequence[str] = GPU
) -> list[object]:
    return select_providers(config(text), kind, tuple(gpu_ids), list(available), model="m")


def error(text: str = "", kind: str = "KIND_GPU", available: Sequence[str] = GPU) -> str:
    with pytest.raises(InvalidConfig) as err:
        select(text, kind, available=available)
    return err.value.message


TRT = """optimization { execution_accelerators { gpu_execution_accelerator [ {
  name: "tensorrt"
  %s
} ] } }"""


def trt(*params: tuple[str, str]) -> str:
    return TRT % "\n".join(f'parameters {{ key: "{k}" value: "{v}" }}' for k, v in params)


# --------------------------------------------------------------------------- CPU instances


def test_cpu_instance_uses_the_cpu_provider_only() -> None:
    assert select(kind="KIND_CPU", available=CPU_ONLY) == [CPU_EP]
    assert select(kind="KIND_MODEL", available=CPU_ONLY) == [CPU_EP]


def test_gpu_accelerators_are_ignored_on_a_cpu_instance() -> None:
    text = (
        trt(("precision_mode", "FP16")) + '\nparameters { key: "cudnn_conv_algo_search" value: { string_value: "9" } }'
    )
    assert select(text, kind="KIND_CPU", available=CPU_ONLY) == [CPU_EP]


OPENVINO = 'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" %s } ] } }'


def test_openvino_on_a_cpu_instance() -> None:
    assert select(OPENVINO % "", kind="KIND_CPU", available=(OPENVINO_EP, CPU_EP)) == [
        (OPENVINO_EP, {"device_type": "CPU"}),
        CPU_EP,
    ]
    text = OPENVINO % 'parameters { key: "num_of_threads" value: "4" }'
    assert select(text, kind="KIND_CPU", available=(OPENVINO_EP, CPU_EP))[0] == (
        OPENVINO_EP,
        {"device_type": "CPU", "num_of_threads": "4"},
    )


def test_openvino_missing_is_a_load_error() -> None:
    message = error(OPENVINO % "", kind="KIND_CPU", available=CPU_ONLY)
    assert message.startswith(
        "model 'm': optimization.execution_accelerators.cpu_execution_accelerator[0]: 'openvino' needs "
        "onnxruntime's OpenVINOExecutionProvider, which this onnxruntime does not have (available: "
    )
    assert message.endswith("install the onnxruntime-openvino package")


def test_unknown_cpu_accelerator() -> None:
    text = 'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "dnnl" } ] } }'
    assert error(text, kind="KIND_CPU", available=CPU_ONLY) == (
        "model 'm': optimization.execution_accelerators.cpu_execution_accelerator[0]: unknown Execution "
        "Accelerator 'dnnl' is requested (openvino)"
    )


# --------------------------------------------------------------------------- GPU instances


def test_gpu_instance_uses_cuda_on_its_device() -> None:
    assert select(available=(CUDA_EP, CPU_EP)) == [(CUDA_EP, {"device_id": 0}), CPU_EP]
    assert select(gpu_ids=(2, 3), available=(CUDA_EP, CPU_EP)) == [(CUDA_EP, {"device_id": 2}), CPU_EP]
    assert select(gpu_ids=(), available=(CUDA_EP, CPU_EP)) == [(CUDA_EP, {"device_id": 0}), CPU_EP]


def test_gpu_instance_without_cuda_is_a_load_error() -> None:
    assert error(available=CPU_ONLY) == (
        "model 'm': instance is KIND_GPU but onnxruntime has no CUDAExecutionProvider (available: "
        "['AzureExecutionProvider', 'CPUExecutionProvider']); install the 'gpu' extra"
    )


def test_tensorrt_accelerator_goes_first_with_triton_parameter_names() -> None:
    text = trt(
        ("precision_mode", "FP16"),
        ("max_workspace_size_bytes", "1073741824"),
        ("trt_engine_cache_enable", "1"),
        ("trt_engine_cache_path", "/tmp/trt cache"),
        ("int8_use_native_calibration_table", "false"),
        ("trt_builder_optimization_level", "3"),
        ("trt_profile_min_shapes", "x:1x4"),
    )
    assert select(text, gpu_ids=(1,)) == [
        (
            TENSORRT_EP,
            {
                "trt_fp16_enable": "True",
                "trt_max_workspace_size": "1073741824",
                "trt_engine_cache_enable": "True",
                "trt_engine_cache_path": "/tmp/trt cache",
                "trt_int8_use_native_calibration_table": "False",
                "trt_builder_optimization_level": "3",
                "trt_profile_min_shapes": "x:1x4",
                "device_id": 1,
            },
        ),
        (CUDA_EP, {"device_id": 1}),
        CPU_EP,
    ]


@pytest.mark.parametrize(
    ("mode", "option"),
    [("FP32", None), ("FP16", "trt_fp16_enable"), ("BF16", "trt_bf16_enable"), ("INT8", "trt_int8_enable")],
)
def test_tensorrt_precision_modes(mode: str, option: str | None) -> None:
    options = select(trt(("precision_mode", mode)))[0][1]  # type: ignore[index]
    assert options == ({option: "True"} if option else {}) | {"device_id": 0}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ((("precision_mode", "FP8"),), "unsupported precision mode 'FP8' is requested (FP32, FP16, BF16, INT8)"),
        ((("max_workspace_size", "1"),), "unknown parameter 'max_workspace_size' is provided for TensorRT"),
        ((("max_workspace_size_bytes", "-1"),), "'max_workspace_size_bytes' must be a non-negative integer, got '-1'"),
        ((("trt_dla_core", "one"),), "'trt_dla_core' must be an integer, got 'one'"),
        ((("trt_engine_cache_enable", "yes"),), "'trt_engine_cache_enable' must be a boolean (1/0, true/false"),
    ],
)
def test_tensorrt_parameter_errors(params: tuple[tuple[str, str], ...], message: str) -> None:
    got = error(trt(*params))
    assert got.startswith("model 'm': optimization.execution_accelerators.gpu_execution_accelerator[0].parameters: ")
    assert message in got


def test_tensorrt_missing_is_a_load_error() -> None:
    message = error(trt(), available=(CUDA_EP, CPU_EP))
    assert message.startswith(
        "model 'm': optimization.execution_accelerators.gpu_execution_accelerator[0]: 'tensorrt' needs "
        "onnxruntime's TensorrtExecutionProvider, which this onnxruntime does not have"
    )


def test_tensorrt_listed_twice() -> None:
    text = TRT % '} , { name: "tensorrt"'
    assert "gpu_execution_accelerator[1]: 'tensorrt' is listed more than once" in error(text)


def test_cuda_accelerator_parameters_go_to_the_cuda_provider() -> None:
    text = """optimization { execution_accelerators { gpu_execution_accelerator [ {
      name: "cuda"
      parameters { key: "cudnn_conv_use_max_workspace" value: "0" }
      parameters { key: "use_ep_level_unified_stream" value: "true" }
    } ] } }"""
    assert select(text, gpu_ids=(3,), available=(CUDA_EP, CPU_EP)) == [
        (CUDA_EP, {"cudnn_conv_use_max_workspace": "0", "use_ep_level_unified_stream": "1", "device_id": 3}),
        CPU_EP,
    ]
    bad = text.replace('"true"', '"maybe"')
    assert "'use_ep_level_unified_stream' must be a boolean" in error(bad, available=(CUDA_EP, CPU_EP))


def test_deprecated_cuda_parameters() -> None:
    text = """
    parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }
    parameters { key: "gpu_mem_limit" value: { string_value: "4294967200" } }
    parameters { key: "arena_extend_strategy" value: { string_value: "1" } }
    parameters { key: "do_copy_in_default_stream" value: { string_value: "0" } }
    parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
    """
    assert select(text, available=(CUDA_EP, CPU_EP))[0] == (
        CUDA_EP,
        {
            "cudnn_conv_algo_search": "HEURISTIC",
            "gpu_mem_limit": "4294967200",
            "arena_extend_strategy": "kSameAsRequested",
            "do_copy_in_default_stream": "0",
            "device_id": 0,
        },
    )
    # the gpu_execution_accelerator "cuda" entry wins over the deprecated parameter
    text += """optimization { execution_accelerators { gpu_execution_accelerator [ {
      name: "cuda" parameters { key: "cudnn_conv_algo_search" value: "DEFAULT" }
    } ] } }"""
    assert select(text, available=(CUDA_EP, CPU_EP))[0][1]["cudnn_conv_algo_search"] == "DEFAULT"  # type: ignore[index]
    bad = 'parameters { key: "cudnn_conv_algo_search" value: { string_value: "3" } }'
    assert error(bad, available=(CUDA_EP, CPU_EP)) == (
        "model 'm': parameters: unsupported cudnn_conv_algo_search value '3' is requested (one of 0, 1, 2)"
    )


def test_unknown_gpu_accelerator() -> None:
    text = 'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "gpu_io" } ] } }'
    assert error(text) == (
        "model 'm': optimization.execution_accelerators.gpu_execution_accelerator[0]: unknown Execution "
        "Accelerator 'gpu_io' is requested (tensorrt, cuda)"
    )


def test_full_priority_order_on_a_gpu_instance() -> None:
    text = """optimization { execution_accelerators {
      gpu_execution_accelerator [ { name: "cuda" }, { name: "tensorrt" } ]
      cpu_execution_accelerator [ { name: "openvino" } ]
    } }"""
    got = select(text, available=ALL)
    assert [p[0] if isinstance(p, tuple) else p for p in got] == [TENSORRT_EP, CUDA_EP, OPENVINO_EP, CPU_EP]


def test_providers_asks_onnxruntime_what_it_has() -> None:
    fake = SimpleNamespace(get_available_providers=lambda: [CUDA_EP, CPU_EP])
    ctx = BackendContext("m", 1, config(), Path("model.onnx"), device_kind="KIND_GPU", gpu_ids=(1,))
    assert providers(fake, ctx) == [(CUDA_EP, {"device_id": 1}), CPU_EP]
    assert providers(ort, BackendContext("m", 1, config(), Path("model.onnx"))) == [CPU_EP]


# --------------------------------------------------------------------------- session options and the CPU path


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (0, ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
        (-1, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC),
        (1, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
        (2, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
        (3, ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
    ],
)
def test_graph_level(level: int, expected: object) -> None:
    ctx = BackendContext("m", 1, config(f"optimization {{ graph {{ level: {level} }} }}"), Path("model.onnx"))
    assert session_options(ort, ctx).graph_optimization_level == expected


def test_thread_and_execution_mode_parameters() -> None:
    text = """
    parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
    parameters { key: "inter_op_thread_count" value: { string_value: "3" } }
    parameters { key: "execution_mode" value: { string_value: "1" } }
    """
    opts = session_options(ort, BackendContext("m", 1, config(text), Path("model.onnx")))
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (2, 3)
    assert opts.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    bad = BackendContext("m", 1, config(text.replace('"2"', '"two"')), Path("model.onnx"))
    with pytest.raises(InvalidConfig, match="parameter 'intra_op_thread_count' must be an integer, got 'two'"):
        session_options(ort, bad)


@pytest.fixture
def add_model(tmp_path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["C"])],
        "add",
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, 2]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, [None, 2]),
        ],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, [None, 2])],
    )
    path = tmp_path / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


def test_cpu_session_runs_with_accelerator_options_for_gpus(add_model: Path) -> None:
    """GPU-only options leave a CPU instance as it was; pinned-memory settings are accepted."""
    text = """optimization {
      execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] }
      graph { level: 1 }
      input_pinned_memory { enable: false }
      output_pinned_memory { enable: true }
    }"""
    backend = create_backend(BackendContext("m", 1, config(text), add_model))
    a = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(backend.execute({"A": a, "B": a}, ["C"])["C"], a + a)


def test_openvino_on_this_onnxruntime(add_model: Path) -> None:
    ctx = BackendContext("m", 1, config(OPENVINO % ""), add_model)
    if OPENVINO_EP in ort.get_available_providers():
        create_backend(ctx)
    else:
        with pytest.raises(InvalidConfig, match="'openvino' needs onnxruntime's OpenVINOExecutionProvider"):
            create_backend(ctx)
