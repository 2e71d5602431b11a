"""Completing a partial (or missing) config the way Triton does by default.

Triton fills what it can derive: the name from the directory, the platform from
the model file, and the inputs, outputs and batching from the model itself
(each backend's auto-complete, passed in as ``complete_io``).  It then normalizes
defaults (version policy, preferred batch sizes, ...).  Doing the same here makes
a model directory without config.pbtxt load, and makes the config endpoint show
what Triton would show.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from serve_app.config.validate import (
    BACKEND_PLATFORMS,
    ONNX_PLATFORM,
    PYTHON_BACKEND,
    PYTORCH_PLATFORM,
    TENSORRT_PLATFORM,
    normalize_platform,
)
from serve_app.protos import model_config_pb2 as mc

CompleteIO = Callable[[mc.ModelConfig, str, Path], None]  # (config, model name, model file)
# Triton's default for sequence_batching.max_sequence_idle_microseconds.
SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000

MODEL_FILENAMES: dict[str, str] = {
    ONNX_PLATFORM: "model.onnx",
    PYTORCH_PLATFORM: "model.pt",
    TENSORRT_PLATFORM: "model.plan",
    PYTHON_BACKEND: "model.py",
}
_EXTENSION_PLATFORMS: dict[str, str] = {
    ".onnx": ONNX_PLATFORM,
    ".pt": PYTORCH_PLATFORM,
    ".plan": TENSORRT_PLATFORM,
}


def default_model_filename(config: mc.ModelConfig) -> str:
    """The model file in each version directory: the configured name, else the
    platform's default (``model.onnx`` ...); "" when there is none (ensemble)."""
    if config.default_model_filename:
        return config.default_model_filename
    platform = config.platform or BACKEND_PLATFORMS.get(config.backend, "") or config.backend
    return MODEL_FILENAMES.get(platform, "")


def platform_for_file(model_file: Path) -> str:
    """The platform a model file's extension implies, or ""."""
    return _EXTENSION_PLATFORMS.get(model_file.suffix.lower(), "")


def autocomplete_config(
    config: mc.ModelConfig,
    *,
    model: str,
    model_dir: Path,
    model_file: Path | None,
    complete_io: CompleteIO | None = None,
) -> mc.ModelConfig:
    """A completed copy of ``config`` for the model in ``model_dir``.

    ``model`` is the model's directory name; ``model_file`` is the file the
    config describes (the highest served version's; relative paths are taken
    from ``model_dir``), or None when there is none (ensembles).  Fields the
    config gives are kept; only missing ones are derived.  ``complete_io``
    derives inputs, outputs and batching from the model file: each backend
    knows its own format (``serve_app.backends.complete_io``), as Triton's
    backends do in ``TRITONBACKEND_ModelAutoCompleteConfig``.
    """
    out = mc.ModelConfig()
    out.CopyFrom(config)
    if not out.name:
        out.name = model
    if model_file is not None and not model_file.is_absolute():
        model_file = model_dir / model_file
    if not out.platform and not out.backend and model_file is not None:
        if model_file.name == MODEL_FILENAMES[PYTHON_BACKEND]:
            out.backend = PYTHON_BACKEND  # Triton's core completes a model.py to the python backend
        else:
            out.platform = platform_for_file(model_file)
    normalize_platform(out)
    if not out.default_model_filename:
        out.default_model_filename = default_model_filename(out)
    # A Python model's own auto_complete_config may set more than inputs and outputs: it always runs.
    if complete_io is not None and model_file is not None and (needs_model_io(out) or out.backend == PYTHON_BACKEND):
        complete_io(out, model, model_file)
    normalize_config(out)
    return out


def normalize_config(config: mc.ModelConfig) -> None:
    """Triton's NormalizeModelConfig, in place: the defaults its config endpoint shows."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.HasField("dynamic_batching"):
        db = config.dynamic_batching
        if not db.preferred_batch_size and config.max_batch_size > 0:
            db.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        sb = config.sequence_batching
        if sb.max_sequence_idle_microseconds == 0:
            sb.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS
        if sb.HasField("oldest") and not sb.oldest.preferred_batch_size and config.max_batch_size > 0:
            sb.oldest.preferred_batch_size.append(config.max_batch_size)
    if not config.HasField("ensemble_scheduling"):
        optimization = config.optimization
        if not optimization.HasField("input_pinned_memory"):
            optimization.input_pinned_memory.enable = True
        if not optimization.HasField("output_pinned_memory"):
            optimization.output_pinned_memory.enable = True


def needs_model_io(config: mc.ModelConfig) -> bool:
    """Whether anything is left that only the model file can tell."""
    if not config.input or not config.output:
        return True
    ios: list[mc.ModelInput | mc.ModelOutput] = [*config.input, *config.output]
    return any(io.data_type == mc.TYPE_INVALID or (not io.dims and not io.HasField("reshape")) for io in ios)
