"""The ONNX Runtime backend's config auto-complete: inputs, outputs and batching read from the model.

Triton's ``AutoCompleteMaxBatch`` and ``AutoCompleteIO`` (onnxruntime_backend ``onnxruntime.cc``):
a list the config leaves empty is filled from the model; the batch dimension, when every tensor's
first dimension is variable, becomes ``max_batch_size`` 4 with a dynamic batcher.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from serve_app.config.pbtxt import config_error
from serve_app.config.validate import WILDCARD_DIM
from serve_app.protos import model_config_pb2 as mc

# Triton's ONNX Runtime backend option --backend-config=onnxruntime,default-max-batch-size.
DEFAULT_MAX_BATCH_SIZE = 4

# ONNX Runtime's type strings (NodeArg.type) to config data types.
ONNX_TYPES: dict[str, mc.DataType] = {
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


def complete_onnx_config(config: mc.ModelConfig, model: str, model_file: Path) -> None:
    """Fill what the config leaves out from the ONNX model file (in place)."""
    inputs, outputs = read_onnx_io(model_file, model=model)
    _complete_io(config, inputs, outputs, model=model, path=str(model_file))


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
    sides: tuple[
        tuple[
            str,
            RepeatedCompositeFieldContainer[mc.ModelInput] | RepeatedCompositeFieldContainer[mc.ModelOutput],
            Sequence[TensorInfo],
        ],
        ...,
    ] = (("input", config.input, inputs), ("output", config.output, outputs))
    for kind, ios, infos in sides:
        if not ios:
            for tensor in infos:
                if kind == "output" or tensor.name not in fed:
                    ios.add(name=tensor.name)
        by_name = {info.name: info for info in infos}
        listed: Sequence[mc.ModelInput | mc.ModelOutput] = ios
        for i, io in enumerate(listed):
            info = by_name.get(io.name)
            if info is None:
                continue  # not in the model: the backend reports it at load
            field = f"{kind}[{i}]"
            if io.data_type == mc.TYPE_INVALID:
                io.data_type = _config_type(info, field, model=model, path=path)
            if not io.dims and not io.HasField("reshape"):
                _set_dims(io, info, field, config.max_batch_size, model=model, path=path)


def _config_type(info: TensorInfo, field: str, *, model: str, path: str) -> mc.DataType:
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
