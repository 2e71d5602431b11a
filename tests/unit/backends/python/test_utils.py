"""``triton_python_backend_utils`` as a model's code sees it: names, signatures and Triton's messages.

Models written for Triton catch, log and compare these, so the classes must behave as Triton's stub
binds them: tensors, the dtype helpers, BYTES serialization, errors and their codes, responses, the
response sender's rules, requests (received and built for BLS) and the logger.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import queue
import threading
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from serve_app.backends.python import utils as pb_utils
from serve_app.backends.python.context import CURRENT, ModelContext
from serve_app.errors import (
    AlreadyExists,
    Cancelled,
    InternalError,
    InvalidArgument,
    NotFound,
    ServeError,
    Unavailable,
    Unsupported,
)
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, StreamItem
from serve_app.observability.log_settings import LogSettings
from serve_app.observability.python_logging import LOGGER, apply

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


@contextmanager
def model_context(in_execute: bool) -> Iterator[ModelContext]:
    """What the backend sets around a call into the model (no server link: BLS has nowhere to go)."""
    ctx = ModelContext("m", "/models/m/1", "m_0_0", in_execute=in_execute)
    token = CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        CURRENT.reset(token)


def model_exception(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(pb_utils.TritonModelException) as err:
        call(*args, **kwargs)
    return str(err.value)


# -- Tensor --------------------------------------------------------------------------------------------
def test_tensor_basics() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = pb_utils.Tensor("OUT", data)
    assert t.name() == "OUT"
    assert t.shape() == [2, 3]
    assert t.triton_dtype() == 11  # TRITONSERVER_TYPE_FP32
    assert t.is_cpu()
    np.testing.assert_array_equal(t.as_numpy(), data)


def test_tensor_name_cannot_be_empty() -> None:
    assert model_exception(pb_utils.Tensor, "", np.zeros(1)) == "Tensor name cannot be an empty string."


def test_tensor_refuses_numpy_unicode() -> None:
    """``<U`` has no Triton datatype: a model must use object (or bytes_) arrays for BYTES."""
    message = model_exception(pb_utils.Tensor, "s", np.array(["a", "b"]))
    assert message.startswith("Tensor 's' has numpy dtype <U1")


def test_tensor_bytes_array_becomes_object_bytes() -> None:
    t = pb_utils.Tensor("s", np.array([b"ab", b"c"]))
    assert t.as_numpy().dtype == np.object_
    assert t.as_numpy().tolist() == [b"ab", b"c"]
    assert t.triton_dtype() == 13  # BYTES


def test_tensor_copies_a_non_contiguous_array() -> None:
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    view = base.T
    t = pb_utils.Tensor("t", view)
    assert t.as_numpy().flags.c_contiguous
    np.testing.assert_array_equal(t.as_numpy(), view)


def test_dlpack_round_trip_through_numpy() -> None:
    data = np.arange(6, dtype=np.int64).reshape(2, 3)
    t = pb_utils.Tensor("t", data)
    assert t.__dlpack_device__() == (1, 0)
    np.testing.assert_array_equal(np.from_dlpack(t), data)
    back = pb_utils.Tensor.from_dlpack("u", t)
    assert back.name() == "u"
    assert back.shape() == [2, 3]
    np.testing.assert_array_equal(back.as_numpy(), data)
    np.testing.assert_array_equal(pb_utils.Tensor.from_dlpack("v", data).as_numpy(), data)


def test_from_dlpack_takes_a_capsule() -> None:
    data = np.arange(4, dtype=np.float32)
    capsule = pb_utils.Tensor("t", data).to_dlpack()
    np.testing.assert_array_equal(pb_utils.Tensor.from_dlpack("u", capsule).as_numpy(), data)


def test_from_dlpack_refuses_other_objects() -> None:
    assert model_exception(pb_utils.Tensor.from_dlpack, "u", [1, 2]) == (
        "Provided tensor is not supported. Tensor must be a DLPack capsule or have `__dlpack__` and "
        "`__dlpack_device__` attributes"
    )


def test_from_dlpack_refuses_a_non_contiguous_tensor() -> None:
    transposed = np.arange(12, dtype=np.float32).reshape(3, 4).T
    assert model_exception(pb_utils.Tensor.from_dlpack, "u", transposed) == (
        "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order are supported."
    )


def test_bytes_tensor_has_no_dlpack() -> None:
    t = pb_utils.Tensor("s", np.array([b"x"], dtype=object))
    assert model_exception(t.to_dlpack) == "DLPack does not have support for string tensors."


# -- dtype helpers -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dtype", "code"),
    [
        (np.bool_, 1),
        (np.uint8, 2),
        (np.uint16, 3),
        (np.uint32, 4),
        (np.uint64, 5),
        (np.int8, 6),
        (np.int16, 7),
        (np.int32, 8),
        (np.int64, 9),
        (np.float16, 10),
        (np.float32, 11),
        (np.float64, 12),
        (np.object_, 13),
    ],
)
def test_numpy_and_triton_type_codes(dtype: Any, code: int) -> None:
    assert pb_utils.numpy_to_triton_type(dtype) == code
    assert pb_utils.numpy_to_triton_type(np.dtype(dtype)) == code
    assert pb_utils.triton_to_numpy_type(code) == dtype


def test_type_codes_without_a_counterpart() -> None:
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.str_) is None
    assert pb_utils.triton_to_numpy_type(14) is None  # BF16 has no numpy type
    assert pb_utils.triton_to_numpy_type(99) is None


def test_triton_string_to_numpy() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_INT64") is np.int64
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is bool
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    for unknown in ("FP32", "TYPE_BYTES", "TYPE_NOPE"):
        with pytest.raises(KeyError):
            pb_utils.triton_string_to_numpy(unknown)


def test_byte_tensor_serialization_round_trip() -> None:
    data = np.array([[b"ab", "é"], [b"", b"\x00\xff"]], dtype=object)
    encoded = pb_utils.serialize_byte_tensor(data)
    assert (
        bytes(encoded)
        == b"\x02\x00\x00\x00ab" + b"\x02\x00\x00\x00\xc3\xa9" + b"\x00" * 4 + b"\x02\x00\x00\x00\x00\xff"
    )
    decoded = pb_utils.deserialize_bytes_tensor(bytes(encoded))
    assert decoded.dtype == np.object_
    assert decoded.tolist() == [b"ab", "é".encode(), b"", b"\x00\xff"]


def test_serialize_byte_tensor_edge_cases() -> None:
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=object)) == ()
    assert pb_utils.serialize_byte_tensor(np.array([1, 2], dtype=np.int32)) is None


def test_serialize_byte_tensor_returns_bytes() -> None:
    assert isinstance(pb_utils.serialize_byte_tensor(np.array([b"a"], dtype=object)), bytes)


# -- errors ------------------------------------------------------------------------------------------
def test_triton_error_is_not_an_exception() -> None:
    error = pb_utils.TritonError("bad input")
    assert not isinstance(error, BaseException)
    assert error.message() == "bad input"
    assert error.code() == pb_utils.TritonError.INTERNAL
    assert issubclass(pb_utils.TritonModelException, Exception)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (pb_utils.TritonError.INTERNAL, InternalError),
        (pb_utils.TritonError.NOT_FOUND, NotFound),
        (pb_utils.TritonError.INVALID_ARG, InvalidArgument),
        (pb_utils.TritonError.UNAVAILABLE, Unavailable),
        (pb_utils.TritonError.UNSUPPORTED, Unsupported),
        (pb_utils.TritonError.ALREADY_EXISTS, AlreadyExists),
        (pb_utils.TritonError.CANCELLED, Cancelled),
    ],
)
def test_triton_error_codes_map_to_serve_errors(code: int, cls: type[ServeError]) -> None:
    error = pb_utils.TritonError("why", code).as_serve_error()
    assert type(error) is cls
    assert error.message == "why"
    assert pb_utils.TritonError.from_serve_error(error).code() == code


def test_unknown_triton_error_codes() -> None:
    unknown = pb_utils.TritonError("u", pb_utils.TritonError.UNKNOWN).as_serve_error()
    assert type(unknown) is ServeError
    assert type(pb_utils.TritonError("odd", 42).as_serve_error()) is InternalError


# -- responses ---------------------------------------------------------------------------------------
def test_inference_response() -> None:
    out = pb_utils.Tensor("OUT", np.zeros(2, dtype=np.float32))
    response = pb_utils.InferenceResponse(output_tensors=[out], parameters={"b": True, "i": 3, "s": "x"})
    assert response.output_tensors() == [out]
    assert not response.has_error()
    assert response.error() is None
    assert response.parameters() == '{"b":true,"i":3,"s":"x"}'
    assert pb_utils.InferenceResponse().parameters() == "{}"
    failed = pb_utils.InferenceResponse(error=pb_utils.TritonError("no"))
    assert failed.has_error()
    assert failed.error() is not None and failed.error().message() == "no"


def test_inference_response_parameter_types() -> None:
    """Triton's rules: str keys, bool/int/str values (no float), a dict or nothing."""
    assert model_exception(pb_utils.InferenceResponse, parameters={1: "x"}) == (
        "Expect parameters keys to have type str, found type <class 'int'>"
    )
    assert model_exception(pb_utils.InferenceResponse, parameters={"f": 0.5}) == (
        "Expect parameters values to have type bool/int/str, found type <class 'float'>"
    )
    with pytest.raises(TypeError, match="got <class 'list'>"):
        pb_utils.InferenceResponse(parameters=[("a", 1)])


def test_inference_response_checks_its_tensors_and_error() -> None:
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=[np.zeros(1)])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(error="bad")  # type: ignore[arg-type]


# -- the response sender ------------------------------------------------------------------------------
class Sent:
    """What a sender emitted."""

    def __init__(self) -> None:
        self.items: list[tuple[pb_utils.InferenceResponse | None, int]] = []

    def __call__(self, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        self.items.append((response, flags))


def sender(decoupled: bool, cancelled: bool = False) -> tuple[pb_utils.InferenceResponseSender, Sent]:
    sent = Sent()
    return pb_utils.InferenceResponseSender(sent, lambda: cancelled, decoupled=decoupled), sent


def test_decoupled_sender_sends_many_then_final() -> None:
    s, sent = sender(decoupled=True, cancelled=True)
    r1, r2 = pb_utils.InferenceResponse(), pb_utils.InferenceResponse()
    s.send(r1)
    s.send(r2)
    s.send(flags=FINAL)
    assert sent.items == [(r1, 0), (r2, 0), (None, FINAL)]
    assert s.closed
    assert s.is_cancelled()


def test_sender_rules() -> None:
    s, sent = sender(decoupled=True)
    assert model_exception(s.send, pb_utils.InferenceResponse(), 2) == (
        "Unable to send response. Unsupported flag provided."
    )
    assert model_exception(s.send, None, 0) == (
        "Inference Response object must be provided when the response flags is set to zero."
    )
    s.send(pb_utils.InferenceResponse(), FINAL)
    assert model_exception(s.send, pb_utils.InferenceResponse()) == (
        "Unable to send response. Response sender has been closed."
    )
    assert len(sent.items) == 1


def test_sender_closed_by_the_backend() -> None:
    s, _ = sender(decoupled=True)
    s.close()
    assert model_exception(s.send, pb_utils.InferenceResponse(), FINAL) == (
        "Unable to send response. Response sender has been closed."
    )


def test_non_decoupled_sender_takes_one_response() -> None:
    s, sent = sender(decoupled=False)
    s.send(pb_utils.InferenceResponse())
    assert model_exception(s.send, pb_utils.InferenceResponse()) == (
        "Unable to send response. Non-decoupled model cannot send more than one response."
    )
    s.send(flags=FINAL)
    assert [flags for _, flags in sent.items] == [0, FINAL]


def test_non_decoupled_sender_needs_a_response_before_a_flag_only_final() -> None:
    s, sent = sender(decoupled=False)
    assert model_exception(s.send, None, FINAL) == (
        "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
    )
    assert sent.items == []


# -- requests ----------------------------------------------------------------------------------------
def test_request_constructor_validation() -> None:
    x = pb_utils.Tensor("x", np.zeros(1))
    need = {"inputs": [x], "requested_output_names": ["y"], "model_name": "m"}
    assert model_exception(pb_utils.InferenceRequest, correlation_id=1.5, **need) == (
        "Correlation ID must be integer or string"
    )
    assert (
        model_exception(pb_utils.InferenceRequest, request_id="7", **{**need, "inputs": [x, None]})
        == "Input tensor for request with id '7' and model name 'm' should not be empty."
    )
    assert model_exception(
        pb_utils.InferenceRequest, request_id="7", **{**need, "requested_output_names": ["y", ""]}
    ) == ("Requested output name for request with id '7' and model name 'm' should not be empty.")
    assert model_exception(pb_utils.InferenceRequest, parameters={"k": 1.5}, **need) == (
        "Expect parameters values to have type bool/int/str, found type <class 'float'>"
    )
    assert model_exception(pb_utils.InferenceRequest, parameters={2: 1}, **need) == (
        "Expect parameters keys to have type str, found type <class 'int'>"
    )


@pytest.mark.parametrize(
    "change",
    [
        {"inputs": None},
        {"requested_output_names": None},
        {"requested_output_names": [None]},
        {"model_name": None},
        {"request_id": None},
        {"correlation_id": None},
        {"model_version": None},
        {"flags": None},
        {"timeout": None},
    ],
)
def test_request_arguments_of_the_wrong_type_are_type_errors_as_in_triton(change: dict[str, Any]) -> None:
    need = {"inputs": [pb_utils.Tensor("x", np.zeros(1))], "requested_output_names": ["y"], "model_name": "m"}
    with pytest.raises(TypeError, match="incompatible function arguments"):
        pb_utils.InferenceRequest(**{**need, **change})


@pytest.mark.parametrize("missing", ["inputs", "requested_output_names", "model_name"])
def test_a_request_without_a_required_argument_is_a_type_error(missing: str) -> None:
    need: dict[str, Any] = {"inputs": [], "requested_output_names": [], "model_name": "m"}
    del need[missing]
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(**need)


def test_empty_inputs_and_outputs_are_a_valid_request() -> None:
    pb_utils.InferenceRequest(requested_output_names=[], inputs=[], model_name="m")


def test_response_tensor_and_logger_arguments_as_triton_checks_them() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="Output tensor for inference response should not be"):
        pb_utils.InferenceResponse(output_tensors=[None])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)
    pb_utils.InferenceResponse(output_tensors=[])
    with pytest.raises(TypeError):
        pb_utils.Tensor(None, np.zeros(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pb_utils.Tensor("OUTPUT0", None)
    with pytest.raises(TypeError):
        pb_utils.Logger.log("message", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pb_utils.Logger.log(None)  # type: ignore[arg-type]


def test_bls_request_accessors() -> None:
    x = pb_utils.Tensor("x", np.zeros(1))
    request = pb_utils.InferenceRequest(
        request_id="r",
        correlation_id="seq-1",
        inputs=[x],
        requested_output_names=["y", "z"],
        model_name="other",
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        timeout=100,
        parameters={"k": "v", "n": 2},
    )
    assert request.inputs() == [x]
    assert request.requested_output_names() == {"y", "z"}
    assert (request.request_id(), request.correlation_id(), request.flags(), request.timeout()) == (
        "r",
        "seq-1",
        1,
        100,
    )
    assert request.parameters() == '{"k":"v","n":2}'
    assert model_exception(request.get_response_sender).startswith("this request has no response sender")


def test_received_request_hides_the_servers_parameters() -> None:
    """Reserved parameters are consumed by the server: ``execute`` sees only the client's own."""
    params = {
        "sequence_id": 5,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 1,
        "timeout": 10,
        "binary_data_output": True,
        "headers": "h",
        "triton_enable_empty_final_response": True,
        "temperature": 0.5,
        "top_k": 3,
        "stream": False,
        "user": "ann",
    }
    request = pb_utils.InferenceRequest.received(
        "id-1",
        {"x": np.ones((1, 2), dtype=np.float32)},
        ("y", "z", "y"),
        params,
        correlation_id=5,
        flags=3,
        timeout_us=10,
    )
    assert json.loads(request.parameters()) == {"temperature": 0.5, "top_k": 3, "stream": False, "user": "ann"}
    assert " " not in request.parameters()
    assert request.requested_output_names() == {"y", "z"}
    assert (request.request_id(), request.correlation_id(), request.flags(), request.timeout()) == ("id-1", 5, 3, 10)
    assert [t.name() for t in request.inputs()] == ["x"]
    assert pb_utils.InferenceRequest.received("", {}, (), {}).parameters() == "{}"


def test_received_request_sender_and_cancellation() -> None:
    request = pb_utils.InferenceRequest.received("", {}, (), {})
    s, _ = sender(decoupled=True)
    request.attach(s, lambda: True)
    assert request.get_response_sender() is s
    assert request.is_cancelled()


def test_bls_outside_execute_is_refused() -> None:
    request = pb_utils.InferenceRequest(
        inputs=[pb_utils.Tensor("x", np.zeros(1))], requested_output_names=["y"], model_name="other"
    )
    expected = "BLS is only supported during the 'execute' function."
    assert model_exception(request.exec) == expected
    assert model_exception(request.exec, decoupled=True) == expected
    assert model_exception(request.async_exec) == expected
    with model_context(in_execute=False):  # initialize / finalize
        assert model_exception(request.exec) == expected


def test_bls_without_a_server_link_answers_with_an_error_response() -> None:
    request = pb_utils.InferenceRequest(
        inputs=[pb_utils.Tensor("x", np.zeros(1))], requested_output_names=["y"], model_name="other"
    )
    with model_context(in_execute=True):
        response = request.exec()
        responses = list(request.exec(decoupled=True))
    assert response.has_error()
    assert "BLS is not available" in response.error().message()
    assert len(responses) == 1 and responses[0].has_error()


class _CancellableLink:
    """A server link whose decoupled model answers until its request is cancelled, then with a CANCELLED
    error as its final response (as Triton's ``response_sender_until_cancelled`` QA model does)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[StreamItem, None]:
        assert request.cancel is not None
        cancelled = asyncio.Event()
        request.cancel.listen(functools.partial(self.loop.call_soon_threadsafe, cancelled.set))
        while not cancelled.is_set():
            yield StreamItem(InferResponse("counter", "1", outputs=[InferTensor("OUT", "INT32", (1,), np.ones(1))]))
            await asyncio.sleep(0.001)
        yield StreamItem(error=Cancelled("request has been cancelled"), final=True)


def test_a_cancelled_bls_iterator_goes_on_to_the_called_models_final_response() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    ctx = ModelContext("m", "/models/m/1", "m_0_0", link=_CancellableLink(loop), loop=loop, in_execute=True)
    token = CURRENT.set(ctx)
    try:
        request = pb_utils.InferenceRequest(
            inputs=[pb_utils.Tensor("x", np.zeros(1))], requested_output_names=["OUT"], model_name="counter"
        )
        stream = request.exec(decoupled=True)
        total, errors = 0, []
        for response in stream:
            if response.has_error():
                errors.append((response.error().code(), response.error().message()))
                continue
            total += 1
            if total == 3:
                stream.cancel()
        stream.cancel()  # after the final response: nothing happens, as in Triton
    finally:
        CURRENT.reset(token)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert total >= 3
    assert errors == [(pb_utils.TritonError.CANCELLED, "request has been cancelled")]


# -- helpers -----------------------------------------------------------------------------------------
def test_tensor_and_config_lookups() -> None:
    x, y = pb_utils.Tensor("x", np.zeros(1)), pb_utils.Tensor("y", np.ones(1))
    request = pb_utils.InferenceRequest(inputs=[x, y], requested_output_names=[], model_name="m")
    assert pb_utils.get_input_tensor_by_name(request, "y") is y
    assert pb_utils.get_input_tensor_by_name(request, "nope") is None
    response = pb_utils.InferenceResponse([x])
    assert pb_utils.get_output_tensor_by_name(response, "x") is x
    assert pb_utils.get_output_tensor_by_name(response, "y") is None
    config = {"input": [{"name": "a", "data_type": "TYPE_FP32"}], "output": [{"name": "b", "data_type": "TYPE_INT32"}]}
    assert pb_utils.get_input_config_by_name(config, "a") == {"name": "a", "data_type": "TYPE_FP32"}
    assert pb_utils.get_input_config_by_name(config, "b") is None
    assert pb_utils.get_output_config_by_name(config, "b") == {"name": "b", "data_type": "TYPE_INT32"}
    assert pb_utils.get_output_config_by_name({}, "b") is None


def test_using_decoupled_model_transaction_policy() -> None:
    assert pb_utils.using_decoupled_model_transaction_policy({"model_transaction_policy": {"decoupled": True}})
    assert not pb_utils.using_decoupled_model_transaction_policy({"model_transaction_policy": {"decoupled": False}})
    assert not pb_utils.using_decoupled_model_transaction_policy({})


def test_get_model_dir() -> None:
    with model_context(in_execute=False):
        assert pb_utils.get_model_dir() == "/models/m/1"
    assert model_exception(pb_utils.get_model_dir).startswith("get_model_dir() is only available")


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_logger_logs_and_never_raises() -> None:
    """Records go to the server's log (the ``serve_app`` logger), named by model, from the model's own line."""
    log = logging.getLogger(LOGGER)
    handler, level = Records(), log.level
    log.addHandler(handler)
    apply(LogSettings(log_verbose_level=1))  # verbose messages too
    try:
        pb_utils.Logger.log("plain")
        pb_utils.Logger.log_verbose("verbose")
        with model_context(in_execute=True):
            pb_utils.Logger.log_info("info")
            pb_utils.Logger.log_warn("warn")
            pb_utils.Logger.log_error("error")
            pb_utils.Logger.log("custom", pb_utils.Logger.WARNING)
    finally:
        apply(LogSettings())
        log.removeHandler(handler)
        log.setLevel(level)
    assert [(r.levelno, r.getMessage()) for r in handler.records] == [
        (logging.INFO, "plain"),
        (logging.DEBUG, "verbose"),
        (logging.INFO, "model 'm': info"),
        (logging.WARNING, "model 'm': warn"),
        (logging.ERROR, "model 'm': error"),
        (logging.WARNING, "model 'm': custom"),
    ]
    assert {r.filename for r in handler.records} == {"test_utils.py"}


def test_model_control_outside_the_server_is_refused() -> None:
    assert model_exception(pb_utils.load_model, "x").startswith("load_model is only available")
    assert model_exception(pb_utils.is_model_ready, "x").startswith("is_model_ready is only available")
    assert model_exception(pb_utils.unload_model, "x").startswith("unload_model is only available")


def test_bls_request_takes_bytes_for_its_strings() -> None:
    """Triton's bindings take ``bytes`` wherever a string goes: ``model_name=b"add_sub"`` names add_sub."""
    x = pb_utils.Tensor("x", np.zeros(1, np.float32))
    request = pb_utils.InferenceRequest(
        model_name=b"add_sub", request_id=b"r", requested_output_names=[b"y"], inputs=[x]
    )
    assert (request.request_id(), request.requested_output_names()) == ("r", {"y"})
    sent = request._to_infer_request()
    assert (sent.model_name, sent.id, [o.name for o in sent.outputs]) == ("add_sub", "r", ["y"])


def test_metric_family_as_triton_checks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from serve_app.inference import custom_metrics

    monkeypatch.setattr(custom_metrics, "REGISTRY", custom_metrics.Registry())
    family = pb_utils.MetricFamily("latency", "Latency", pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"model": "m"})
    metric.increment(3)
    assert metric.value() == 3.0
    assert model_exception(metric.set, 1.0).startswith("Failed to set metric value: ")
    assert model_exception(metric.increment, -1.0).startswith("Failed to increment metric value: ")
    assert model_exception(family.Metric, labels=[1]) == "Failed to create metric. Labels must be a dictionary."
    assert model_exception(family.Metric, buckets=[1.0]) == "Failed to create metric. Unexpected buckets found."
    histogram = pb_utils.MetricFamily("sizes", "Sizes", pb_utils.MetricFamily.HISTOGRAM)
    assert model_exception(histogram.Metric) == "Failed to create metric. Missing required buckets."
    histogram.Metric(buckets=[1.0, 2.0]).observe(1.5)
    assert model_exception(pb_utils.MetricFamily, "latency", "", pb_utils.MetricFamily.GAUGE).startswith(
        "Error when creating MetricFamily: "
    )


def test_histogram_buckets_and_a_deleted_family_as_triton_refuses_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from serve_app.inference import custom_metrics

    monkeypatch.setattr(custom_metrics, "REGISTRY", custom_metrics.Registry())
    histogram = pb_utils.MetricFamily("h", "H", pb_utils.MetricFamily.HISTOGRAM)
    unsorted = "Error when creating Metric: Bucket Boundaries must be strictly sorted"
    assert model_exception(histogram.Metric, labels={}, buckets=[2.5, 0.1, 1.0]) == unsorted
    assert model_exception(histogram.Metric, labels={}, buckets=[1, 1, 2]) == unsorted
    assert (
        model_exception(histogram.Metric, labels={}, buckets=None)
        == "Failed to create metric. Missing required buckets."
    )
    histogram.Metric(labels={}, buckets=[])
    for kind in (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE):
        family = pb_utils.MetricFamily(f"lifetime_{kind}", "", kind)
        metric = family.Metric(labels={"a": "b"})
        del family
        for call in (metric.increment, metric.set):
            assert model_exception(call, 10).startswith("Invalid metric operation as the corresponding 'MetricFamily'")
        assert model_exception(metric.value).startswith("Invalid metric operation")


def test_the_metrics_port_shows_this_processs_families_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model in the gateway's process sees the families it created on the metrics port while it executes."""
    from serve_app.inference import custom_metrics

    monkeypatch.setattr(custom_metrics, "REGISTRY", custom_metrics.Registry())
    collected = custom_metrics.Collected()
    assert collected.render() == []
    family = pb_utils.MetricFamily("live", "Live", pb_utils.MetricFamily.GAUGE)
    family.Metric(labels={"m": "x"}).set(4)
    assert collected.render() == ["# HELP live Live", "# TYPE live gauge", 'live{m="x"} 4']


def test_a_bf16_input_refuses_as_numpy_as_in_triton_and_goes_through_dlpack() -> None:
    bits = np.array([0x3FC0, 0xC000], np.uint16)  # 1.5, -2.0
    request = pb_utils.InferenceRequest.received("r", {"IN": bits}, ("OUT",), {}, bf16=frozenset({"IN"}))
    tensor = request.inputs()[0]
    assert tensor.triton_dtype() == 14
    with pytest.raises(pb_utils.TritonModelException) as info:
        tensor.as_numpy()
    assert str(info.value) == (
        "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead."
    )
    torch = pytest.importorskip("torch")
    as_torch = torch.from_dlpack(tensor)
    assert as_torch.dtype == torch.bfloat16 and as_torch.tolist() == [1.5, -2.0]
    back = pb_utils.Tensor.from_dlpack("OUT", as_torch * 2)
    assert back.triton_dtype() == 14 and back._data.tolist() == [0x4040, 0xC080]  # 3.0, -4.0


def test_a_finished_response_iterator_yields_its_responses_again_as_in_triton() -> None:
    responses: queue.SimpleQueue[Any] = queue.SimpleQueue()
    answers = [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i]))]) for i in range(3)]
    for answer in answers:
        responses.put(answer)
    responses.put(pb_utils.ResponseIterator._END)
    iterator = pb_utils.ResponseIterator(responses, lambda: None)
    assert next(iterator) is answers[0]
    assert list(iterator) == answers[1:]  # resumes where it was, then finishes
    assert list(iterator) == answers  # finished: from the first again
    assert [r.output_tensors()[0].as_numpy().tolist() for r in iterator] == [[0], [1], [2]]


def test_bls_from_a_forked_child_answers_an_error_instead_of_waiting_for_ever() -> None:
    """multiprocessing's 'fork' children inherit the model's context but not the threads BLS calls ride on."""
    import multiprocessing

    with model_context(in_execute=True), multiprocessing.get_context("fork").Pool(1) as pool:
        message = pool.apply(_bls_error_message)
    assert message == pb_utils.FORKED_BLS


def _bls_error_message() -> str:
    request = pb_utils.InferenceRequest(
        inputs=[pb_utils.Tensor("x", np.zeros(1))], requested_output_names=["y"], model_name="other"
    )
    response = request.exec()
    return str(response.error().message()) if response.has_error() else ""
