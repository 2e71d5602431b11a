"""Triton's generate extension: a flat JSON object in, one flat JSON object per response out.

Each top-level key of the request that names a model input becomes that
input (a scalar or a 1-D list, shaped from the model's metadata shape); any
other key becomes a request parameter, as do the keys of a nested
``"parameters"`` object (where, again, a key naming an input becomes that
input).  ``"id"`` is also the request id.  A response renders as
``model_name``, ``model_version``, ``id``, its parameters, and each output
(a scalar when it holds one element, else a flat list), with the reserved
keys winning over clashing names.  The rules and messages are Triton's
(``http_server.cc``, ``GenerateRequestClass``).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from serve_app.errors import InvalidArgument
from serve_app.inference.signature import WILDCARD_DIM, ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, ParamValue
from serve_app.limits import DEFAULT_LIMITS, RequestLimits
from serve_app.protocol.http_codec import json_data, parse_json

PARAMETERS = "parameters"
# The generate endpoint's answer when a model gives other than one response.
EXACTLY_ONE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that generates various "
    "number of responses"
)


def decode_generate_request(
    body: bytes, *, model_name: str, model_version: str, sig: ModelSignature, limits: RequestLimits = DEFAULT_LIMITS
) -> InferRequest:
    obj = parse_json(body, limits) if body.strip() else {}
    if not isinstance(obj, dict):
        raise InvalidArgument("Unable to parse the request: expected a JSON object")
    return generate_request(obj, model_name=model_name, model_version=model_version, sig=sig)


def generate_request(obj: dict[str, Any], *, model_name: str, model_version: str, sig: ModelSignature) -> InferRequest:
    """A parsed generate object as a request (other front ends that speak in named values build on it)."""
    request = InferRequest(model_name=model_name, model_version=model_version)
    if "id" in obj:
        if not isinstance(obj["id"], str):
            raise InvalidArgument("Unable to parse 'id'")
        request.id = obj["id"]
    if PARAMETERS in sig.inputs and PARAMETERS in obj:
        raise InvalidArgument("Keyword 'parameters' for nested schema also given as input tensor name")
    for key, value in obj.items():
        if key == PARAMETERS:
            if not isinstance(value, dict):
                raise InvalidArgument(f"Expected JSON object for keyword: '{PARAMETERS}': {json.dumps(value)}")
            for inner, inner_value in value.items():
                try:
                    _map(request, sig, inner, inner_value)
                except InvalidArgument as exc:
                    raise InvalidArgument(f"Converting keyword: '{PARAMETERS}': {exc.message}") from None
            continue
        _map(request, sig, key, value)
    return request


def _map(request: InferRequest, sig: ModelSignature, key: str, value: Any) -> None:
    """A key naming an input becomes that tensor; any other key a request parameter."""
    spec = sig.inputs.get(key)
    if spec is None:
        request.parameters[key] = _parameter(key, value)
        return
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, (list, dict)) for v in values):
        raise InvalidArgument(f"The schema can not convert input '{key}' to tensor with proper shape")
    shape = _shape(key, sig.full_shape(spec), len(values))
    dt = spec.datatype
    try:
        if dt.wire_name == "BYTES":
            flat = np.array(
                [v.encode("utf-8") if isinstance(v, str) else str(v).encode() for v in values], dtype=object
            )
        elif dt.wire_name == "BOOL":
            if not all(isinstance(v, bool) for v in values):
                raise TypeError("expected booleans")
            flat = np.array(values, dtype=np.bool_)
        else:
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                raise TypeError("expected numbers")
            flat = np.array(values, dtype=dt.numpy)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(f"unable to convert input '{key}' to {dt.wire_name}: {exc}") from None
    request.inputs.append(InferTensor(key, dt.wire_name, shape, flat.reshape(shape)))


def _shape(name: str, dims: list[int], count: int) -> tuple[int, ...]:
    """The metadata shape with its wildcards filled: the innermost takes what the fixed dims leave."""
    fixed = math.prod(d for d in dims if d != WILDCARD_DIM)
    wild = [i for i, d in enumerate(dims) if d == WILDCARD_DIM]
    if fixed == 0 or count % fixed or (not wild and count != fixed):
        raise InvalidArgument(f"The schema can not convert input '{name}' to tensor with proper shape")
    out = list(dims)
    for i in wild:
        out[i] = 1
    if wild:
        out[wild[-1]] = count // fixed
    return tuple(out)


def _parameter(key: str, value: Any) -> ParamValue:
    if isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    raise InvalidArgument(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def encode_generate_response(response: InferResponse) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if response.id:
        out["id"] = response.id
    out["model_name"] = response.model_name
    out["model_version"] = response.model_version
    for key, value in response.parameters.items():
        out.setdefault(key, value)
    for tensor in response.outputs:
        data = json_data(tensor)
        out.setdefault(tensor.name, data[0] if len(data) == 1 else data)
    return out


def generate_json(response: InferResponse) -> bytes:
    return json.dumps(encode_generate_response(response), separators=(",", ":")).encode()


def sse_event(payload: bytes) -> bytes:
    """One Server-Sent Event: ``data: <json>`` and a blank line."""
    return b"data: " + payload + b"\n\n"
