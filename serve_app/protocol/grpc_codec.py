"""KServe v2 inference over gRPC: ModelInferRequest/Response to and from our types.

Input data comes either from ``raw_input_contents`` (one entry per input, in
input order, same byte layout as HTTP binary data) or from an input's typed
``contents``, never both.  Typed contents follow Triton: INT8/INT16/INT32 come
in ``int_contents``, UINT8/UINT16/UINT32 in ``uint_contents`` (values widened to
32 bits), the other types in their namesake field; FP16 and BF16 have no typed
form.  Responses always carry data in ``raw_output_contents``, as Triton's do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from serve_app import datatypes
from serve_app.errors import InternalError, InvalidArgument
from serve_app.inference.options import GRPC_ALLOWED_RESERVED, strip_reserved
from serve_app.inference.types import (
    InferRequest,
    InferResponse,
    InferTensor,
    ParamValue,
    RequestedOutput,
)
from serve_app.inference.validate import declared_shape
from serve_app.limits import DEFAULT_LIMITS, RequestLimits
from serve_app.protocol import shm_codec, tensor_codec
from serve_app.protocol.limits import ElementBudget, check_counts, check_infer_message_counts
from serve_app.protos import grpc_service_pb2 as pb
from serve_app.shared_memory import SharedMemory, ShmRef

SHARED_MEMORY_REGION = shm_codec.REGION

# Which InferTensorContents field carries each datatype, and the wire type
# Triton names in its error when another field is used.
_CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_FIELD_TYPE: dict[str, str] = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


# --------------------------------------------------------------------------- parameters


def params_from_pb(params: Mapping[str, pb.InferParameter]) -> dict[str, ParamValue]:
    """A protobuf ``map<string, InferParameter>`` as plain Python values."""
    out: dict[str, ParamValue] = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        if which is None:
            raise InvalidArgument(f"parameter '{key}' has no value")
        value = getattr(p, which)
        if key == "sequence_id" and which == "int64_param" and value < 0:
            value += 2**64  # Triton reads int64_param as the uint64 correlation ID: IDs >= 2**63 come negative
        out[key] = value
    return out


def params_to_pb(params: Mapping[str, object], target: Mapping[str, pb.InferParameter]) -> None:
    """Fill the protobuf map ``target`` from plain values (numpy scalars allowed).

    Integers go to ``int64_param``, or ``uint64_param`` when too large for it.
    """
    for key, value in params.items():
        if isinstance(value, np.generic):
            value = value.item()
        p = target[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            if _INT64_MIN <= value <= _INT64_MAX:
                p.int64_param = value
            elif _INT64_MAX < value <= _UINT64_MAX:
                p.uint64_param = value
            else:
                raise InternalError(f"parameter '{key}' value {value} does not fit in 64 bits")
        elif isinstance(value, float):
            p.double_param = value
        elif isinstance(value, str):
            p.string_param = value
        else:
            raise InternalError(f"parameter '{key}' has unsupported type {type(value).__name__}")


# --------------------------------------------------------------------------- request


def parse_model_infer_request(data: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> pb.ModelInferRequest:
    """A serialized ModelInferRequest, its input and output counts checked on its bytes before protobuf
    builds a message for each."""
    check_infer_message_counts(data, limits)
    return pb.ModelInferRequest.FromString(data)


def decode_model_infer_request(
    msg: pb.ModelInferRequest,
    limits: RequestLimits = DEFAULT_LIMITS,
    shm: SharedMemory = shm_codec.NO_SHARED_MEMORY,
) -> InferRequest:
    """Decode a ModelInferRequest; data from raw contents is zero-copy over the
    message's bytes.  ``limits`` are checked on what the message declares, before
    its tensors are made (its size was grpc's to check).  Inputs naming a shared
    memory region are read from it (``shm``), and outputs naming one are checked
    against it; inputs in shared memory take no raw entry."""
    model = msg.model_name
    raw = msg.raw_input_contents
    n_raw, n_inputs = len(raw), len(msg.inputs)
    check_counts(model, n_inputs, len(msg.outputs), limits)

    parameters = params_from_pb(msg.parameters) if msg.parameters else {}
    strip_reserved(parameters, GRPC_ALLOWED_RESERVED)

    # Each field read once: every read of a protobuf field builds a Python object.
    declared = [(io, io.name, io.datatype, tuple(io.shape)) for io in msg.inputs]
    budget = ElementBudget(model, limits)
    for _, name, datatype, dims in declared:  # every declared shape is counted before any input is decoded
        budget.add(name, dims, datatype)

    inputs: list[InferTensor] = []
    next_raw = 0  # raw entries are taken in order by the inputs without typed contents (extra ones are ignored)
    for io, name, datatype, dims in declared:
        if datatype not in datatypes.BY_WIRE:
            raise InvalidArgument(f"invalid datatype '{datatype}' for input '{name}'")
        has_params = bool(io.parameters)
        tparams = params_from_pb(io.parameters) if has_params else {}
        ref = _shm_ref(io) if has_params else None
        has_contents = io.HasField("contents")
        if ref is not None:
            if has_contents:
                raise InvalidArgument(
                    f"unexpected 'content' provided when using shared memory for input tensor '{name}' for model "
                    f"'{model}'"
                )
            shape = declared_shape(model, name, dims)
            data = shm_codec.input_array(shm, model, name, datatype, shape, ref)
            inputs.append(InferTensor(name, datatype, shape, data, shm_codec.without_shm(tparams)))
            continue
        if has_contents and n_raw:
            raise InvalidArgument(
                f"contents field must not be specified when using raw_input_contents for '{name}' for model '{model}'"
            )
        if not has_contents and next_raw >= n_raw:
            raise InvalidArgument(f"unable to find data for input tensor '{name}' for model '{model}' in request.")
        shape = declared_shape(model, name, dims)
        if has_contents:
            data = _from_contents(io, shape, model)
        else:
            data = tensor_codec.array_from_bytes(name, datatype, shape, raw[next_raw])
            next_raw += 1
        inputs.append(InferTensor(name=name, datatype=datatype, shape=shape, data=data, parameters=tparams))

    outputs: list[RequestedOutput] = []
    for o in msg.outputs:
        has_params = bool(o.parameters)
        oparams = params_from_pb(o.parameters) if has_params else {}
        ref = _shm_ref(o) if has_params else None
        if ref is not None:
            if "classification" in oparams:
                raise InvalidArgument("output can't set both 'shared_memory_region' and 'classification'")
            shm_codec.check_output(shm, ref)
            oparams.update({shm_codec.OFFSET: ref.offset, shm_codec.BYTE_SIZE: ref.byte_size})
        outputs.append(RequestedOutput(name=o.name, parameters=oparams))

    return InferRequest(
        model_name=model,
        model_version=msg.model_version,
        id=msg.id,
        inputs=inputs,
        outputs=outputs,
        parameters=parameters,
    )


def _shm_ref(
    tensor: pb.ModelInferRequest.InferInputTensor | pb.ModelInferRequest.InferRequestedOutputTensor,
) -> ShmRef | None:
    """A tensor's ``shared_memory_*`` parameters, checked as Triton's gRPC front end checks them."""
    params, name = tensor.parameters, tensor.name
    region = params.get(shm_codec.REGION)
    for key in (shm_codec.OFFSET, shm_codec.BYTE_SIZE):
        if key in params and region is None:
            raise InvalidArgument(
                f"'{key}' can not be specified without 'shared_memory_region' parameter for tensor '{name}'"
            )
    if region is None:
        return None
    if region.WhichOneof("parameter_choice") != "string_param":
        raise InvalidArgument(
            f"invalid value type for 'shared_memory_region' parameter for tensor '{name}', expected string_param."
        )
    values: dict[str, int | None] = {}
    for key in (shm_codec.OFFSET, shm_codec.BYTE_SIZE):
        p = params.get(key)
        if p is not None and p.WhichOneof("parameter_choice") != "int64_param":
            raise InvalidArgument(
                f"invalid value type for '{key}' parameter for tensor '{name}', expected int64_param."
            )
        values[key] = p.int64_param if p is not None else None
    if values[shm_codec.BYTE_SIZE] is None:
        raise InvalidArgument(
            f"'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor "
            f"'{name}'"
        )
    return ShmRef(region.string_param, values[shm_codec.OFFSET] or 0, values[shm_codec.BYTE_SIZE] or 0)


def _from_contents(io: pb.ModelInferRequest.InferInputTensor, shape: tuple[int, ...], model: str) -> np.ndarray:
    """Typed contents, checked the way Triton checks them."""
    name, datatype = io.name, io.datatype
    contents = io.contents
    used = [f for f in _FIELD_TYPE if len(getattr(contents, f))]
    if len(used) > 1:
        raise InvalidArgument(
            f"unexpected explicit tensor data for input tensor '{name}' for model '{model}', binary data "
            "was already supplied."
        )
    expected = _CONTENTS_FIELD.get(datatype)
    if used and used[0] != expected:
        raise InvalidArgument(
            f"unexpected explicit tensor data for input tensor '{name}' for model '{model}' of type "
            f"'{_FIELD_TYPE[used[0]]}', expected datatype '{datatype}'"
        )
    if expected is None:  # FP16 / BF16 (no typed form) with every field empty
        values: list[Any] = []
    else:
        values = list(getattr(contents, expected))
    if datatype in ("FP16", "BF16"):
        if values or tensor_codec.element_count(shape) != 0:
            raise InvalidArgument(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model}': "
                f"{datatype} has no typed contents field, send it in raw_input_contents"
            )
        return tensor_codec.array_from_bytes(name, datatype, shape, b"")
    return tensor_codec.array_from_list(name, datatype, shape, values)


# --------------------------------------------------------------------------- response


def encode_model_infer_response(
    resp: InferResponse, request: InferRequest | None = None, shm: SharedMemory = shm_codec.NO_SHARED_MEMORY
) -> pb.ModelInferResponse:
    """Encode ``resp``; every output's data goes in ``raw_output_contents``, except that of an output
    ``request`` placed in shared memory: it is written to its region and its raw entry is empty, as Triton's."""
    in_shm = shm_codec.write_outputs(shm, request, resp) if request is not None else set()
    msg = pb.ModelInferResponse(model_name=resp.model_name, model_version=str(resp.model_version), id=resp.id)
    params_to_pb(resp.parameters, msg.parameters)
    raw: list[bytes] = []
    for t in resp.outputs:
        shape = [int(d) for d in t.shape]
        if tensor_codec.element_count(shape) != t.data.size:
            raise InternalError(f"output tensor shape does not match size of output for '{t.name}'")
        out = msg.outputs.add(name=t.name, datatype=t.datatype, shape=shape)
        if t.parameters:
            params_to_pb(t.parameters, out.parameters)
        if t.name in in_shm:
            raw.append(b"")
            continue
        data = tensor_codec.array_to_bytes(t.datatype, t.data)
        raw.append(data if isinstance(data, bytes) else data.tobytes())
    msg.raw_output_contents.extend(raw)
    return msg
