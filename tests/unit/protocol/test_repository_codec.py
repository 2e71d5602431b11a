"""Load / unload parameters of the model repository extension, decoded with Triton's rules and words."""

from __future__ import annotations

import base64
import json

import pytest

from serve_app.errors import InvalidArgument, Unsupported
from serve_app.limits import RequestLimits
from serve_app.protocol import repository_codec as codec
from serve_app.protos import grpc_service_pb2 as pb
from serve_app.repository.api import LoadParameters

CONFIG = json.dumps({"name": "m", "backend": "onnxruntime", "max_batch_size": 4})
ONNX = bytes(range(256)) * 3  # every byte value, NULs included


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def invalid(fn: object, *args: object) -> str:
    with pytest.raises(InvalidArgument) as exc:
        fn(*args)  # type: ignore[operator]
    return exc.value.message


# --------------------------------------------------------------------------- repository name


def test_repository_name_must_be_empty() -> None:
    codec.check_repository_name("")
    with pytest.raises(Unsupported) as exc:
        codec.check_repository_name("models")
    assert exc.value.message == "'repository_name' specification is not supported"


# --------------------------------------------------------------------------- HTTP load


@pytest.mark.parametrize("raw", [b"", b"{}", b'{"parameters": {}}', b'{"other": 1}'])
def test_http_load_without_parameters(raw: bytes) -> None:
    assert codec.http_load_parameters(raw) == LoadParameters()


def test_http_load_config_only() -> None:
    assert codec.http_load_parameters(body({"parameters": {"config": CONFIG}})) == LoadParameters(config_json=CONFIG)


def test_http_load_config_and_files() -> None:
    raw = body({"parameters": {"config": CONFIG, "file:1/model.onnx": b64(ONNX), "file:labels.txt": b64(b"a\nb\n")}})
    params = codec.http_load_parameters(raw)
    assert params.config_json == CONFIG
    assert params.files == {"1/model.onnx": ONNX, "labels.txt": b"a\nb\n"}


def test_http_load_empty_file_and_wrapped_base64() -> None:
    wrapped = "\n".join(b64(ONNX)[i : i + 76] for i in range(0, len(b64(ONNX)), 76))  # MIME line breaks
    raw = body({"parameters": {"config": CONFIG, "file:1/model.onnx": wrapped, "file:1/empty": ""}})
    assert codec.http_load_parameters(raw).files == {"1/model.onnx": ONNX, "1/empty": b""}


def test_http_load_files_need_config() -> None:
    raw = body({"parameters": {"file:1/model.onnx": b64(ONNX)}})
    message = invalid(codec.http_load_parameters, raw)
    assert message == "Load parameter 'config' must be specified for model file override"


@pytest.mark.parametrize("value", ["not base64!", "QUJD$", "QQ==QQ==", "QUJ", "wq3Dqg==é"])
def test_http_load_invalid_base64(value: str) -> None:
    raw = body({"parameters": {"config": CONFIG, "file:1/model.onnx": value}})
    message = invalid(codec.http_load_parameters, raw)
    assert message == "Unable to parse 'file:1/model.onnx': expected a base64 encoded string"


@pytest.mark.parametrize(
    ("key", "value"),
    [("config", {"name": "m"}), ("config", None), ("config", 1), ("file:1/model.onnx", [1, 2]), ("other", True)],
)
def test_http_load_values_must_be_strings(key: str, value: object) -> None:
    raw = body({"parameters": {"config": CONFIG, key: value}})
    assert invalid(codec.http_load_parameters, raw) == (
        f"Unable to parse '{key}': attempt to access JSON non-string as string"
    )


@pytest.mark.parametrize("key", ["unload_dependents", "files", "File:1/model.onnx", "configs"])
def test_http_load_refuses_other_keys(key: str) -> None:
    raw = body({"parameters": {"config": CONFIG, key: "x"}})
    assert invalid(codec.http_load_parameters, raw) == f"unrecognized load parameter '{key}'."


@pytest.mark.parametrize("value", [None, [], "config", 3])
def test_http_load_parameters_must_be_an_object(value: object) -> None:
    message = invalid(codec.http_load_parameters, body({"parameters": value}))
    assert message == "Unable to parse 'parameters': attempt to get members for non-object"


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"{", "failed to parse the request JSON buffer"),
        (b" ", "failed to parse the request JSON buffer"),  # a body, though blank: Triton parses it
        (b"\xff", "invalid UTF-8"),
        (b"[]", "expected a JSON object"),
        (b'"x"', "expected a JSON object"),
    ],
)
def test_http_load_bad_body(raw: bytes, fragment: str) -> None:
    assert fragment in invalid(codec.http_load_parameters, raw)


# --------------------------------------------------------------------------- HTTP unload


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", False),
        (b"{}", False),
        (b'{"parameters": {}}', False),
        (b'{"parameters": {"unload_dependents": true}}', True),
        (b'{"parameters": {"unload_dependents": false}}', False),
        (b'{"parameters": {"unload_dependents": true, "config": 5, "other": "x"}}', True),  # others are ignored
        (b'{"parameters": []}', False),  # Triton finds no 'unload_dependents' there
    ],
)
def test_http_unload_dependents(raw: bytes, expected: bool) -> None:
    assert codec.http_unload_dependents(raw) is expected


@pytest.mark.parametrize("value", ["true", 1, None, {}])
def test_http_unload_dependents_must_be_boolean(value: object) -> None:
    message = invalid(codec.http_unload_dependents, body({"parameters": {"unload_dependents": value}}))
    assert message == "Unable to parse 'unload_dependents': attempt to access JSON non-boolean as boolean"


@pytest.mark.parametrize(
    ("raw", "fragment"), [(b"{", "failed to parse the request JSON buffer"), (b"[true]", "expected a JSON object")]
)
def test_http_unload_bad_body(raw: bytes, fragment: str) -> None:
    assert fragment in invalid(codec.http_unload_dependents, raw)


# --------------------------------------------------------------------------- gRPC load


def load_request(**params: pb.ModelRepositoryParameter) -> pb.RepositoryModelLoadRequest:
    req = pb.RepositoryModelLoadRequest(model_name="m")
    for key, value in params.items():
        req.parameters[key].CopyFrom(value)
    return req


def P(**kw: object) -> pb.ModelRepositoryParameter:  # reads like the proto constructor
    return pb.ModelRepositoryParameter(**kw)  # type: ignore[arg-type]


def test_grpc_load_without_parameters() -> None:
    assert codec.grpc_load_parameters(load_request().parameters) == LoadParameters()


def test_grpc_load_config_and_files() -> None:
    req = pb.RepositoryModelLoadRequest(model_name="m")
    req.parameters["config"].string_param = CONFIG
    req.parameters["file:1/model.onnx"].bytes_param = ONNX
    req.parameters["file:1/empty"].bytes_param = b""
    params = codec.grpc_load_parameters(pb.RepositoryModelLoadRequest.FromString(req.SerializeToString()).parameters)
    assert params == LoadParameters(config_json=CONFIG, files={"1/model.onnx": ONNX, "1/empty": b""})


def test_grpc_load_config_only() -> None:
    params = codec.grpc_load_parameters(load_request(config=P(string_param=CONFIG)).parameters)
    assert params == LoadParameters(config_json=CONFIG)


def test_grpc_load_files_need_config() -> None:
    req = load_request(**{"file:1/model.onnx": P(bytes_param=ONNX)})
    message = invalid(codec.grpc_load_parameters, req.parameters)
    assert message == "Load parameter 'config' must be specified for model file override"


@pytest.mark.parametrize("value", [P(bytes_param=CONFIG.encode()), P(bool_param=True), P(int64_param=1), P()])
def test_grpc_load_config_must_be_string_param(value: pb.ModelRepositoryParameter) -> None:
    message = invalid(codec.grpc_load_parameters, load_request(config=value).parameters)
    assert message == "invalid value type for load parameter 'config', expected string_param."


@pytest.mark.parametrize("value", [P(string_param=b64(ONNX)), P(bool_param=False), P(int64_param=7), P()])
def test_grpc_load_file_must_be_bytes_param(value: pb.ModelRepositoryParameter) -> None:
    req = load_request(config=P(string_param=CONFIG), **{"file:1/model.onnx": value})
    message = invalid(codec.grpc_load_parameters, req.parameters)
    assert message == "invalid value type for load parameter 'file:1/model.onnx', expected bytes_param."


@pytest.mark.parametrize("key", ["unload_dependents", "path", "FILE:x"])
def test_grpc_load_refuses_other_keys(key: str) -> None:
    req = load_request(**{key: P(string_param="x")})
    assert invalid(codec.grpc_load_parameters, req.parameters) == f"unrecognized load parameter '{key}'."


# --------------------------------------------------------------------------- gRPC unload


def unload_params(**params: pb.ModelRepositoryParameter) -> object:
    req = pb.RepositoryModelUnloadRequest(model_name="m")
    for key, value in params.items():
        req.parameters[key].CopyFrom(value)
    return req.parameters


def test_grpc_unload_dependents() -> None:
    assert codec.grpc_unload_dependents(unload_params()) is False
    assert codec.grpc_unload_dependents(unload_params(unload_dependents=P(bool_param=True))) is True
    assert codec.grpc_unload_dependents(unload_params(unload_dependents=P(bool_param=False))) is False
    others = unload_params(unload_dependents=P(bool_param=True), config=P(int64_param=3), x=P(string_param="y"))
    assert codec.grpc_unload_dependents(others) is True  # other keys are ignored


def test_grpc_unload_does_not_add_the_key() -> None:
    params = unload_params()
    codec.grpc_unload_dependents(params)
    assert "unload_dependents" not in params  # type: ignore[operator]


@pytest.mark.parametrize("value", [P(string_param="true"), P(int64_param=1), P(bytes_param=b"\x01"), P()])
def test_grpc_unload_dependents_must_be_bool_param(value: pb.ModelRepositoryParameter) -> None:
    message = invalid(codec.grpc_unload_dependents, unload_params(unload_dependents=value))
    assert message == "invalid value type for 'unload_dependents' parameter, expected bool_param."


def test_http_bodies_are_parsed_within_the_json_depth_limit() -> None:
    """Found by fuzzing: ``[[[[...`` made the parser recurse (the index answered 500 RecursionError)."""
    deep = b"[" * 5000
    assert invalid(codec.http_load_parameters, deep).startswith("JSON nesting depth exceeds maximum allowed limit")
    assert invalid(codec.http_unload_dependents, deep).startswith("JSON nesting depth exceeds maximum allowed limit")
    limits = RequestLimits(max_json_depth=1)  # one level of data past the request's own four
    with pytest.raises(InvalidArgument, match=r"allowed limit \(1\)"):
        codec.http_load_parameters(body({"parameters": {"config": [[[[1]]]]}}), limits)
