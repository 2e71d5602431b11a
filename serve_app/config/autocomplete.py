"""Completing a partial (or missing) config the way Triton does by default.

Triton fills what it can derive: the name from the directory, the platform from
the model file, and for ONNX models the inputs, outputs and batching from the
model itself (the ONNX Runtime backend's auto-complete).  It then normalizes
defaults (version policy, preferred batch sizes, ...).  Doing the same here makes
a model directory without config.pbtxt load, and makes the config endpoint show
what Triton would show.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from serve_app.config.pbtxt import config_error
from serve_app.config.validate import (
    BACKEND_PLATFORMS,
    ONNX_PLATFORM,
    PYTORCH_PLATFORM,
    TENSORRT_PLATFORM,
    WILDCARD_DIM,
    normalize_platform,
)
from serve_app.errors import InvalidConfig
from serve_app.protos import model_config_pb2 as mc

# Triton's ONNX Runtime backend option --backend-config=onnxruntime,default-max-batch-size.
DEFAULT_MAX_BATCH_SIZE = 4
# Triton's default for sequence_batching.max_sequence_idle_microseconds.
SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000

MODEL_FILENAMES: dict[str, str] = {
    ONNX_PLATFORM: "model.onnx",
    PYTORCH_PLATFORM: "model.pt",
    TENSORRT_PLATFORM: "model.plan",
}
_EXTENSION_PLATFORMS: dict[str, str] = {
    ".onnx": ONNX_PLATFORM,
    ".pt": PYTORCH_PLATFORM,
    ".plan": TENSORRT_PLATFORM,
}

# ONNX Runtime's type strings (NodeArg.type) to config data types.
ONNX_TYPES: dict[str, int] = {
    "tensor(bool)": mc.TYPE_BOOL,
    "tensor(uint8)": mc.TYPE_UINT8,
    "tensor(uint16)": mc.TYPE_UINT16,
    "tensor(uint32)": mc.TYPE_UINT32,
    "tensor(uint64)": mc.TYPE_UINT64,
    "tensor(int8)": mc.TYPE_INT8,
    "tensor(int16)": mc.TYPE_INT16,
    "tensor(int32)": mc.TYPE_INT32,
    "tensor(int64)": mc.TYPE_INT64,
    "tensor(float16)": mc.TYPE_FP16,
    "tensor(float)": mc.TYPE_FP32,
    "tensor(double)": mc.TYPE_FP64,
    "tensor(string)": mc.TYPE_STRING,
    "tensor(bfloat16)": mc.TYPE_BF16,
}


@dataclass(frozen=True)
class TensorInfo:
    """One model input or output as the ONNX model declares it."""

    name: str
    onnx_type: str  # e.g. "tensor(float)"
    shape: tuple[int, ...]  # -1 for a variable (None or symbolic) dimension


def default_model_filename(config: mc.ModelConfig) -> str:
    """The model file in each version directory: the configured name, else the
    platform's default (``model.onnx`` ...); "" when there is none (ensemble)."""
    if config.default_model_filename:
        return config.default_model_filename
    platform = config.platform or BACKEND_PLATFORMS.get(config.backend, "")
    return MODEL_FILENAMES.get(platform, "")


def platform_for_file(model_file: Path) -> str:
    """The platform a model file's extension implies, or ""."""
    return _EXTENSION_PLATFORMS.get(model_file.suffix.lower(), "")


def autocomplete_config(
    config: mc.ModelConfig, *, model: str, model_dir: Path, model_file: Path | None
) -> mc.ModelConfig:
    """A completed copy of ``config`` for the model in ``model_dir``.

    ``model`` is the model's directory name; ``model_file`` is the file the
    config describes (the highest served version's; relative paths are taken
    from ``model_dir``), or None when there is none (ensembles).  Fields the
    config gives are kept; only missing ones are derived.
    """
    out = mc.ModelConfig()
    out.CopyFrom(config)
    if not out.name:
        out.name = model
    if model_file is not None and not model_file.is_absolute():
        model_file = model_dir / model_file
    if not out.platform and not out.backend and model_file is not None:
        out.platform = platform_for_file(model_file)
    normalize_platform(out)
    if not out.default_model_filename:
        out.default_model_filename = default_model_filename(out)
    if out.platform == ONNX_PLATFORM and model_file is not None and _needs_model_io(out):
        inputs, outputs = read_onnx_io(model_file, model=model)
        _complete_io(out, inputs, outputs, model=model, path=str(model_file))
    elif out.platform == TENSORRT_PLATFORM and model_file is not None and _needs_model_io(out):
        _complete_from_engine(out, model, model_file)
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


def read_onnx_io(model_file: Path, *, model: str) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """The inputs and outputs an ONNX model declares, read through ONNX Runtime."""
    import onnxruntime as ort  # heavy; only configs that need it pay for it

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(model_file), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise config_error(
            model, str(model_file), f"unable to read the ONNX model to complete its configuration: {exc}"
        ) from None

    def infos(args: Sequence[ort.NodeArg]) -> list[TensorInfo]:
        return [TensorInfo(arg.name, arg.type, _dims(arg.shape)) for arg in args]

    return infos(session.get_inputs()), infos(session.get_outputs())


def _dims(shape: Sequence[int | str | None] | None) -> tuple[int, ...]:
    """ORT gives ints for fixed dims and None or a symbol name for variable ones."""
    return tuple(d if isinstance(d, int) and d >= 0 else WILDCARD_DIM for d in shape or ())


def _needs_model_io(config: mc.ModelConfig) -> bool:
    """Whether anything is left that only the model file can tell."""
    if not config.input or not config.output:
        return True
    ios: list[mc.ModelInput | mc.ModelOutput] = [*config.input, *config.output]
    return any(io.data_type == mc.TYPE_INVALID or (not io.dims and not io.HasField("reshape")) for io in ios)


def _can_batch(inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> bool:
    """Triton batches an ONNX model only if every tensor's first dim is variable."""
    return all(t.shape and t.shape[0] == WILDCARD_DIM for t in [*inputs, *outputs])


def _complete_io(
    config: mc.ModelConfig,
    inputs: Sequence[TensorInfo],
    outputs: Sequence[TensorInfo],
    *,
    model: str,
    path: str,
) -> None:
    """The ONNX Runtime backend's AutoCompleteMaxBatch and AutoCompleteIO.

    A list the config leaves empty is filled from the model; a list it gives is
    kept as given (the user may serve a subset of outputs), with each entry's
    missing data_type/dims filled from the model tensor of the same name.
    """
    if config.max_batch_size == 0 and not config.input and _can_batch(inputs, outputs):
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    # The sequence batcher feeds control and state inputs itself: they are not the client's inputs.
    sb = config.sequence_batching
    fed = {c.name for c in sb.control_input} | {s.input_name for s in sb.state}
    for kind, ios, infos in (("input", config.input, inputs), ("output", config.output, outputs)):
        if not ios:
            for info in infos:
                if kind == "output" or info.name not in fed:
                    ios.add(name=info.name)
        by_name = {info.name: info for info in infos}
        for i, io in enumerate(ios):
            info = by_name.get(io.name)
            if info is None:
                continue  # not in the model: the backend reports it at load
            field = f"{kind}[{i}]"
            if io.data_type == mc.TYPE_INVALID:
                io.data_type = _config_type(info, field, model=model, path=path)
            if not io.dims and not io.HasField("reshape"):
                _set_dims(io, info, field, config.max_batch_size, model=model, path=path)


def _config_type(info: TensorInfo, field: str, *, model: str, path: str) -> int:
    try:
        return ONNX_TYPES[info.onnx_type]
    except KeyError:
        raise config_error(
            model, path, f"{field}.data_type: ONNX type '{info.onnx_type}' of '{info.name}' is not supported"
        ) from None


def _set_dims(
    io: mc.ModelInput | mc.ModelOutput,
    info: TensorInfo,
    field: str,
    max_batch_size: int,
    *,
    model: str,
    path: str,
) -> None:
    """The model's shape, less the batch dim when batching; a batch-only (or
    scalar) tensor becomes dims [ 1 ] with an empty reshape, as in Triton."""
    dims = info.shape
    if max_batch_size > 0:
        if not dims or dims[0] != WILDCARD_DIM:
            raise config_error(
                model,
                path,
                f"{field}.dims: max_batch_size is {max_batch_size} but the model's '{info.name}' has shape "
                f"{list(dims)}, whose first dimension is not variable: the model does not support batching",
            )
        dims = dims[1:]
    if dims:
        io.dims.extend(dims)
    else:
        io.dims.append(1)
        io.reshape.SetInParent()


def _complete_from_engine(config: mc.ModelConfig, model: str, model_file: Path) -> None:
    """Triton completes a TensorRT config from the engine; reading a plan needs TensorRT, cuda-python and a
    GPU where the repository is loaded.  Without them the config stays as written, and the instances'
    load reports what is missing."""
    from serve_app.backends.tensorrt import read_plan_metadata
    from serve_app.backends.tensorrt_logic import complete_config_from_engine

    try:
        meta = read_plan_metadata(model_file, model=model)
    except InvalidConfig:
        return
    complete_config_from_engine(config, meta, model=model, path=str(model_file))
