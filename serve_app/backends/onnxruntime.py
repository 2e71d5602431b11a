"""ONNX Runtime engine: one InferenceSession per instance.

Options follow Triton's onnxruntime backend: ``optimization.graph.level``
(-1 basic, 1 basic+extended, otherwise all), the ``intra_op_thread_count`` /
``inter_op_thread_count`` / ``execution_mode`` parameters, CUDA on GPU instances.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from serve_app.backends.base import Backend, BackendContext
from serve_app.errors import InternalError, InvalidArgument, InvalidConfig


def _graph_level(ort: Any, level: int) -> Any:
    if level == -1:
        return ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if level == 1:
        return ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
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


def providers(ort: Any, ctx: BackendContext) -> list[Any]:
    if ctx.device_kind == "KIND_GPU":
        available = ort.get_available_providers()
        if "CUDAExecutionProvider" not in available:
            raise InvalidConfig(
                f"model '{ctx.model_name}': instance is KIND_GPU but onnxruntime has no "
                f"CUDAExecutionProvider (available: {available}); install the 'gpu' extra"
            )
        device = ctx.gpu_ids[0] if ctx.gpu_ids else 0
        return [("CUDAExecutionProvider", {"device_id": device}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


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
