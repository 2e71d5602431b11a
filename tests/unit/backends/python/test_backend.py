"""PythonBackend on its own (no host, no server): ``model.py`` loaded, called and checked as Triton's stub does.

Each test writes a ``model.py`` into ``tmp_path/<model>/1/`` and builds the backend directly from a
``BackendContext``.  What is checked is Triton's contract: the ``initialize`` arguments, errors at
load, ``execute``'s return rules and their messages (a broken batch fails every request; a
``TritonError`` response fails only its own), output pruning, ``async def execute``, ``finalize``,
and a decoupled model's response senders (including the safety net for a sender dropped unfinished).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from serve_app.backends.python import utils as pb_utils
from serve_app.backends.python.backend import PythonBackend
from serve_app.errors import InternalError, InvalidArgument, NotFound
from serve_app.inference.cancel import CancelSignal
from serve_app.inference.execution import Execution, PartResult, RequestPart
from tests.unit.backends.python.conftest import INSTANCE, Factory, close_loop, model_path

FAILED = f"Failed to process the request(s) for model '{INSTANCE}', message: "

# OUTPUT0 = INPUT0 + 1, OUTPUT1 = INPUT0 * 2, and EXTRA, which the config doesn't declare.  ``mode`` (set by
# a test on the loaded model) breaks the contract in one of Triton's ways.
ADD_PY = """
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.model_dir = pb_utils.get_model_dir()
        self.mode = "ok"
        self.seen = []
        self.senders = []

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.seen.append(
                (request.request_id(), x.shape, request.requested_output_names(), json.loads(request.parameters()))
            )
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTPUT0", x + 1),
                        pb_utils.Tensor("OUTPUT1", x * 2),
                        pb_utils.Tensor("EXTRA", x),
                    ],
                    parameters={"n": len(requests)},
                )
            )
        if self.mode == "raise":
            raise ValueError("boom")
        if self.mode == "tuple":
            return tuple(responses)
        if self.mode == "short":
            return responses[:1]
        if self.mode == "dict":
            return [{"OUTPUT0": 1}] * len(requests)
        if self.mode == "error-first":
            error = pb_utils.TritonError("bad request", pb_utils.TritonError.INVALID_ARG)
            responses[0] = pb_utils.InferenceResponse(error=error)
        if self.mode == "none":
            return None
        if self.mode == "sender":
            for request, response in zip(requests, responses):
                sender = request.get_response_sender()
                self.senders.append(sender)
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        if self.mode == "cancelled":  # reports what each request's is_cancelled() says
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([float(r.is_cancelled())] * 4))])
                for r in requests
            ]
        if self.mode == "sender-twice":
            requests[0].get_response_sender().send(responses[0])
        if self.mode == "later":
            pairs = [(request.get_response_sender(), response) for request, response in zip(requests, responses)]

            def answer():
                time.sleep(0.05)
                for sender, response in pairs:
                    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Thread(target=answer).start()
            return None
        if self.mode == "later-mixed":  # the last request answers through its sender, after execute returned
            sender, last = requests[-1].get_response_sender(), responses[-1]

            def answer_last():
                time.sleep(0.05)
                sender.send(last, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Thread(target=answer_last).start()
            return responses[:-1] + [None]
        return responses

    def finalize(self):
        self.finalized = True
"""

ASYNC_PY = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.sleep(0)
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + 1)]))
        return out
"""

# Decoupled: INPUT0[0] responses per request (OUTPUT0 = i, OUTPUT1 = -i), then the final flag alone.
REPEAT_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        self.mode = "ok"
        self.kept = []
        self.cancelled = []

    def execute(self, requests):
        for index, request in enumerate(requests):
            sender = request.get_response_sender()
            self.cancelled.append((request.is_cancelled(), sender.is_cancelled()))
            if self.mode in ("keep", "return-open"):
                self.kept.append(request)
                continue
            count = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            for i in range(count):
                out = [pb_utils.Tensor("OUTPUT0", np.array([i], np.float32)),
                       pb_utils.Tensor("OUTPUT1", np.array([-i], np.float32))]
                sender.send(pb_utils.InferenceResponse(out, parameters={"i": i}))
            if self.mode == "drop":
                continue
            if self.mode == "raise" and index == 1:
                raise RuntimeError("second request broke")
            sender.send(flags=FINAL)
        if self.mode in ("return", "return-open"):
            return []
        return None
"""

ASYNC_REPEAT_PY = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.fail = False

    async def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            await asyncio.sleep(0.01)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([1], np.float32))]))
            if self.fail:
                raise RuntimeError("late failure")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def part(value: float, outputs: tuple[str, ...] = (), rid: str = "", rows: int = 1, **params: int | str) -> RequestPart:
    """One request of a non-batching model, with its own INPUT0 (four values)."""
    data = np.full((4,), value, dtype=np.float32)
    return RequestPart(rows, outputs, rid, dict(params), inputs={"INPUT0": data})


def execution(*parts: RequestPart) -> Execution:
    wanted = tuple(sorted({name for p in parts for name in p.outputs})) or ("OUTPUT0", "OUTPUT1")
    return Execution({}, wanted, 0, parts=parts)


def load_error(make: Factory, code: str | None) -> str:
    with pytest.raises(InternalError) as err:
        make(code)
    return err.value.message


# -- loading -----------------------------------------------------------------------------------------
def test_missing_model_py(make: Factory, tmp_path: Path) -> None:
    assert load_error(make, None) == (f"model.py does not exist in the model repository path: {model_path(tmp_path)}")


def test_module_without_triton_python_model(make: Factory) -> None:
    assert load_error(make, "class SomethingElse:\n    pass\n").startswith("AttributeError")


def test_import_error_names_the_model_file(make: Factory, tmp_path: Path) -> None:
    message = load_error(make, "import no_such_module_for_this_test\n")
    assert message.startswith("ModuleNotFoundError: No module named 'no_such_module_for_this_test'")
    assert str(model_path(tmp_path)) in message


def test_model_without_execute(make: Factory, tmp_path: Path) -> None:
    assert load_error(make, "class TritonPythonModel:\n    pass\n") == (
        f"Python model {model_path(tmp_path)} does not implement `execute` method."
    )


def test_initialize_raising(make: Factory, tmp_path: Path) -> None:
    """Triton's load error: ``<Type>: <message>`` and where the model raised it."""
    code = """
    class TritonPythonModel:
        def initialize(self, args):
            raise ValueError("no weights here")

        def execute(self, requests):
            return []
    """
    message = load_error(make, code)
    assert message.startswith("ValueError: no weights here")
    assert f"{model_path(tmp_path)}(3): initialize" in message


def test_initialize_args(make: Factory, tmp_path: Path) -> None:
    """The seven string arguments Triton's stub passes; ``model_repository`` is the model directory."""
    backend = make(ADD_PY)
    args = backend.model.args
    assert set(args) == {
        "model_config",
        "model_instance_kind",
        "model_instance_name",
        "model_instance_device_id",
        "model_repository",
        "model_version",
        "model_name",
    }
    assert all(isinstance(v, str) for v in args.values())
    config = json.loads(args["model_config"])
    assert config["name"] == "m"
    assert config["backend"] == "python"
    assert [i["name"] for i in config["input"]] == ["INPUT0"]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["input"][0]["dims"] == [4]
    assert " " not in args["model_config"]
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_name"] == INSTANCE
    assert args["model_instance_device_id"] == "0"
    assert args["model_repository"] == str(tmp_path / "m")
    assert args["model_version"] == "1"
    assert args["model_name"] == "m"
    assert backend.model.model_dir == str(tmp_path / "m" / "1")


def test_initialize_args_on_a_gpu(make: Factory) -> None:
    args = make(ADD_PY, device_kind="KIND_GPU", gpu_ids=(3,)).model.args
    assert (args["model_instance_kind"], args["model_instance_device_id"]) == ("GPU", "3")


def test_model_without_initialize_loads(make: Factory) -> None:
    backend = make(ASYNC_PY)
    assert backend.is_ready()


# -- execute -----------------------------------------------------------------------------------------
def test_each_request_gets_its_own_response_with_only_what_it_asked_for(make: Factory) -> None:
    backend = make(ADD_PY)
    results = backend.execute_parts({}, execution(part(1.0, ("OUTPUT0",), "a", k="v"), part(2.0, (), "b")))
    assert [r.error for r in results] == [None, None]
    assert set(results[0].outputs) == {"OUTPUT0"}
    assert set(results[1].outputs) == {"OUTPUT0", "OUTPUT1"}  # EXTRA is not in the config: pruned
    np.testing.assert_array_equal(results[0].outputs["OUTPUT0"], np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal(results[1].outputs["OUTPUT1"], np.full(4, 4.0, np.float32))
    assert results[0].parameters == {"n": 2}
    assert backend.model.seen == [
        ("a", (4,), {"OUTPUT0"}, {"k": "v"}),
        ("b", (4,), {"OUTPUT0", "OUTPUT1"}, {}),
    ]


def test_batched_model_gets_each_request_its_own_rows(make: Factory) -> None:
    backend = make(ADD_PY, max_batch_size=8)
    merged = np.arange(12, dtype=np.float32).reshape(3, 4)
    parts = (RequestPart(1, (), "a"), RequestPart(2, (), "b"))
    results = backend.execute_parts({"INPUT0": merged}, Execution({"INPUT0": merged}, ("OUTPUT0",), 3, parts=parts))
    assert [s[:2] for s in backend.model.seen] == [("a", (1, 4)), ("b", (2, 4))]
    np.testing.assert_array_equal(results[1].outputs["OUTPUT0"], merged[1:] + 1)


def test_whole_batch_execute(make: Factory) -> None:
    """The path warmup samples take: the batch as one request."""
    backend = make(ADD_PY, max_batch_size=8)
    out = backend.execute({"INPUT0": np.ones((2, 4), np.float32)}, ["OUTPUT1"])
    assert set(out) == {"OUTPUT1"}
    np.testing.assert_array_equal(out["OUTPUT1"], np.full((2, 4), 2.0, np.float32))


def test_an_exception_fails_every_request(make: Factory, tmp_path: Path) -> None:
    backend = make(ADD_PY)
    backend.model.mode = "raise"
    results = backend.execute_parts({}, execution(part(1.0), part(2.0)))
    for result in results:
        assert isinstance(result.error, InternalError)
        assert result.error.message.startswith(FAILED + "ValueError: boom")
        assert str(model_path(tmp_path)) in result.error.message
        assert "execute" in result.error.message


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("tuple", "Expected a list in the execute return, found type '<class 'tuple'>'."),
        (
            "short",
            "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
            "InferenceRequest(s) size is:2, and InferenceResponse(s) size is:1\n",
        ),
        (
            "dict",
            "Expected an 'InferenceResponse' object in the execute function return list, found type '<class 'dict'>'.",
        ),
        ("sender-twice", "Unable to send response. Non-decoupled model cannot send more than one response."),
    ],
)
def test_contract_violations_fail_the_batch(make: Factory, mode: str, message: str) -> None:
    backend = make(ADD_PY)
    backend.model.mode = mode
    results = backend.execute_parts({}, execution(part(1.0), part(2.0)))
    if mode == "sender-twice":
        # The request the model already answered keeps its answer, as in Triton (closed requests are skipped).
        assert results[0].error is None
        results = results[1:]
    for result in results:
        assert isinstance(result.error, InternalError)
        assert result.error.message == FAILED + message


def test_a_triton_error_response_fails_only_its_request(make: Factory) -> None:
    backend = make(ADD_PY)
    backend.model.mode = "error-first"
    first, second = backend.execute_parts({}, execution(part(1.0), part(2.0)))
    assert isinstance(first.error, InvalidArgument)
    assert first.error.message == "bad request"
    assert second.error is None
    assert set(second.outputs) == {"OUTPUT0", "OUTPUT1"}


def test_answers_through_the_response_sender(make: Factory) -> None:
    """Non-decoupled models may answer through the sender (24.06+) and return None."""
    backend = make(ADD_PY)
    backend.model.mode = "sender"
    results = backend.execute_parts({}, execution(part(1.0, ("OUTPUT1",)), part(2.0)))
    assert [r.error for r in results] == [None, None]
    assert set(results[0].outputs) == {"OUTPUT1"}
    # After execute the backend closes the senders: a late send raises Triton's error.
    with pytest.raises(Exception, match="Response sender has been closed"):
        backend.model.senders[0].send(None, 1)


def test_answers_sent_from_a_thread_after_execute_returned_are_waited_for(make: Factory) -> None:
    backend = make(ADD_PY)
    backend.model.mode = "later"
    results = backend.execute_parts({}, execution(part(1.0), part(2.0, ("OUTPUT0",))))
    assert [r.error for r in results] == [None, None]
    assert results[0].outputs["OUTPUT0"].tolist() == [2.0] * 4 and set(results[1].outputs) == {"OUTPUT0"}


def test_a_none_entry_in_the_returned_list_answers_through_its_sender(make: Factory) -> None:
    """As in Triton: the other entries are the answers, and the None one's sender stays open for its answer."""
    backend = make(ADD_PY)
    backend.model.mode = "later-mixed"
    results = backend.execute_parts({}, execution(part(1.0), part(2.0, ("OUTPUT0",))))
    assert [r.error for r in results] == [None, None]
    assert results[0].outputs["OUTPUT0"].tolist() == [2.0] * 4
    assert results[1].outputs["OUTPUT0"].tolist() == [3.0] * 4 and set(results[1].outputs) == {"OUTPUT0"}


def test_a_request_whose_caller_went_away_is_cancelled_for_the_model(make: Factory) -> None:
    """Non-decoupled too, as in Triton: ``is_cancelled()`` reads the request's cancel signal."""
    backend = make(ADD_PY)
    backend.model.mode = "cancelled"
    gone = dataclasses.replace(part(1.0), cancel=CancelSignal(fired=True))
    staying = dataclasses.replace(part(2.0), cancel=CancelSignal())
    results = backend.execute_parts({}, execution(gone, staying, part(3.0)))
    assert [r.outputs["OUTPUT0"][0] for r in results] == [1.0, 0.0, 0.0]


def test_none_without_an_answer_is_an_error(make: Factory) -> None:
    """Triton would leave the client waiting; serve_app answers with an error instead."""
    backend = make(ADD_PY)
    backend.model.mode = "none"
    (result,) = backend.execute_parts({}, execution(part(1.0)))
    assert isinstance(result.error, InternalError)
    assert "returned None for request 0" in result.error.message


def test_async_execute(make: Factory) -> None:
    backend = make(ASYNC_PY)
    results = backend.execute_parts({}, execution(part(1.0), part(5.0)))
    np.testing.assert_array_equal(results[1].outputs["OUTPUT0"], np.full(4, 6.0, np.float32))


def test_close_releases_the_async_event_loop(make: Factory) -> None:
    backend = make(ASYNC_PY)
    backend.execute_parts({}, execution(part(1.0)))
    loop_thread = backend._loop
    assert loop_thread is not None
    backend.close()
    assert close_loop(loop_thread)


def test_finalize_runs_on_close(make: Factory) -> None:
    backend = make(ADD_PY)
    assert not hasattr(backend.model, "finalized")
    backend.close()
    assert backend.model.finalized is True


def test_finalize_raising_is_only_logged(make: Factory) -> None:
    code = """
    class TritonPythonModel:
        def execute(self, requests):
            return []

        def finalize(self):
            raise RuntimeError("x")
    """
    make(code).close()


@pytest.mark.parametrize(
    ("hook", "ready"),
    [("return False", False), ("raise RuntimeError('x')", False), ("return True", True)],
)
def test_readiness_hook(make: Factory, hook: str, ready: bool) -> None:
    """Triton's optional ``is_model_ready``: False or an exception means not ready."""
    code = f"""
    class TritonPythonModel:
        def execute(self, requests):
            return []

        def is_model_ready(self):
            {hook}
    """
    assert make(code).is_ready() is ready


# -- decoupled ---------------------------------------------------------------------------------------
DECOUPLED = "model_transaction_policy { decoupled: true }"


class Emitted:
    """What a decoupled execution emitted, by request; ``wait`` until every request has its final."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.parts: dict[int, list[PartResult]] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()

    def __call__(self, index: int, result: PartResult) -> None:
        with self.lock:
            self.parts.setdefault(index, []).append(result)
            if sum(1 for p in self.parts.values() if p[-1].final) == self.count:
                self.done.set()

    def wait(self) -> None:
        assert self.done.wait(5.0), self.parts


def repeat_part(count: int, outputs: tuple[str, ...] = ()) -> RequestPart:
    return RequestPart(1, outputs, inputs={"INPUT0": np.array([count], dtype=np.float32)})


def stream(backend: PythonBackend, *parts: RequestPart, cancelled: Callable[[int], bool] = lambda i: False) -> Emitted:
    emitted = Emitted(len(parts))
    backend.stream({}, execution(*parts), emitted, cancelled)
    return emitted


def test_decoupled_responses_in_order_then_final(make: Factory) -> None:
    backend = make(REPEAT_PY, dims="1", extra=DECOUPLED)
    assert backend.decoupled
    emitted = stream(backend, repeat_part(3, ("OUTPUT0",)), repeat_part(0))
    emitted.wait()
    first = emitted.parts[0]
    assert [(p.final, p.empty) for p in first] == [(False, False)] * 3 + [(True, True)]
    assert [p.outputs["OUTPUT0"].tolist() for p in first[:3]] == [[0.0], [1.0], [2.0]]
    assert all(set(p.outputs) == {"OUTPUT0"} for p in first[:3])  # OUTPUT1 was not asked for
    assert [p.parameters for p in first[:3]] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert [(p.final, p.empty) for p in emitted.parts[1]] == [(True, True)]


def test_decoupled_cancellation_reaches_the_model(make: Factory) -> None:
    backend = make(REPEAT_PY, dims="1", extra=DECOUPLED)
    stream(backend, repeat_part(0), repeat_part(0), cancelled=lambda i: i == 1).wait()
    assert backend.model.cancelled == [(False, False), (True, True)]


def test_decoupled_responses_sent_later_from_another_thread(make: Factory) -> None:
    backend = make(REPEAT_PY, dims="1", extra=DECOUPLED)
    backend.model.mode = "keep"
    emitted = stream(backend, repeat_part(1))
    assert emitted.parts == {}

    def answer() -> None:
        (request,) = backend.model.kept
        request.get_response_sender().send(backend_response(), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    thread = threading.Thread(target=answer)
    thread.start()
    thread.join()
    emitted.wait()
    (only,) = emitted.parts[0]
    assert only.final and not only.empty
    assert only.outputs["OUTPUT0"].tolist() == [7.0]


def backend_response() -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([7.0], np.float32))])


def test_a_sender_dropped_without_final_ends_its_request_with_an_error(make: Factory) -> None:
    backend = make(REPEAT_PY, dims="1", extra=DECOUPLED)
    backend.model.mode = "drop"
    emitted = stream(backend, repeat_part(2))
    gc.collect()
    emitted.wait()
    results = emitted.parts[0]
    assert [r.error is None for r in results] == [True, True, False]
    last = results[-1]
    assert last.final
    assert isinstance(last.error, InternalError)
    assert "released a request without sending its final response" in last.error.message


def test_decoupled_execute_must_return_none(make: Factory) -> None:
    """Returning a value fails every request the model has not finished, with Triton's message."""
    backend = make(REPEAT_PY, dims="1", extra=DECOUPLED)
    backend.model.mode = "return-open"
    emitted = stream(backend, repeat_part(1), repeat_part(1))
    emitted.wait()
    for index in (0, 1):
        (result,) = emitted.parts[index]
        assert result.final
        assert isinstance(result.error, InternalError)
        assert result.error.message == (
            FAILED + f"Python model '{INSTANCE}' is using the decoupled mode and the execute function must return None."
        )


def test_decoupled_failure_closes_the_response_senders(make: Factory) -> None:
    backend = make(REPEAT_PY, dims="1", extra=DECOUPLED)
    backend.model.mode = "return-open"
    stream(backend, repeat_part(1)).wait()
    sender = backend.model.kept[0].get_response_sender()
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        sender.send(backend_response())


def test_decoupled_requests_finished_before_a_bad_return_keep_their_answers(make: Factory) -> None:
    backend = make(REPEAT_PY, dims="1", extra=DECOUPLED)
    backend.model.mode = "return"
    emitted = stream(backend, repeat_part(0), repeat_part(0))
    gc.collect()
    emitted.wait()
    assert [[(p.final, p.empty, p.error) for p in emitted.parts[i]] for i in (0, 1)] == [[(True, True, None)]] * 2


def test_decoupled_exception_fails_only_unfinished_requests(make: Factory) -> None:
    backend = make(REPEAT_PY, dims="1", extra=DECOUPLED)
    backend.model.mode = "raise"
    emitted = stream(backend, repeat_part(1), repeat_part(1))
    emitted.wait()
    assert [(p.final, p.error) for p in emitted.parts[0]] == [(False, None), (True, None)]
    second = emitted.parts[1]
    assert second[0].error is None and not second[0].final
    assert second[-1].final
    assert isinstance(second[-1].error, InternalError)
    assert second[-1].error.message.startswith(FAILED + "RuntimeError: second request broke")


def test_decoupled_whole_execution_collects_the_first_response(make: Factory) -> None:
    """The warmup path of a decoupled model: each request's first response (or an empty one)."""
    backend = make(REPEAT_PY, dims="1", extra=DECOUPLED)
    first, second = backend.execute_parts({}, execution(repeat_part(2), repeat_part(0)))
    assert first.outputs["OUTPUT0"].tolist() == [0.0]
    assert second.outputs == {} and second.error is None


def test_decoupled_async_execute(make: Factory) -> None:
    backend = make(ASYNC_REPEAT_PY, dims="1", extra=DECOUPLED)
    emitted = stream(backend, repeat_part(1))
    emitted.wait()
    assert [(p.final, p.empty) for p in emitted.parts[0]] == [(False, False), (True, True)]


def test_decoupled_async_execute_raising_ends_open_requests(make: Factory) -> None:
    """Triton only logs it and the client waits for ever; serve_app ends the request with the error."""
    backend = make(ASYNC_REPEAT_PY, dims="1", extra=DECOUPLED)
    backend.model.fail = True
    emitted = stream(backend, repeat_part(1))
    emitted.wait()
    results = emitted.parts[0]
    assert results[0].error is None
    assert results[-1].final
    assert isinstance(results[-1].error, InternalError)
    assert results[-1].error.message.startswith(FAILED + "RuntimeError: late failure")


def test_not_found_code_is_kept(make: Factory) -> None:
    code = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("gone", pb_utils.TritonError.NOT_FOUND))
                    for _ in requests]
    """
    (result,) = make(code).execute_parts({}, execution(part(1.0)))
    assert isinstance(result.error, NotFound)
    assert result.error.message == "gone"
