"""The backend contract: one loaded model instance that executes one batch."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from serve_app.config.validate import ONNX_PLATFORM, PYTHON_BACKEND, TENSORRT_PLATFORM
from serve_app.errors import InvalidConfig, Unsupported
from serve_app.inference.execution import Execution, PartResult
from serve_app.protos import model_config_pb2 as mc


@dataclass(frozen=True, slots=True)
class BackendContext:
    """What an instance needs to load: its config, file, and device."""

    model_name: str
    version: int
    config: mc.ModelConfig
    model_file: Path
    device_kind: str = "KIND_CPU"  # KIND_CPU | KIND_GPU | KIND_MODEL
    gpu_ids: tuple[int, ...] = field(default_factory=tuple)  # device ordinals visible to this process
    instance_group: int | None = None  # index of the instance's group in config.instance_group, when known
    instance_name: str = ""  # Triton's ``<group name>_<n>``
    # What model code reaches the server through (BLS, model control: the Python backend), and the event loop
    # that runs its coroutines; None where the process has no server to reach.
    server_link: Any = None
    loop: Any = None

    def parameter(self, key: str, default: str = "") -> str:
        p = self.config.parameters.get(key)
        return p.string_value if p is not None else default


class Backend(ABC):
    """One model instance.  ``execute`` runs one batch and is called from one thread at a time."""

    # True: it answers each request of a batch on its own (``execute_parts``), as Triton's Python backend does.
    per_request: ClassVar[bool] = False
    decoupled: bool = False  # it answers through ``stream`` (zero or more responses per request)

    def __init__(self, ctx: BackendContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def execute(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        """Run the model on full tensors (batch dim included) and return the named outputs."""

    def execute_parts(self, inputs: dict[str, np.ndarray], execution: Execution) -> list[PartResult]:
        """Run a batch and answer each of its requests (``execution.parts``) on its own."""
        raise Unsupported(f"backend '{self.ctx.config.backend}' runs whole batches only")

    def stream(
        self,
        inputs: dict[str, np.ndarray],
        execution: Execution,
        emit: Callable[[int, PartResult], None],
        cancelled: Callable[[int], bool],
    ) -> None:
        """Run a decoupled batch: ``emit(request index, response)`` as responses are produced."""
        raise Unsupported(f"backend '{self.ctx.config.backend}' has no decoupled models")

    def is_ready(self) -> bool:
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the instance's resources."""


_ENGINES: dict[str, str] = {
    "onnxruntime": "serve_app.backends.onnxruntime:OnnxRuntimeBackend",
    "pytorch": "serve_app.backends.torchscript:TorchScriptBackend",
    "tensorrt": "serve_app.backends.tensorrt:TensorRTBackend",
    "python": "serve_app.backends.python.backend:PythonBackend",
}


def create_backend(ctx: BackendContext) -> Backend:
    backend = ctx.config.backend
    target = _ENGINES.get(backend)
    if target is None:
        raise InvalidConfig(
            f"model '{ctx.model_name}': backend '{backend}' (platform '{ctx.config.platform}') is not available"
        )
    module_name, cls_name = target.split(":")
    cls: type[Backend] = getattr(importlib.import_module(module_name), cls_name)
    return cls(ctx)


# Backends that can complete a config from their model file (Triton's TRITONBACKEND_ModelAutoCompleteConfig).
_COMPLETERS: dict[str, str] = {
    ONNX_PLATFORM: "serve_app.backends.onnxruntime_config:complete_onnx_config",
    TENSORRT_PLATFORM: "serve_app.backends.tensorrt:complete_tensorrt_config",
    PYTHON_BACKEND: "serve_app.backends.python.autocomplete:complete_python_config",
}


def complete_io(config: mc.ModelConfig, model: str, model_file: Path) -> None:
    """Fill the inputs, outputs and batching ``config`` leaves out from ``model_file``, when its backend
    can read them (in place; the ``complete_io`` of :func:`serve_app.config.autocomplete_config`)."""
    target = _COMPLETERS.get(config.platform) or _COMPLETERS.get(config.backend)
    if target is None:
        return
    module_name, fn_name = target.split(":")
    getattr(importlib.import_module(module_name), fn_name)(config, model, model_file)
