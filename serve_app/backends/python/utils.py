"""``triton_python_backend_utils``: what a Triton ``model.py`` imports, with Triton's names and messages.

A model's code reaches this module as ``import triton_python_backend_utils as pb_utils`` (the
backend registers it under that name before loading the model).  It follows Triton's
``triton_python_backend_utils.py`` and the classes its stub binds from C++: tensors, requests
and responses, errors, the response sender of decoupled models, BLS, logging and the helpers.
Requests to other models (BLS) and model control go through the server (see ``context.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import struct
import weakref
from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import Any

import numpy as np

from serve_app import datatypes
from serve_app.backends.python.context import current
from serve_app.backends.python.model_config import ModelConfig
from serve_app.errors import ErrorCode, ServeError, error_of
from serve_app.inference import custom_metrics
from serve_app.inference.cancel import CancelSignal
from serve_app.inference.custom_metrics import Labels
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, RequestedOutput
from serve_app.observability.python_logging import LOGGER

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_CPU_PINNED",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "Logger",
    "ModelConfig",
    "PreferredMemory",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

# TRITONSERVER_DataType codes (tritonserver.h), as Tensor.triton_dtype() reports them.
_TRITON_TYPES: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
    "BF16": 14,
}
_TYPE_NAMES = {code: name for name, code in _TRITON_TYPES.items()}
_RESERVED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output", "headers"}
)

model_logger = logging.getLogger(LOGGER)


# -- errors -------------------------------------------------------------------------------------------
class TritonModelException(Exception):
    """What model code raises to fail its execution (its text becomes the requests' error)."""


class TritonError:
    """An error a response carries (not an exception: to raise, use TritonModelException)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    _CODES: dict[int, ErrorCode] = {
        UNKNOWN: ErrorCode.UNKNOWN,
        INTERNAL: ErrorCode.INTERNAL,
        NOT_FOUND: ErrorCode.NOT_FOUND,
        INVALID_ARG: ErrorCode.INVALID_ARG,
        UNAVAILABLE: ErrorCode.UNAVAILABLE,
        UNSUPPORTED: ErrorCode.UNSUPPORTED,
        ALREADY_EXISTS: ErrorCode.ALREADY_EXISTS,
        CANCELLED: ErrorCode.CANCELLED,
    }

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def as_serve_error(self) -> ServeError:
        return error_of(self._CODES.get(self._code, ErrorCode.INTERNAL), self._message)

    @classmethod
    def from_serve_error(cls, error: ServeError) -> TritonError:
        by_code = {v: k for k, v in cls._CODES.items()}
        return cls(error.message, by_code.get(error.code, cls.INTERNAL))

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


# -- tensors ------------------------------------------------------------------------------------------
def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER_DataType code of a numpy dtype (object and bytes: BYTES); None if it has none."""
    dtype = np.dtype(data_type)
    if dtype.kind in ("O", "S"):
        return _TRITON_TYPES["BYTES"]
    for name, code in _TRITON_TYPES.items():
        if name not in ("BYTES", "BF16") and datatypes.from_wire(name).numpy == dtype:
            return code
    return None


def triton_to_numpy_type(data_type: int) -> Any:
    name = _TYPE_NAMES.get(int(data_type))
    if name is None or name == "BF16":
        return None
    return np.object_ if name == "BYTES" else datatypes.from_wire(name).numpy.type


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``numpy.float32`` (``TYPE_STRING`` -> ``numpy.object_``); KeyError if unknown."""
    if triton_type_string == "TYPE_STRING":
        return np.object_
    if triton_type_string == "TYPE_BOOL":
        return bool
    name = triton_type_string.removeprefix("TYPE_")
    if triton_type_string == name or name not in _TRITON_TYPES or name in ("BYTES", "BF16"):
        raise KeyError(triton_type_string)
    return datatypes.from_wire(name).numpy.type


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """Each element as a 4-byte little-endian length and its bytes (str elements UTF-8), as one byte array."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype.kind not in ("O", "S"):
        return None
    parts = []
    for value in input_tensor.ravel(order="C"):
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
        parts.append(struct.pack("<I", len(raw)) + raw)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The elements of a serialized BYTES tensor, as a 1-D object array of ``bytes``."""
    data = bytes(encoded_tensor)
    out, offset = [], 0
    while offset < len(data):
        (size,) = struct.unpack_from("<I", data, offset)
        offset += 4
        out.append(data[offset : offset + size])
        offset += size
    return np.array(out, dtype=np.object_)


_BF16 = _TRITON_TYPES["BF16"]
_BF16_TO_NUMPY = (
    "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead."
)


class Tensor:
    """A named tensor on the CPU: ``Tensor(name, numpy_array)``.  A BF16 tensor holds its 16-bit patterns
    (numpy has no bfloat16) and, as in Triton, refuses ``as_numpy()``."""

    _bf16 = False

    def __init__(self, name: str | bytes, data: Any, *_: Any) -> None:
        if isinstance(name, bytes):
            name = name.decode()
        if not isinstance(name, str) or data is None:
            raise _incompatible("__init__()", "Tensor(name: str, data: numpy.ndarray)", name, data)
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = np.asarray(data)
        if array.dtype.kind == "U":
            raise TritonModelException(
                f"Tensor '{name}' has numpy dtype {array.dtype}, which has no Triton datatype; use dtype=object "
                "with bytes (or numpy.bytes_) for BYTES tensors"
            )
        if array.dtype.kind == "S":
            array = array.astype(np.object_)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._data = array

    @classmethod
    def _handed(cls, name: str, array: np.ndarray, bf16: bool = False) -> Tensor:
        """An input as the server hands it to ``execute``: a contiguous array of a Triton datatype is taken
        as it is, unchecked (every input of every request is built here); ``bf16``: its datatype is BF16."""
        if not array.flags.c_contiguous or array.dtype.kind in "SU":
            tensor = cls(name, array)
        else:
            tensor = cls.__new__(cls)
            tensor._name = name
            tensor._data = array
        if bf16:
            tensor._bf16 = True
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._bf16:
            raise TritonModelException(_BF16_TO_NUMPY)
        return self._data

    def triton_dtype(self) -> int | None:
        return _BF16 if self._bf16 else numpy_to_triton_type(self._data.dtype)

    def shape(self) -> list[int]:
        return [int(d) for d in self._data.shape]

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._data.dtype.kind == "O":
            raise TritonModelException("DLPack does not have support for string tensors.")
        if self._bf16:
            return _bf16_dlpack(self._data)
        return self._data.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> Tensor:
        if type(dlpack).__name__ == "PyCapsule":  # a DLPack capsule (``to_dlpack()`` of a framework tensor)
            dlpack = _Capsule(dlpack)
        if not (hasattr(dlpack, "__dlpack__") and hasattr(dlpack, "__dlpack_device__")):
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have `__dlpack__` and "
                "`__dlpack_device__` attributes"
            )
        bf16 = str(getattr(dlpack, "dtype", "")) == "torch.bfloat16"  # a PyTorch tensor: numpy has no bfloat16
        array = np.from_dlpack(dlpack.view(_torch_int16())).view(np.uint16) if bf16 else np.from_dlpack(dlpack)
        if not array.flags.c_contiguous:
            raise TritonModelException(
                "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order are "
                "supported."
            )
        return Tensor._handed(name, array, bf16) if bf16 else Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._data.dtype})"


def _torch_int16() -> Any:
    import torch

    return torch.int16


def _bf16_dlpack(bits: np.ndarray) -> Any:
    """A BF16 tensor as DLPack of dtype bfloat16, through PyTorch (numpy cannot describe it); without
    PyTorch, its 16-bit patterns (uint16)."""
    try:
        import torch
    except ImportError:
        return bits.__dlpack__()
    return torch.utils.dlpack.to_dlpack(torch.from_numpy(bits).view(torch.bfloat16))


class _Capsule:
    """A bare DLPack capsule as the protocol numpy reads (CPU memory: the only kind served here)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class PreferredMemory:
    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


# -- arguments ------------------------------------------------------------------------------------------
class _Required:
    """The default of an argument that Triton's bindings require (a call without it is a TypeError)."""

    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Required()


def _incompatible(what: str, signature: str, *args: Any) -> TypeError:
    """The TypeError Triton's bindings raise for an argument of the wrong type (None included)."""
    invoked = ", ".join(repr(a) for a in args)
    return TypeError(
        f"{what}: incompatible function arguments. The following argument types are supported:\n"
        f"    1. {signature}\n\nInvoked with: {invoked}"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# -- responses ------------------------------------------------------------------------------------------
def _check_parameters(parameters: Any) -> dict[str, Any]:
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise TypeError(f"Expect dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return dict(parameters)


class InferenceResponse:
    """``InferenceResponse(output_tensors=[...], error=None, parameters=None)``."""

    def __init__(
        self, output_tensors: list[Tensor] | None = (), error: TritonError | None = None, parameters: Any = None  # type: ignore[assignment]
    ) -> None:
        if output_tensors is None:  # Triton's default is an empty list, and None is no list
            raise _incompatible(
                "__init__()", "InferenceResponse(output_tensors: list[Tensor] = [], error=None, parameters=None)", None
            )
        tensors = list(output_tensors)
        for t in tensors:
            if t is None:
                raise TritonModelException("Output tensor for inference response should not be empty.")
            if not isinstance(t, Tensor):
                raise TypeError(f"output_tensors must hold pb_utils.Tensor objects, found {type(t).__name__}")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"error must be a pb_utils.TritonError, found {type(error).__name__}")
        self._tensors = tensors
        self._error = error
        self._parameters = _check_parameters(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters, separators=(",", ":"))

    def parameter_dict(self) -> dict[str, Any]:
        return self._parameters

    @classmethod
    def from_infer_response(cls, response: InferResponse) -> InferenceResponse:
        tensors = [Tensor._handed(t.name, t.data, t.datatype == "BF16") for t in response.outputs]
        params = {k: v for k, v in response.parameters.items() if isinstance(v, (bool, int, str))}
        return cls(tensors, parameters=params)


Emit = Callable[[InferenceResponse | None, int], None]


class InferenceResponseSender:
    """How a request is answered outside ``execute``'s return: ``send(response, flags)`` and FINAL."""

    def __init__(self, emit: Emit, cancelled: Callable[[], bool], decoupled: bool) -> None:
        self._emit = emit
        self._cancelled = cancelled
        self._decoupled = decoupled
        self._closed = False
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if not self._decoupled:
            if response is not None and self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response."
                )
            if response is None and not self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
                )
        if response is not None:
            self._sent += 1
        if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        self._emit(response, flags)

    def is_cancelled(self) -> bool:
        return self._cancelled()

    def close(self) -> None:
        """The backend closed it (the request failed as a whole): later sends raise."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed


# -- requests -----------------------------------------------------------------------------------------
class ResponseIterator:
    """The responses of a decoupled BLS request, as they come.  ``cancel()`` cancels the request (the called
    model's ``is_cancelled()`` turns true) and iteration goes on until the model's final response, as in
    Triton, where that is usually a CANCELLED error; after the final response it does nothing.  As Triton's,
    it keeps the responses: iterating it again once it is finished yields them again from the first."""

    _END = object()

    def __init__(self, responses: queue.SimpleQueue[Any], cancel: Callable[[], None]) -> None:
        self._responses = responses
        self._cancel = cancel
        self._done = False
        self._seen: list[InferenceResponse] = []
        self._index = 0

    def __iter__(self) -> Iterator[InferenceResponse]:
        if self._done and self._index >= len(self._seen):
            self._index = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            if self._index < len(self._seen):
                self._index += 1
                return self._seen[self._index - 1]
            raise StopIteration
        item = self._responses.get()
        if item is ResponseIterator._END:
            self._done = True
            self._index = len(self._seen)
            raise StopIteration
        self._seen.append(item)
        return item  # type: ignore[no-any-return]

    def cancel(self) -> None:
        if not self._done:
            self._cancel()


class InferenceRequest:
    """A request: one of those ``execute`` receives, or one a model builds for another model (BLS)."""

    def __init__(
        self,
        request_id: str | bytes = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] = _REQUIRED,
        requested_output_names: list[str] | list[bytes] = _REQUIRED,
        model_name: str | bytes = _REQUIRED,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: Any = None,
        parameters: Any = None,
    ) -> None:
        _check_request_arguments(
            request_id, correlation_id, inputs, requested_output_names, model_name, model_version, flags, timeout
        )
        request_id = _text(request_id)
        model_name = _text(model_name)
        if not isinstance(correlation_id, (int, str)) or isinstance(correlation_id, bool):
            raise TritonModelException("Correlation ID must be integer or string")
        self._id: str = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        for t in self._inputs:
            if t is None:
                raise TritonModelException(
                    f"Input tensor for request with id '{request_id}' and model name '{model_name}' should not be "
                    "empty."
                )
        names = [_text(n) for n in requested_output_names]
        for name in names:
            if not name:
                raise TritonModelException(
                    f"Requested output name for request with id '{request_id}' and model name '{model_name}' "
                    "should not be empty."
                )
        self._requested: list[str] = names
        self._model_name: str | None = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = _check_parameters(parameters) if not isinstance(parameters, str) else json.loads(parameters)
        self._sender: InferenceResponseSender | None = None
        self._cancelled: Callable[[], bool] = lambda: False
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    # -- as ``execute`` receives it
    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> set[str]:
        return set(self._requested)

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return json.dumps(self._parameters, separators=(",", ":"))

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException("this request has no response sender: it was built for a BLS call")
        return self._sender

    def is_cancelled(self) -> bool:
        return self._cancelled()

    def set_release_flags(self, flags: int) -> None:
        self._release_flags = flags

    def trace(self) -> Any:
        return None

    # -- as a BLS call to another model
    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` and wait: an InferenceResponse (errors inside it), or, with
        ``decoupled``, an iterator of the responses."""
        ctx = _bls_context()
        request = self._to_infer_request()
        if isinstance(ctx, InferenceResponse):
            return ResponseIterator(_done_queue(ctx), lambda: None) if decoupled else ctx
        assert ctx.link is not None and ctx.event_loop() is not None
        if decoupled:
            return self._stream(ctx, request)
        future = asyncio.run_coroutine_threadsafe(_bls_one(ctx, request), ctx.event_loop())
        return future.result()

    def async_exec(self, decoupled: bool = False) -> Any:
        """:meth:`exec` as an awaitable, from an ``async def execute``."""
        ctx = _bls_context()
        request = self._to_infer_request()
        loop = asyncio.get_running_loop()
        if isinstance(ctx, InferenceResponse):
            done = loop.create_future()
            done.set_result(ResponseIterator(_done_queue(ctx), lambda: None) if decoupled else ctx)
            return done
        assert ctx.link is not None and ctx.event_loop() is not None
        if decoupled:
            return loop.run_in_executor(None, self._stream, ctx, request)
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_bls_one(ctx, request), ctx.event_loop()))

    def _stream(self, ctx: Any, request: InferRequest) -> ResponseIterator:
        responses: queue.SimpleQueue[Any] = queue.SimpleQueue()
        request.cancel = CancelSignal()
        asyncio.run_coroutine_threadsafe(_bls_stream(ctx, request, responses), ctx.event_loop())
        return ResponseIterator(responses, request.cancel.fire)

    def _to_infer_request(self) -> InferRequest:
        if not self._model_name:
            raise TritonModelException("a BLS request needs 'model_name'")
        inputs = []
        for t in self._inputs:
            data = t._data
            name = _TYPE_NAMES.get(t.triton_dtype() or 0, "")
            if not name:
                raise TritonModelException(f"input '{t.name()}' has a dtype ({data.dtype}) with no Triton datatype")
            inputs.append(InferTensor(t.name(), name, tuple(data.shape), data))
        params: dict[str, Any] = dict(self._parameters)
        if self._correlation_id:
            params["sequence_id"] = self._correlation_id
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
            params["sequence_start"] = True
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
            params["sequence_end"] = True
        if self._timeout:
            params["timeout"] = int(self._timeout)
        version = "" if self._model_version is None or int(self._model_version) < 0 else str(self._model_version)
        return InferRequest(
            model_name=self._model_name,
            model_version=version,
            id=self._id,
            inputs=inputs,
            outputs=[RequestedOutput(n) for n in self._requested],
            parameters=params,
        )

    @classmethod
    def received(
        cls,
        request_id: str,
        inputs: dict[str, np.ndarray],
        requested: tuple[str, ...],
        parameters: dict[str, Any],
        *,
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout_us: int = 0,
        bf16: frozenset[str] = frozenset(),
    ) -> InferenceRequest:
        """A request as ``execute`` receives it (reserved parameters are the server's, not the model's)."""
        # Built field by field: everything here comes from the server, already checked (``__init__`` checks
        # what a model passes), and every request of every batch is built this way.
        request = cls.__new__(cls)
        request._id = request_id
        request._correlation_id = correlation_id
        request._inputs = [Tensor._handed(name, _writable(array), name in bf16) for name, array in inputs.items()]
        request._requested = list(requested)
        request._model_name = None
        request._model_version = -1
        request._flags = flags
        request._timeout = timeout_us
        request._parameters = (
            {k: v for k, v in parameters.items() if k not in _RESERVED_PARAMETERS and not k.startswith("triton_")}
            if parameters
            else {}
        )
        request._sender = None
        request._cancelled = _never
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    def attach(self, sender: InferenceResponseSender, cancelled: Callable[[], bool]) -> None:
        self._sender = sender
        self._cancelled = cancelled


def _never() -> bool:
    return False


_REQUEST_SIGNATURE = (
    "InferenceRequest(request_id: str = '', correlation_id: object = 0, inputs: list[Tensor], "
    "requested_output_names: list[str], model_name: str, model_version: int = -1, flags: int = 0, "
    "timeout: int = 0, preferred_memory: PreferredMemory = ..., trace: InferenceTrace = ..., "
    "parameters: object = None)"
)


def _check_request_arguments(
    request_id: Any,
    correlation_id: Any,
    inputs: Any,
    requested: Any,
    model_name: Any,
    model_version: Any,
    flags: Any,
    timeout: Any,
) -> None:
    """What Triton's bindings refuse with a TypeError before the request exists: a required argument
    missing, None where None is not taken, or a value of another type."""
    texts = (str, bytes)
    ok = (
        isinstance(request_id, texts)
        and correlation_id is not None
        and isinstance(inputs, (list, tuple))
        and isinstance(requested, (list, tuple, set))
        and all(isinstance(n, texts) for n in requested)
        and isinstance(model_name, texts)
        and _is_int(model_version)
        and _is_int(flags)
        and _is_int(timeout)
    )
    if not ok:
        args = (request_id, correlation_id, inputs, requested, model_name, model_version, flags, timeout)
        raise _incompatible("__init__()", _REQUEST_SIGNATURE, *args)


def _text(value: str | bytes) -> str:
    """A string argument as Triton's bindings take it: ``bytes`` are accepted as the text they encode."""
    return value.decode() if isinstance(value, bytes) else value


def _writable(array: np.ndarray) -> np.ndarray:
    """An input as Triton's stub hands it over: a writable array of the model's own (models write into
    their inputs, and DLPack exports only writable memory).  A read-only one is copied."""
    return array if array.flags.writeable else array.copy()


class _Forked:
    """Whether this process is a fork of the model's (``multiprocessing`` with the 'fork' start method):
    the threads that carry BLS calls to the server did not come along, so a call would wait for ever."""

    child = False

    @classmethod
    def after_in_child(cls) -> None:
        cls.child = True


os.register_at_fork(after_in_child=_Forked.after_in_child)

FORKED_BLS = (
    "BLS is not available in a process forked from the model's (multiprocessing's 'fork' start method): "
    "call exec() from the model's own process, or from threads"
)


def _bls_context() -> Any:
    """The calling model's context, or the error response a BLS call gets without one."""
    ctx = current()
    if ctx is None or not ctx.in_execute:
        raise TritonModelException("BLS is only supported during the 'execute' function.")
    if _Forked.child:
        return InferenceResponse(error=TritonError(FORKED_BLS))
    if ctx.link is None or ctx.event_loop() is None:
        return InferenceResponse(error=TritonError("BLS is not available in this server process"))
    return ctx


def _done_queue(response: InferenceResponse) -> queue.SimpleQueue[Any]:
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    q.put(response)
    q.put(ResponseIterator._END)
    return q


async def _bls_one(ctx: Any, request: InferRequest) -> InferenceResponse:
    try:
        return InferenceResponse.from_infer_response(await ctx.link.infer(request))
    except ServeError as exc:
        return InferenceResponse(error=TritonError.from_serve_error(exc))
    except Exception as exc:
        return InferenceResponse(error=TritonError(f"An error occurred while performing BLS request: {exc}"))


async def _bls_stream(ctx: Any, request: InferRequest, responses: queue.SimpleQueue[Any]) -> None:
    """A decoupled BLS call's responses into ``responses`` (a flag-only final as an empty response, as in
    Triton, where the iterator's last response may have no outputs)."""
    try:
        async for item in ctx.link.infer_stream(request):
            if item.error is not None:
                responses.put(InferenceResponse(error=TritonError.from_serve_error(item.error)))
            elif item.response is not None:
                responses.put(InferenceResponse.from_infer_response(item.response))
            else:
                responses.put(InferenceResponse())
            if item.final:
                break
    except ServeError as exc:
        responses.put(InferenceResponse(error=TritonError.from_serve_error(exc)))
    except Exception as exc:
        responses.put(InferenceResponse(error=TritonError(f"An error occurred while performing BLS request: {exc}")))
    finally:
        responses.put(ResponseIterator._END)


# -- helpers ------------------------------------------------------------------------------------------
def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for t in inference_request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for t in inference_response.output_tensors():
        if t.name() == name:
            return t
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for spec in model_config.get("input", []):
        if spec.get("name") == name:
            return spec  # type: ignore[no-any-return]
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for spec in model_config.get("output", []):
        if spec.get("name") == name:
            return spec  # type: ignore[no-any-return]
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def get_model_dir() -> str:
    """The directory of the running model's ``model.py`` (its version directory)."""
    ctx = current()
    if ctx is None:
        raise TritonModelException("get_model_dir() is only available to a model's code")
    return ctx.model_dir


class Logger:
    """Triton's model logger: records go to the server's log (the ``serve_app`` logger, in Triton's
    format, its kinds switched on and off by the log settings) with the model's name, from where the
    model called it."""

    INFO = logging.INFO
    WARNING = logging.WARNING
    ERROR = logging.ERROR
    VERBOSE = logging.DEBUG

    @staticmethod
    def log(message: str, level: int = logging.INFO) -> None:
        if not isinstance(message, str) or level not in _LOG_LEVELS or isinstance(level, bool):
            raise _incompatible("log()", "Logger.log(message: str, level: Logger.LogLevel = INFO)", message, level)
        _model_log(message, level)

    @staticmethod
    def log_info(message: str) -> None:
        _model_log(message, Logger.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        _model_log(message, Logger.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        _model_log(message, Logger.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        _model_log(message, Logger.VERBOSE)


_LOG_LEVELS = frozenset((Logger.INFO, Logger.WARNING, Logger.ERROR, Logger.VERBOSE))


def _model_log(message: str, level: int) -> None:
    ctx = current()
    prefix = f"model '{ctx.model_name}': " if ctx is not None else ""
    # stacklevel 3: the record names the model's line that called Logger, not this module's
    model_logger.log(level, "%s%s", prefix, message, stacklevel=3)


# -- custom metrics -----------------------------------------------------------------------------------------
_FAMILY_DELETED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' object "
    "should be deleted AFTER its corresponding 'Metric' objects have been deleted."
)


class Metric:
    """One labelled series of a :class:`MetricFamily` (``family.Metric(labels=..., buckets=...)``).  As in
    Triton, it refuses every operation once its family object is deleted."""

    def __init__(self, family: str, labels: Labels) -> None:
        self._family = family
        self._labels = labels
        self._cleared = False

    def increment(self, value: float) -> None:
        _metric_call("Failed to increment metric value: ", custom_metrics.REGISTRY.increment, self, value)

    def set(self, value: float) -> None:
        _metric_call("Failed to set metric value: ", custom_metrics.REGISTRY.set, self, value)

    def observe(self, value: float) -> None:
        _metric_call("Failed to observe metric value: ", custom_metrics.REGISTRY.observe, self, value)

    def value(self) -> float:
        if self._cleared:
            raise TritonModelException(_FAMILY_DELETED)
        try:
            return custom_metrics.REGISTRY.value(self._family, self._labels)
        except custom_metrics.MetricError as exc:
            raise TritonModelException(f"Failed to get metric value: {exc}") from None


def _metric_call(what: str, call: Callable[[str, Labels, float], None], metric: Metric, value: float) -> None:
    if metric._cleared:
        raise TritonModelException(_FAMILY_DELETED)
    try:
        call(metric._family, metric._labels, float(value))
    except custom_metrics.MetricError as exc:
        raise TritonModelException(what + str(exc)) from None


class MetricFamily:
    """Triton's custom metrics: a family of counters, gauges or histograms the model reports on the metrics
    port.  One family per name in the server: declaring it again with the same kind is the same family."""

    COUNTER = custom_metrics.COUNTER
    GAUGE = custom_metrics.GAUGE
    HISTOGRAM = custom_metrics.HISTOGRAM

    def __init__(self, name: str, description: str, kind: str) -> None:
        self._metrics: weakref.WeakSet[Metric] = weakref.WeakSet()
        try:
            custom_metrics.REGISTRY.family(name, description, kind)
        except custom_metrics.MetricError as exc:
            raise TritonModelException(f"Error when creating MetricFamily: {exc}") from None
        self._name = name
        self._kind = kind

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self._kind != self.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            if any(not a < b for a, b in pairwise(buckets)):  # prometheus-cpp's check
                raise TritonModelException("Error when creating Metric: Bucket Boundaries must be strictly sorted")
        elif self._kind == self.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        key = custom_metrics.labels_of(labels)
        custom_metrics.REGISTRY.add_metric(self._name, key, buckets)
        metric = Metric(self._name, key)
        self._metrics.add(metric)
        return metric

    def __del__(self) -> None:
        for metric in list(getattr(self, "_metrics", ())):
            metric._cleared = True


def _control(call: Callable[[Any], Any], what: str) -> Any:
    ctx = current()
    if ctx is None or ctx.link is None or ctx.event_loop() is None:
        raise TritonModelException(f"{what} is only available to a model's code while the server runs")
    try:
        loop = ctx.event_loop()
        assert loop is not None  # checked above
        return asyncio.run_coroutine_threadsafe(call(ctx.link), loop).result()
    except ServeError as exc:
        raise TritonModelException(exc.message) from None


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name`` through model control (explicit mode)."""
    _control(lambda link: link.load(model_name, config or "", dict(files or {})), "load_model")


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _control(lambda link: link.unload(model_name, unload_dependents), "unload_model")


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return bool(_control(lambda link: link.is_ready(model_name, str(model_version)), "is_model_ready"))
