"""Which load requests bring code the server would run, and the flag that allows them.

Triton's load API takes a model's config and files from the client.  Some of
that is code: a Python model's files (its ``auto_complete_config`` already runs
during the load), a ``requirements.txt`` (a pip install), a shared library,
``EXECUTION_ENV_PATH`` (a directory whose packages go first on the import path)
and a TensorRT plugin library path.  Triton's secure-deployment guide calls
such uploads arbitrary code execution; here they are refused unless the
operator starts the server with :data:`ALLOW_FLAG`.  Model files that backends
only read (ONNX, TorchScript, TensorRT plans) stay allowed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath

from serve_app.backends.python.environment import ENV_PARAMETER, REQUIREMENTS
from serve_app.config.validate import PYTHON_BACKEND
from serve_app.protos import model_config_pb2 as mc

ALLOW_FLAG = "--allow-model-code-upload"
_CODE_SUFFIXES = frozenset({".py", ".pyc", ".pth", ".so", ".dylib", ".dll"})
_PLUGIN_PARAMETERS = ("trt_extra_plugin_lib_paths",)


def code_in_load(override: mc.ModelConfig | None, files: Iterable[str]) -> str | None:
    """What in a load request (its ``config`` and ``file:`` paths) would run as code, or None."""
    paths = sorted(files)
    if override is not None:
        if paths and override.backend == PYTHON_BACKEND:
            return f"the files of a Python model ('file:{paths[0]}')"
        if ENV_PARAMETER in override.parameters:
            return f"the config's {ENV_PARAMETER} parameter"
        for acc in _accelerators(override):
            for key in _PLUGIN_PARAMETERS:
                if key in acc.parameters:
                    return f"the config's {key} parameter"
    for path in paths:
        name = PurePosixPath(path).name
        if name == REQUIREMENTS or _is_code(name):
            return f"'file:{path}'"
    return None


def refusal(model: str, what: str) -> str:
    """The message of a refused load: what was refused and the flag that allows it."""
    return (
        f"failed to load '{model}': {what} would run as code in the server; loading model code through the "
        f"repository API is off (start the server with {ALLOW_FLAG} to allow it)"
    )


def _is_code(name: str) -> bool:
    lowered = name.lower()
    if PurePosixPath(lowered).suffix in _CODE_SUFFIXES:
        return True
    return ".so." in lowered  # versioned shared libraries: libfoo.so.1


def _accelerators(config: mc.ModelConfig) -> list[mc.ModelOptimizationPolicy.ExecutionAccelerators.Accelerator]:
    accelerators = config.optimization.execution_accelerators
    return [*accelerators.gpu_execution_accelerator, *accelerators.cpu_execution_accelerator]
