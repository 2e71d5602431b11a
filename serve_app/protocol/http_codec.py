"""KServe v2 inference over HTTP: JSON bodies plus the binary tensor extension.

A request body is a JSON header optionally followed by tensor bytes; the
``Inference-Header-Content-Length`` header says where the JSON ends.  Inputs
whose ``parameters`` carry ``binary_data_size`` take that many bytes, in input
order, from after the JSON (as zero-copy views of the body); the rest carry
``data`` lists.  A header length of ``0`` is the raw binary request: the whole
body is the single input's data, its shape inferred from the model config.

Anything malformed is an :class:`~serve_app.errors.InvalidArgument` whose
message follows Triton's where Triton has one.  Whether the request fits the
model is :func:`serve_app.inference.validate.validate_request`'s job, not ours.

Parameters that decide the response encoding stay in the request:
``binary_data_output`` in ``InferRequest.parameters`` (set to true for a raw
binary request) and ``binary_data`` in each ``RequestedOutput.parameters``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeGuard, cast

import numpy as np
import orjson

from serve_app import datatypes
from serve_app.errors import InternalError, InvalidArgument
from serve_app.inference.options import strip_reserved
from serve_app.inference.signature import WILDCARD_DIM, ModelSignature, all_ints
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
from serve_app.protocol.limits import ElementBudget, check_counts, check_json_depth
from serve_app.shared_memory import SharedMemory, ShmRef

INFER_HEADER_CONTENT_LENGTH = "Inference-Header-Content-Length"
BINARY_DATA_SIZE = "binary_data_size"
BINARY_DATA = "binary_data"
BINARY_DATA_OUTPUT = "binary_data_output"
CLASSIFICATION = "classification"
SHARED_MEMORY_REGION = shm_codec.REGION

_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_INT_MIN, _INT_MAX, _UINT_MAX = -(2**63), 2**63 - 1, 2**64 - 1


# --------------------------------------------------------------------------- request


def decode_infer_request(
    body: bytes | bytearray | memoryview,
    header_length: str | None,
    *,
    model_name: str,
    model_version: str,
    sig: ModelSignature,
    limits: RequestLimits = DEFAULT_LIMITS,
    shm: SharedMemory = shm_codec.NO_SHARED_MEMORY,
) -> InferRequest:
    """Decode an infer request body.

    ``header_length`` is the ``Inference-Header-Content-Length`` header value
    as sent (``None`` when absent: the whole body is JSON).  ``sig`` is only
    needed to infer the input of a raw binary request (``"0"``).  ``limits``
    are checked on what the request declares, before its tensors are made.
    ``shm``: the registry that inputs and outputs naming a shared memory region
    are read from and checked against.
    """
    mv = memoryview(body).cast("B") if isinstance(body, memoryview) else memoryview(body)
    total = len(mv)
    if header_length is None:
        hlen = total
    else:
        hlen = _parse_header_length(header_length, total)
        if hlen == 0:
            return _raw_request(mv, model_name, model_version, sig, limits)

    header = parse_json(body if hlen == total and not isinstance(body, memoryview) else mv[:hlen], limits)
    if not isinstance(header, dict):
        raise InvalidArgument(f"Unable to parse the request: expected a JSON object, got {_json_type(header)}")

    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("Unable to parse 'id': expected a string")

    parameters = _parse_params(header.get("parameters"), "the request")
    strip_reserved(parameters)
    if BINARY_DATA_OUTPUT in parameters and not isinstance(parameters[BINARY_DATA_OUTPUT], bool):
        raise InvalidArgument("Unable to parse 'binary_data_output': expected a boolean")

    inputs_json = header.get("inputs")
    if not isinstance(inputs_json, list):
        raise InvalidArgument("Unable to parse 'inputs': expected an array of input tensors")
    outputs_json = header.get("outputs", [])
    if not isinstance(outputs_json, list):
        raise InvalidArgument("Unable to parse 'outputs': expected an array of requested outputs")
    check_counts(model_name, len(inputs_json), len(outputs_json), limits)

    budget = ElementBudget(model_name, limits)
    for item in inputs_json:  # every declared shape is counted before any input is decoded
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            shape = item.get("shape")
            if _is_int64_list(shape):
                dtype = item.get("datatype")
                budget.add(item["name"], shape, dtype if isinstance(dtype, str) else "")

    offset = hlen
    inputs: list[InferTensor] = []
    for item in inputs_json:
        tensor, offset = _decode_input(item, mv, offset, model_name, shm)
        inputs.append(tensor)
    if offset != total:
        raise InvalidArgument(f"unexpected additional input data for model '{model_name}'")
    outputs = [_decode_output(item, shm) for item in outputs_json]

    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=request_id,
        inputs=inputs,
        outputs=outputs,
        parameters=parameters,
    )


def _parse_header_length(raw: str, total: int) -> int:
    text = raw.strip()
    if not _INT_RE.fullmatch(text):
        raise InvalidArgument(f"Unable to parse {INFER_HEADER_CONTENT_LENGTH}, got: {raw}")
    value = int(text)
    if value < 0 or value > total:
        raise InvalidArgument(f"inference header size should be in range (0, {total}), got: {raw}")
    return value


def parse_json(raw: bytes | bytearray | memoryview, limits: RequestLimits = DEFAULT_LIMITS) -> object:
    """A request's JSON text, its nesting checked against ``limits`` before the recursive parse."""
    text = raw if isinstance(raw, bytes) else bytes(raw)
    check_json_depth(text, limits)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass  # not strict JSON (NaN, Infinity, huge integers) or malformed: the standard parser decides and words it
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {e.msg} at {e.pos}") from None
    except UnicodeDecodeError:
        raise InvalidArgument("failed to parse the request JSON buffer: invalid UTF-8") from None
    except RecursionError:
        raise InvalidArgument("failed to parse the request JSON buffer: nesting too deep") from None


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _parse_params(value: object, where: str) -> dict[str, ParamValue]:
    """A ``parameters`` object: scalar values only (bool, int, float, str)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"Unable to parse 'parameters' of {where}: expected a JSON object")
    for key, v in value.items():
        if not isinstance(v, (bool, int, float, str)):
            raise InvalidArgument(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', 'float' or 'string'."
            )
        if type(v) is int and not _INT_MIN <= v <= _UINT_MAX:
            raise InvalidArgument(f"parameter '{key}' is out of the 64-bit integer range")
    return value


NEGATIVE_DIMENSION = "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"


def _is_uint(value: object) -> TypeGuard[int]:
    return type(value) is int and value >= 0


def _is_int64_list(value: object) -> TypeGuard[list[int]]:
    """A JSON array of 64-bit integers (checked in C: the element types, then the extremes)."""
    if type(value) is not list:
        return False
    return not value or (all_ints(value) and min(value) >= _INT_MIN and max(value) <= _INT_MAX)


def _decode_input(
    item: object, mv: memoryview, offset: int, model_name: str, shm: SharedMemory
) -> tuple[InferTensor, int]:
    """One ``inputs`` entry; binary data is taken from ``mv`` at ``offset``."""
    if not isinstance(item, dict):
        raise InvalidArgument("Unable to parse 'inputs': each input must be a JSON object")
    name = item.get("name")
    if not isinstance(name, str):
        raise InvalidArgument("Unable to parse 'name': each input needs a string 'name'")
    datatype = item.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidArgument(f"Unable to parse 'datatype': input '{name}' needs a string 'datatype'")
    if datatype not in datatypes.BY_WIRE:
        raise InvalidArgument(f"invalid datatype '{datatype}' for input '{name}'")
    shape = item.get("shape")
    if not _is_int64_list(shape):
        raise InvalidArgument(f"Unable to parse 'shape': input '{name}' needs a 'shape' array of 64-bit integers")
    if shape and min(shape) < 0:  # Triton's HTTP front end reads each dimension as unsigned: a 500 of its parser
        raise InternalError(NEGATIVE_DIMENSION)
    params = _parse_params(item.get("parameters"), f"input '{name}'")

    has_data = "data" in item
    has_binary = BINARY_DATA_SIZE in params
    has_shm = SHARED_MEMORY_REGION in params
    if has_data + has_binary + has_shm != 1:
        msg = (
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But"
        )
        if not (has_data or has_binary or has_shm):
            msg += " no field is set"
        else:
            msg += " set" + "".join(
                f" '{f}'"
                for f, on in (
                    ("data", has_data),
                    (BINARY_DATA_SIZE, has_binary),
                    (SHARED_MEMORY_REGION, has_shm),
                )
                if on
            )
        raise InvalidArgument(f"{msg} for input '{name}'")

    dims = declared_shape(model_name, name, shape)
    if has_shm:
        ref = _shm_ref(params)
        data = shm_codec.input_array(shm, model_name, name, datatype, dims, ref)
        params = shm_codec.without_shm(params)
    elif has_binary:
        size = params[BINARY_DATA_SIZE]
        if not _is_uint(size):
            raise InvalidArgument(
                f"Unable to parse 'binary_data_size': expected a non-negative integer for input '{name}'"
            )
        end = offset + size
        if end > len(mv):
            raise InvalidArgument(
                f"unexpected size for input '{name}', expecting {end - len(mv)} additional bytes for "
                f"model '{model_name}'"
            )
        data = tensor_codec.array_from_bytes(name, datatype, dims, mv[offset:end])
        offset = end
        params = {k: v for k, v in params.items() if k != BINARY_DATA_SIZE}
    else:
        data = tensor_codec.array_from_list(name, datatype, dims, item["data"], json_data=True)

    return InferTensor(name=name, datatype=datatype, shape=dims, data=data, parameters=params), offset


def _decode_output(item: object, shm: SharedMemory) -> RequestedOutput:
    if not isinstance(item, dict):
        raise InvalidArgument("Unable to parse 'outputs': each output must be a JSON object")
    name = item.get("name")
    if not isinstance(name, str):
        raise InvalidArgument("Unable to parse 'name': each requested output needs a string 'name'")
    params = _parse_params(item.get("parameters"), f"output '{name}'")
    if SHARED_MEMORY_REGION in params:
        if CLASSIFICATION in params:
            raise InvalidArgument("Output can't set both 'shared_memory_region' and 'classification'")
        if params.get(BINARY_DATA) is True:
            raise InvalidArgument("Output can't set both 'shared_memory_region' and 'binary_data'")
    if BINARY_DATA in params and not isinstance(params[BINARY_DATA], bool):
        raise InvalidArgument(f"Unable to parse 'binary_data': expected a boolean for output '{name}'")
    if SHARED_MEMORY_REGION in params:
        ref = _shm_ref(params)
        shm_codec.check_output(shm, ref)
        params = {**params, shm_codec.OFFSET: ref.offset, shm_codec.BYTE_SIZE: ref.byte_size}
    return RequestedOutput(name=name, parameters=params)


def _shm_ref(params: dict[str, ParamValue]) -> ShmRef:
    """A tensor's ``shared_memory_*`` parameters, parsed as Triton's HTTP front end parses them."""
    region = params[SHARED_MEMORY_REGION]
    if not isinstance(region, str):
        raise InvalidArgument("Unable to parse 'shared_memory_region'")
    offset = params.get(shm_codec.OFFSET, 0)
    if not _is_uint(offset):
        raise InvalidArgument("Unable to parse 'shared_memory_offset'")
    size = params.get(shm_codec.BYTE_SIZE, 0)
    if not _is_uint(size):
        raise InvalidArgument("Unable to parse 'shared_memory_byte_size'")
    return ShmRef(region, offset, size)


def _raw_request(
    mv: memoryview, model_name: str, model_version: str, sig: ModelSignature, limits: RequestLimits
) -> InferRequest:
    """The whole body is the one input's data; every output goes back binary."""
    if len(sig.inputs) != 1:
        raise InvalidArgument(
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(sig.inputs)} inputs "
            f"in '{sig.name}' model configuration"
        )
    spec = next(iter(sig.inputs.values()))
    dims = list(spec.dims)
    shape = [1] if sig.max_batch_size > 0 else []
    if spec.datatype.itemsize == 0:
        if WILDCARD_DIM in dims or math.prod(dims) != 1:
            raise InvalidArgument(f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]")
        data: np.ndarray = np.empty(1, dtype=object)
        data[0] = bytes(mv)
        shape += dims
        data = data.reshape(shape)
    else:
        variable = [i for i, d in enumerate(dims) if d == WILDCARD_DIM]
        if len(variable) > 1:
            raise InvalidArgument(
                f"The shape of the raw input '{spec.name}' can not be deduced because there are more than "
                "one variable-sized dimension"
            )
        if variable:
            per_row = math.prod(d for d in dims if d != WILDCARD_DIM) * spec.datatype.itemsize
            dims[variable[0]] = len(mv) // per_row if per_row else 0
        shape += dims
        ElementBudget(model_name, limits).add(spec.name, shape)
        data = tensor_codec.array_from_bytes(spec.name, spec.datatype.wire_name, shape, mv)
    tensor = InferTensor(name=spec.name, datatype=spec.datatype.wire_name, shape=tuple(shape), data=data)
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=[tensor],
        parameters={BINARY_DATA_OUTPUT: True},
    )


# --------------------------------------------------------------------------- response


def encode_infer_response(
    response: InferResponse, request: InferRequest, shm: SharedMemory = shm_codec.NO_SHARED_MEMORY
) -> tuple[bytes | list[bytes | memoryview], int | None]:
    """Encode ``response`` for ``request``: ``(body, header_length)``.

    With no binary output the body is one ``bytes`` of JSON and the header
    length is ``None`` (send no ``Inference-Header-Content-Length``).  Otherwise
    the body is a list of chunks, JSON first, then each binary output's bytes
    in output order, and the header length is the JSON's size.

    An output the request lists is binary when it says ``binary_data: true``
    (JSON otherwise); an output it doesn't list, when the request says
    ``binary_data_output: true`` (a raw binary request does), as in Triton.
    Outputs are encoded as listed in ``response``; the caller decides which
    outputs it holds.  An output the request placed in shared memory is
    written to its region (``shm``) and listed without data, as Triton does.

    JSON ``data`` is the flattened row-major list.  BYTES elements must be
    valid UTF-8 to go as JSON strings: an element that is not fails the request
    with InvalidArgument telling the client to ask for binary data, rather than
    altering the bytes or emitting invalid JSON.  BF16 cannot go as JSON
    (InvalidArgument, as in Triton).
    """
    in_shm = shm_codec.write_outputs(shm, request, response)
    default_binary = request.parameters.get(BINARY_DATA_OUTPUT) is True
    per_output: dict[str, object] = {o.name: o.parameters.get(BINARY_DATA) for o in request.outputs}

    outputs_json: list[dict[str, object]] = []
    chunks: list[bytes | memoryview] = []
    for t in response.outputs:
        # A listed output is binary only by its own binary_data; binary_data_output is the unlisted ones' default.
        binary = per_output[t.name] is True if t.name in per_output else default_binary
        shape = [int(d) for d in t.shape]
        if math.prod(shape) != t.data.size:
            raise InternalError(f"output tensor shape does not match size of output for '{t.name}'")
        entry: dict[str, object] = {"name": t.name, "datatype": t.datatype, "shape": shape}
        if t.name in in_shm:  # written to its region: Triton sends neither data nor parameters
            pass
        elif binary:
            raw = tensor_codec.array_to_bytes(t.datatype, t.data)
            entry["parameters"] = {BINARY_DATA_SIZE: len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = json_data(t)
        outputs_json.append(entry)

    doc: dict[str, object] = {"model_name": response.model_name, "model_version": str(response.model_version)}
    if request.id:
        doc["id"] = response.id or request.id
    if response.parameters:
        doc["parameters"] = {k: _plain(v) for k, v in response.parameters.items()}
    doc["outputs"] = outputs_json

    header = dumps(doc)
    if chunks:
        return [header, *chunks], len(header)
    return header, None


def dumps(doc: object) -> bytes:
    """A JSON document as compact bytes: with orjson (about 15 times faster than the standard encoder on an
    infer response's numbers); with the standard encoder where orjson would differ (NaN and infinities, which
    Python's JSON writes as literals and orjson as null; integers past 64 bits)."""
    try:
        out = orjson.dumps(doc)
    except TypeError:  # an integer orjson cannot write
        return json.dumps(doc, separators=(",", ":")).encode()
    # orjson writes a NaN or an infinity as null: only a document with a null in it needs the walk.
    if b"null" not in out or _finite(doc):
        return out
    return json.dumps(doc, separators=(",", ":")).encode()


def _finite(value: object) -> bool:
    """No NaN or infinity anywhere in ``value`` (lists, dicts, floats; other leaves are finite)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        if not value:
            return True
        if isinstance(value[0], (list, dict)):
            return all(_finite(v) for v in value)
        if type(value[0]) is not float:  # a tensor's flat ``data`` has one type throughout: ints, bools, strings
            return True
        return math.isfinite(sum(value)) or all(math.isfinite(v) for v in value)  # one C-level sum, usually
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


def json_data(t: InferTensor) -> list[Any]:
    dt = datatypes.from_wire(t.datatype)
    arr = np.asarray(t.data)
    if dt.wire_name == "BF16":
        raise InvalidArgument(
            "sending BF16 data via JSON is not supported. Please use the binary data format for output"
        )
    if dt.itemsize == 0:
        out: list[str] = []
        append = out.append
        for v in arr.reshape(-1).tolist():
            if isinstance(v, (bytes, bytearray)):
                try:
                    append(v.decode("utf-8"))
                except UnicodeDecodeError:
                    raise InvalidArgument(
                        f"output '{t.name}' holds BYTES that are not valid UTF-8 and cannot be returned as "
                        "JSON; request it as binary data (binary_data: true)"
                    ) from None
            else:
                append(v if isinstance(v, str) else str(v))
        return out
    if dt.wire_name == "BOOL":
        if arr.dtype != np.bool_:
            arr = arr != 0
    elif arr.dtype != dt.numpy:
        arr = arr.astype(dt.numpy)
    return cast(list[Any], arr.reshape(-1).tolist())  # numpy's stubs: tolist() is Any


def error_body(message: str) -> bytes:
    """The JSON body of an error response: ``{"error": message}``."""
    return dumps({"error": message})
