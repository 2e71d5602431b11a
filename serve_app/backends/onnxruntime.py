"""ONNX Runtime engine: one InferenceSession per instance.

Options follow Triton's onnxruntime backend:

* ``optimization.graph.level``: -1 basic, 1 basic+extended, 2 none (disabled),
  anything else (0, the default) all.
* ``intra_op_thread_count`` / ``inter_op_thread_count`` / ``execution_mode`` parameters.
* Execution providers (:func:`select_providers`, pure): on a KIND_GPU instance the
  ``gpu_execution_accelerator`` entries first (``tensorrt`` -> TensorRT EP with
  Triton's parameter mapping; ``cuda`` -> options for the CUDA EP), then the CUDA
  EP on the instance's device; on every instance the ``cpu_execution_accelerator``
  entries (``openvino`` -> OpenVINO EP) and last the default CPU EP.  An
  accelerator this onnxruntime build lacks fails the load with a clear reason.
  GPU accelerators on a CPU instance are ignored, as in Triton.
* ``input_pinned_memory`` / ``output_pinned_memory``: accepted, but ONNX Runtime's
  Python API gives no way to hand it page-locked host buffers: requests go in as
  numpy (pageable) arrays and the CUDA EP does its own host<->device copies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from serve_app.backends.base import Backend, BackendContext
from serve_app.errors import InternalError, InvalidArgument, InvalidConfig
from serve_app.protos import model_config_pb2 as mc

CPU_EP = "CPUExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
TENSORRT_EP = "TensorrtExecutionProvider"
OPENVINO_EP = "OpenVINOExecutionProvider"

Provider = str | tuple[str, dict[str, Any]]


def _graph_level(ort: Any, level: int) -> Any:
    if level == -1:
        return ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if level == 1:
        return ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    if level == 2:
        return ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def session_options(ort: Any, ctx: BackendContext) -> Any:
    opts = ort.SessionOptions()
    cfg = ctx.config
    opts.graph_optimization_level = _graph_level(ort, cfg.optimization.graph.level)
    for key, attr in (
        ("intra_op_thread_count", "intra_op_num_threads"),
        ("inter_op_thread_count", "inter_op_num_threads"),
    ):
        raw = ctx.parameter(key)
        if raw:
            try:
                setattr(opts, attr, int(raw))
            except ValueError:
                raise InvalidConfig(
                    f"model '{ctx.model_name}': parameter '{key}' must be an integer, got '{raw}'"
                ) from None
    if ctx.parameter("execution_mode") == "1":
        opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    return opts


# --------------------------------------------------------------------------- execution providers

# Triton's gpu_execution_accelerator "tensorrt" parameters -> TensorRT EP option and value kind.
_TRT_PARAMETERS: dict[str, tuple[str, str]] = {
    "max_workspace_size_bytes": ("trt_max_workspace_size", "uint"),
    "trt_max_partition_iterations": ("trt_max_partition_iterations", "int"),
    "trt_min_subgraph_size": ("trt_min_subgraph_size", "int"),
    "int8_calibration_table_name": ("trt_int8_calibration_table_name", "str"),
    "int8_use_native_calibration_table": ("trt_int8_use_native_calibration_table", "bool"),
    "trt_dla_enable": ("trt_dla_enable", "bool"),
    "trt_dla_core": ("trt_dla_core", "int"),
    "trt_engine_cache_enable": ("trt_engine_cache_enable", "bool"),
    "trt_engine_cache_path": ("trt_engine_cache_path", "str"),
    "trt_engine_cache_prefix": ("trt_engine_cache_prefix", "str"),
    "trt_dump_subgraphs": ("trt_dump_subgraphs", "bool"),
    "trt_force_sequential_engine_build": ("trt_force_sequential_engine_build", "bool"),
    "trt_context_memory_sharing_enable": ("trt_context_memory_sharing_enable", "bool"),
    "trt_layer_norm_fp32_fallback": ("trt_layer_norm_fp32_fallback", "bool"),
    "trt_timing_cache_enable": ("trt_timing_cache_enable", "bool"),
    "trt_timing_cache_path": ("trt_timing_cache_path", "str"),
    "trt_force_timing_cache": ("trt_force_timing_cache", "bool"),
    "trt_detailed_build_log": ("trt_detailed_build_log", "bool"),
    "trt_build_heuristics_enable": ("trt_build_heuristics_enable", "bool"),
    "trt_sparsity_enable": ("trt_sparsity_enable", "bool"),
    "trt_builder_optimization_level": ("trt_builder_optimization_level", "int"),
    "trt_auxiliary_streams": ("trt_auxiliary_streams", "int"),
    "trt_tactic_sources": ("trt_tactic_sources", "str"),
    "trt_extra_plugin_lib_paths": ("trt_extra_plugin_lib_paths", "str"),
    "trt_profile_min_shapes": ("trt_profile_min_shapes", "str"),
    "trt_profile_max_shapes": ("trt_profile_max_shapes", "str"),
    "trt_profile_opt_shapes": ("trt_profile_opt_shapes", "str"),
    "trt_cuda_graph_enable": ("trt_cuda_graph_enable", "bool"),
    "trt_dump_ep_context_model": ("trt_dump_ep_context_model", "bool"),
    "trt_ep_context_file_path": ("trt_ep_context_file_path", "str"),
    "trt_ep_context_embed_mode": ("trt_ep_context_embed_mode", "int"),
}
_TRT_PRECISION: dict[str, str | None] = {
    "FP32": None,
    "FP16": "trt_fp16_enable",
    "BF16": "trt_bf16_enable",
    "INT8": "trt_int8_enable",
}
_CUDA_BOOL_PARAMETERS = ("do_copy_in_default_stream", "use_ep_level_unified_stream")
# The deprecated top-level parameters Triton still maps onto the CUDA EP.
_CUDNN_CONV_ALGO_SEARCH = {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"}
_ARENA_EXTEND_STRATEGY = {"0": "kNextPowerOfTwo", "1": "kSameAsRequested"}
_KIND_WORDS = {"bool": "a boolean (1/0, true/false, on/off)", "int": "an integer", "uint": "a non-negative integer"}


def _parse_bool(text: str) -> bool | None:
    """Triton's ParseBoolValue: true/on/1 and false/off/0, any case."""
    low = text.strip().lower()
    if low in ("true", "on", "1"):
        return True
    if low in ("false", "off", "0"):
        return False
    return None


def _option(kind: str, value: str) -> str | None:
    """``value`` as the option string onnxruntime parses, or None when it is not of ``kind``."""
    text = value.strip()
    if kind == "bool":
        flag = _parse_bool(text)
        return None if flag is None else str(flag)
    if kind in ("int", "uint"):
        try:
            number = int(text)
        except ValueError:
            return None
        return None if kind == "uint" and number < 0 else str(number)
    return value


def _tensorrt_options(params: Mapping[str, str], field: str, fail: Callable[[str], NoReturn]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key in sorted(params):
        value = params[key]
        if key == "precision_mode":
            if value not in _TRT_PRECISION:
                fail(f"{field}.parameters: unsupported precision mode '{value}' is requested (FP32, FP16, BF16, INT8)")
            flag = _TRT_PRECISION[value]
            if flag:
                options[flag] = "True"
            continue
        mapped = _TRT_PARAMETERS.get(key)
        if mapped is None:
            fail(f"{field}.parameters: unknown parameter '{key}' is provided for TensorRT Execution Accelerator")
        option, kind = mapped
        text = _option(kind, value)
        if text is None:
            fail(f"{field}.parameters: '{key}' must be {_KIND_WORDS[kind]}, got '{value}'")
        if text:
            options[option] = text
    return options


def _deprecated_cuda_options(parameters: Mapping[str, str], fail: Callable[[str], NoReturn]) -> dict[str, str]:
    """The CUDA EP options Triton still reads from top-level model parameters."""
    options: dict[str, str] = {}
    for key, names in (
        ("cudnn_conv_algo_search", _CUDNN_CONV_ALGO_SEARCH),
        ("arena_extend_strategy", _ARENA_EXTEND_STRATEGY),
    ):
        if key in parameters:
            raw = parameters[key].strip()
            if raw not in names:
                fail(f"parameters: unsupported {key} value '{raw}' is requested (one of {', '.join(names)})")
            options[key] = names[raw]
    for key in ("gpu_mem_limit", "do_copy_in_default_stream"):
        if key in parameters:
            options[key] = parameters[key]
    return options


def select_providers(
    config: mc.ModelConfig,
    device_kind: str,
    gpu_ids: Sequence[int],
    available: Sequence[str],
    *,
    model: str,
) -> list[Provider]:
    """The execution providers (ONNX Runtime's ``providers=`` list) for one instance.

    Pure: decided from the config, the instance's device kind and GPU ids, and the
    providers this onnxruntime build has.  Raises InvalidConfig naming the field.
    """

    def fail(detail: str) -> NoReturn:
        raise InvalidConfig(f"model '{model}': {detail}")

    accelerators = config.optimization.execution_accelerators
    providers: list[Provider] = []
    if device_kind == "KIND_GPU":
        if CUDA_EP not in available:
            fail(
                f"instance is KIND_GPU but onnxruntime has no {CUDA_EP} (available: {list(available)}); "
                "install the 'gpu' extra"
            )
        device = gpu_ids[0] if gpu_ids else 0
        parameters = {k: p.string_value for k, p in config.parameters.items()}
        cuda_options: dict[str, Any] = _deprecated_cuda_options(parameters, fail)
        for i, acc in enumerate(accelerators.gpu_execution_accelerator):
            field = f"optimization.execution_accelerators.gpu_execution_accelerator[{i}]"
            if acc.name == "tensorrt":
                if TENSORRT_EP not in available:
                    fail(
                        f"{field}: 'tensorrt' needs onnxruntime's {TENSORRT_EP}, which this onnxruntime does not "
                        f"have (available: {list(available)}); install onnxruntime-gpu with the TensorRT libraries "
                        "(the 'gpu' extra)"
                    )
                if any(isinstance(p, tuple) and p[0] == TENSORRT_EP for p in providers):
                    fail(f"{field}: 'tensorrt' is listed more than once")
                options = _tensorrt_options(acc.parameters, field, fail)
                options["device_id"] = device
                providers.append((TENSORRT_EP, options))
            elif acc.name == "cuda":
                for key in sorted(acc.parameters):
                    value = acc.parameters[key]
                    if key in _CUDA_BOOL_PARAMETERS:
                        text = _option("bool", value)
                        if text is None:
                            fail(f"{field}.parameters: '{key}' must be {_KIND_WORDS['bool']}, got '{value}'")
                        value = "1" if text == "True" else "0"
                    if value:
                        cuda_options[key] = value
            else:
                fail(f"{field}: unknown Execution Accelerator '{acc.name}' is requested (tensorrt, cuda)")
        cuda_options["device_id"] = device
        providers.append((CUDA_EP, cuda_options))
    for i, acc in enumerate(accelerators.cpu_execution_accelerator):
        field = f"optimization.execution_accelerators.cpu_execution_accelerator[{i}]"
        if acc.name != "openvino":
            fail(f"{field}: unknown Execution Accelerator '{acc.name}' is requested (openvino)")
        if OPENVINO_EP not in available:
            fail(
                f"{field}: 'openvino' needs onnxruntime's {OPENVINO_EP}, which this onnxruntime does not have "
                f"(available: {list(available)}); install the onnxruntime-openvino package"
            )
        if any(isinstance(p, tuple) and p[0] == OPENVINO_EP for p in providers):
            fail(f"{field}: 'openvino' is listed more than once")
        providers.append((OPENVINO_EP, {"device_type": "CPU", **dict(acc.parameters)}))
    providers.append(CPU_EP)
    return providers


def providers(ort: Any, ctx: BackendContext) -> list[Provider]:
    return select_providers(
        ctx.config, ctx.device_kind, ctx.gpu_ids, ort.get_available_providers(), model=ctx.model_name
    )


def _utf8_strings(name: str, arr: np.ndarray) -> np.ndarray:
    """ORT's Python API takes only str elements; refuse bytes it would alter."""
    try:
        values = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in arr.ravel()]
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"input '{name}' holds BYTES that are not valid UTF-8; ONNX Runtime string tensors need UTF-8 text"
        ) from None
    return np.array(values, dtype=object).reshape(arr.shape)


class OnnxRuntimeBackend(Backend):
    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        import onnxruntime as ort

        try:
            self._session = ort.InferenceSession(
                str(ctx.model_file), sess_options=session_options(ort, ctx), providers=providers(ort, ctx)
            )
        except InvalidConfig:
            raise
        except Exception as exc:
            raise InvalidConfig(f"model '{ctx.model_name}': failed to load '{ctx.model_file}': {exc}") from exc
        self._string_inputs = {i.name for i in self._session.get_inputs() if i.type == "tensor(string)"}
        self._string_outputs = {o.name for o in self._session.get_outputs() if o.type == "tensor(string)"}

    def execute(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        feed: dict[str, np.ndarray] = {}
        for name, arr in inputs.items():
            if name in self._string_inputs:
                arr = _utf8_strings(name, arr)
            feed[name] = arr
        try:
            results = self._session.run(output_names, feed)
        except Exception as exc:
            raise InternalError(f"onnxruntime execute failure: {exc}") from exc
        out: dict[str, np.ndarray] = {}
        for name, arr in zip(output_names, results, strict=True):
            if name in self._string_outputs:
                arr = np.array(
                    [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in arr.ravel()], dtype=object
                ).reshape(arr.shape)
            out[name] = arr
        return out
