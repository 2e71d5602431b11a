"""Load / unload parameters of the model repository extension, decoded as Triton decodes them.

HTTP (``src/http_server.cc`` HandleRepositoryControl): the body is optional; ``parameters.config``
is a JSON string, ``parameters["file:<path>"]`` a base64 string, ``parameters.unload_dependents`` a
boolean.  gRPC (``src/grpc/grpc_server.cc``): ``config`` must be ``string_param``, ``file:*``
``bytes_param``, ``unload_dependents`` ``bool_param``.  A load refuses any other key; an unload
ignores them.  Files without a config are refused as Triton's core refuses them.  Where Triton
reports a client mistake as INTERNAL (its JSON helpers) we report INVALID_ARG with its words.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from serve_app.errors import InvalidArgument, Unsupported
from serve_app.limits import DEFAULT_LIMITS, RequestLimits
from serve_app.protocol.http_codec import parse_json
from serve_app.protos import grpc_service_pb2 as pb
from serve_app.repository.api import LoadParameters

CONFIG = "config"
FILE_PREFIX = "file:"
UNLOAD_DEPENDENTS = "unload_dependents"

NO_REPOSITORY_NAME = "'repository_name' specification is not supported"
FILES_NEED_CONFIG = "Load parameter 'config' must be specified for model file override"


def check_repository_name(name: str) -> None:
    """Triton serves one repository namespace: naming a repository is unsupported."""
    if name:
        raise Unsupported(NO_REPOSITORY_NAME)


def _load_parameters(config: str | None, files: dict[str, bytes]) -> LoadParameters:
    if files and config is None:
        raise InvalidArgument(FILES_NEED_CONFIG)
    return LoadParameters(config_json=config, files=files)


# --------------------------------------------------------------------------- HTTP


def _json_object(body: bytes, limits: RequestLimits) -> dict[str, object]:
    obj = parse_json(body, limits)
    if not isinstance(obj, dict):
        raise InvalidArgument("Unable to parse the request: expected a JSON object")
    return obj


def _decode_base64(key: str, text: str) -> bytes:
    """Standard base64; whitespace (line breaks) is skipped, any other stray character is refused.

    Triton's libb64 silently skips stray characters; refusing them keeps a corrupt file from loading.
    """
    try:
        return base64.b64decode("".join(text.split()).encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise InvalidArgument(f"Unable to parse '{key}': expected a base64 encoded string") from None


def http_load_parameters(body: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> LoadParameters:
    """The ``parameters`` of an HTTP load request; an empty body loads with none."""
    if not body:
        return LoadParameters()
    request = _json_object(body, limits)
    if "parameters" not in request:
        return LoadParameters()
    params = request["parameters"]
    if not isinstance(params, dict):
        raise InvalidArgument("Unable to parse 'parameters': attempt to get members for non-object")
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, value in params.items():
        if not isinstance(value, str):
            raise InvalidArgument(f"Unable to parse '{key}': attempt to access JSON non-string as string")
        if key == CONFIG:
            config = value
        elif key.startswith(FILE_PREFIX):
            files[key.removeprefix(FILE_PREFIX)] = _decode_base64(key, value)
        else:
            raise InvalidArgument(f"unrecognized load parameter '{key}'.")
    return _load_parameters(config, files)


def http_unload_dependents(body: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> bool:
    """``parameters.unload_dependents`` of an HTTP unload request (false when absent)."""
    if not body:
        return False
    params = _json_object(body, limits).get("parameters")
    if not isinstance(params, dict) or UNLOAD_DEPENDENTS not in params:
        return False
    value = params[UNLOAD_DEPENDENTS]
    if not isinstance(value, bool):
        raise InvalidArgument(f"Unable to parse '{UNLOAD_DEPENDENTS}': attempt to access JSON non-boolean as boolean")
    return value


# --------------------------------------------------------------------------- gRPC


def grpc_load_parameters(params: Mapping[str, pb.ModelRepositoryParameter]) -> LoadParameters:
    """The ``parameters`` map of a RepositoryModelLoadRequest."""
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, value in params.items():
        choice = value.WhichOneof("parameter_choice")
        if key == CONFIG:
            if choice != "string_param":
                raise InvalidArgument(f"invalid value type for load parameter '{key}', expected string_param.")
            config = value.string_param
        elif key.startswith(FILE_PREFIX):
            if choice != "bytes_param":
                raise InvalidArgument(f"invalid value type for load parameter '{key}', expected bytes_param.")
            files[key.removeprefix(FILE_PREFIX)] = value.bytes_param
        else:
            raise InvalidArgument(f"unrecognized load parameter '{key}'.")
    return _load_parameters(config, files)


def grpc_unload_dependents(params: Mapping[str, pb.ModelRepositoryParameter]) -> bool:
    """``unload_dependents`` of a RepositoryModelUnloadRequest (false when absent)."""
    if UNLOAD_DEPENDENTS not in params:
        return False
    value = params[UNLOAD_DEPENDENTS]
    if value.WhichOneof("parameter_choice") != "bool_param":
        raise InvalidArgument(f"invalid value type for '{UNLOAD_DEPENDENTS}' parameter, expected bool_param.")
    return value.bool_param
