"""One instance of a ``model.py``: its ``TritonPythonModel``, called as Triton's Python stub calls it.

``execute`` gets the batch's requests as a list (each its own rows, outputs,
parameters and sequence flags) and must answer them as Triton's stub checks:
a list of one ``InferenceResponse`` per request, or ``None`` when the model
answered through the requests' response senders.  An exception or a broken
contract fails the whole batch with Triton's ``Failed to process the
request(s) for model '<instance>', message: ...`` (INTERNAL); a response
carrying a ``TritonError`` fails only its own request, with its code.

A decoupled model answers through each request's response sender, from
``execute`` or any thread of its own, zero or more times and then with
``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; :meth:`PythonBackend.stream` hands
each response to ``emit`` as it is sent.  A request the model lets go of
without its final flag (garbage-collected) gets an error as its final
response, so its client is not left waiting.

``async def execute`` runs on an event loop of the instance's own (Triton's
stub does the same): awaited for a normal model, left running for a
decoupled one.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import sys
import sysconfig
import threading
import traceback
import weakref
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from serve_app.backends.base import Backend, BackendContext
from serve_app.backends.python import utils as pb_utils
from serve_app.backends.python.context import CURRENT, ModelContext, ServerLink, serving, stopped
from serve_app.backends.python.environment import add_execution_env
from serve_app.config.decoupled import response_timeout_s
from serve_app.config.json_format import config_to_json
from serve_app.errors import InternalError, ServeError
from serve_app.inference.cancel import CancelSignal
from serve_app.inference.execution import Execution, PartResult, RequestPart
from serve_app.protos import model_config_pb2 as mc

logger = logging.getLogger("ray.serve")

MODULE_NAME = "triton_python_backend_utils"
_KINDS = {"KIND_CPU": "CPU", "KIND_GPU": "GPU", "KIND_MODEL": "MODEL"}
Emit = Callable[[int, PartResult], None]
DECOUPLED_COLLECT_S = 300.0  # a decoupled model's warmup sample waits this long for its final responses


class _Contract(Exception):
    pass


# What a model's code may raise that becomes a model error: ``SystemExit`` too (``unittest.main()``,
# ``argparse`` and ``sys.exit`` inside a model), as Triton's stub catches every Python exception.
MODEL_ERRORS = (Exception, SystemExit)

# ``sys.argv`` in Triton's stub: an embedded interpreter started without arguments.
STUB_ARGV = [""]


class _Exited(Exception):
    """A ``SystemExit`` of an ``async def`` model, carried as an ordinary exception: asyncio lets a
    ``SystemExit`` through its event loop, which would stop the instance's loop for good."""

    def __init__(self, exc: SystemExit) -> None:
        super().__init__(str(exc))
        self.original = exc


async def _no_exit(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coro
    except SystemExit as exc:
        raise _Exited(exc) from None


# Frames of ours and of the standard library are not the model's: left out of its error text.
_OURS = (str(Path(__file__).resolve().parents[2]), sysconfig.get_paths()["stdlib"])


def describe(exc: BaseException) -> str:
    """Triton's text for a Python exception: ``<Type>: <message>``, then where it was raised."""
    if isinstance(exc, _Contract):
        return str(exc)
    if isinstance(exc, _Exited):
        exc = exc.original
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_OURS)]
    at = "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return f"{type(exc).__name__}: {exc}\n\nAt:\n{at}" if at else f"{type(exc).__name__}: {exc}"


def install_utils_module() -> None:
    """Make ``import triton_python_backend_utils`` find our implementation, and give model code the
    ``sys.argv`` it has under Triton (not the hosting process's: a model calling ``unittest.main()`` or
    ``argparse`` parses it)."""
    sys.modules.setdefault(MODULE_NAME, pb_utils)
    if sys.argv != STUB_ARGV:
        sys.argv = list(STUB_ARGV)


def load_model_module(model_file: Path, unique: str) -> ModuleType:
    """Import ``model.py`` as Triton does, as a module of its version directory's package (so relative
    imports of its neighbours work: ``from .helpers import x``), with the version directory on
    ``sys.path`` too (so do plain ``import helpers``).  ``unique`` names the package in this process."""
    version_dir = str(model_file.parent)
    if version_dir not in sys.path:
        sys.path.insert(0, version_dir)
    package = ModuleType(unique)
    package.__path__ = [version_dir]
    package.__package__ = unique
    name = f"{unique}.{model_file.stem}"
    spec = importlib.util.spec_from_file_location(name, model_file)
    if spec is None or spec.loader is None:
        raise InternalError(f"can't import {model_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = package
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for key in [k for k in sys.modules if k == unique or k.startswith(unique + ".")]:
            sys.modules.pop(key, None)
        raise
    return module


class _LoopThread:
    """An event loop on a daemon thread: where a model's ``async def execute`` runs."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


def _never() -> bool:
    return False


class _Answers:
    """What a non-decoupled batch's requests sent through their senders (at most one response each).
    A request is done once it has its response, or its sender is gone.  Only a model that answers after
    ``execute`` returned None (or a list with None entries) is waited for, so the event to wait on is made
    then, not per request."""

    def __init__(self, count: int) -> None:
        self.sent: list[pb_utils.InferenceResponse | None] = [None] * count
        self._done = [False] * count
        self._missing = count
        self._lock = threading.Lock()
        self._all_done: threading.Event | None = None

    def emitter(self, index: int) -> pb_utils.Emit:
        def emit(response: pb_utils.InferenceResponse | None, flags: int) -> None:
            if response is not None:
                self.sent[index] = response
                self._finish(index)

        return emit

    def returned(self, index: int) -> None:
        """Request ``index`` was answered in ``execute``'s returned list: nothing to wait for."""
        self._finish(index)

    def gone(self, index: int) -> Callable[[object], None]:
        """What a weak reference to request ``index``'s sender calls once the sender is collected."""
        return lambda _ref: self._finish(index)

    def _finish(self, index: int) -> None:
        with self._lock:
            if self._done[index]:
                return
            self._done[index] = True
            self._missing -= 1
            woken = self._all_done if not self._missing else None
        if woken is not None:
            woken.set()

    def wait(self, timeout_s: float) -> None:
        """Until every request has its response (a model may answer after ``execute`` returned None, from a
        thread of its own, as Triton lets it), its sender is dropped, or ``timeout_s`` has passed."""
        with self._lock:
            if not self._missing:
                return
            self._all_done = woken = threading.Event()
        woken.wait(timeout_s)


class _StreamPart:
    """One request of a decoupled execution: forwards its sends and notices a sender dropped unfinished."""

    def __init__(self, index: int, emit: Emit, wanted: frozenset[str]) -> None:
        self.index = index
        self._emit = emit
        self._wanted = wanted
        self.closed = False
        self.lock = threading.Lock()
        # Its sender, weakly (a sender the model drops must still be collected): closed when the request fails,
        # so the model's later sends raise, as in Triton.
        self.sender: weakref.ref[pb_utils.InferenceResponseSender] | None = None

    def send(self, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self.lock:
            if self.closed:
                return
            self.closed = final
        if response is None:
            self._emit(self.index, PartResult(final=final, empty=True))
        else:
            part = _to_part(response, self._wanted)
            part.final = final
            self._emit(self.index, part)

    def fail(self, error: ServeError) -> None:
        sender = self.sender() if self.sender is not None else None
        if sender is not None:
            sender.close()
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self._emit(self.index, PartResult(error=error, final=True))


class PythonBackend(Backend):
    per_request = True

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        config = ctx.config
        self.decoupled = config.model_transaction_policy.decoupled
        self._late_answer_s = response_timeout_s(config)  # how long answers after execute returned None may take
        self.instance_name = ctx.instance_name or f"{ctx.model_name}_0_0"
        model_dir = ctx.model_file.parent.parent
        self._batched = config.max_batch_size > 0
        self._all_outputs = tuple(o.name for o in config.output)
        self._bf16_inputs = frozenset(i.name for i in config.input if i.data_type == mc.TYPE_BF16)
        link: ServerLink | None = ctx.server_link
        self._base = ModelContext(ctx.model_name, str(ctx.model_file.parent), self.instance_name, link, ctx.loop)
        self._exec_context = ModelContext(
            ctx.model_name, str(ctx.model_file.parent), self.instance_name, link, ctx.loop, in_execute=True
        )
        self._loop: _LoopThread | None = None
        self._closed = False
        if not ctx.model_file.is_file():
            raise InternalError(f"{ctx.model_file.name} does not exist in the model repository path: {ctx.model_file}")
        add_execution_env(config, model_dir)
        install_utils_module()
        unique = f"_triton_model_{abs(hash((str(ctx.model_file), self.instance_name, id(self)))):x}"
        try:
            self._module = load_model_module(ctx.model_file, unique)
            model_class = self._module.TritonPythonModel
            self.model = model_class()
        except MODEL_ERRORS as exc:
            raise InternalError(describe(exc)) from None
        if not callable(getattr(self.model, "execute", None)):
            raise InternalError(f"Python model {ctx.model_file} does not implement `execute` method.")
        args = {
            "model_config": json.dumps(config_to_json(config), separators=(",", ":")),
            "model_instance_kind": _KINDS.get(ctx.device_kind, "CPU"),
            "model_instance_name": self.instance_name,
            "model_instance_device_id": str(ctx.gpu_ids[0] if ctx.gpu_ids else 0),
            "model_repository": str(model_dir),
            "model_version": str(ctx.version),
            "model_name": ctx.model_name,
        }
        initialize = getattr(self.model, "initialize", None)
        if initialize is not None:
            try:
                self._call(self._base, initialize, args)
            except MODEL_ERRORS as exc:
                self._stop_loop()
                raise InternalError(describe(exc)) from None
        serving(self._exec_context)

    # -- calling into the model -------------------------------------------------------------
    def _call(self, context: ModelContext, fn: Callable[..., Any], *args: Any, wait: bool = True) -> Any:
        """``fn(*args)`` with ``context`` current; a coroutine it returns runs on the instance's loop
        (awaited unless ``wait`` is False, when its future is returned)."""
        token = CURRENT.set(context)
        try:
            result = fn(*args)
            if asyncio.iscoroutine(result):
                if self._loop is None:
                    self._loop = _LoopThread(f"{self.instance_name}-async")
                future = self._loop.submit(_no_exit(result))
                return future.result() if wait else future
            return result
        finally:
            CURRENT.reset(token)

    def _requests(
        self, inputs: dict[str, np.ndarray], parts: tuple[RequestPart, ...]
    ) -> list[pb_utils.InferenceRequest]:
        out = []
        start = 0
        for part in parts:
            if part.inputs is not None:
                feed = part.inputs
            elif self._batched and len(parts) > 1:
                feed = {name: array[start : start + part.rows] for name, array in inputs.items()}
                start += part.rows
            else:
                feed = inputs
            out.append(
                pb_utils.InferenceRequest.received(
                    part.id,
                    feed,
                    part.outputs or self._all_outputs,
                    part.parameters,
                    correlation_id=part.correlation_id,
                    flags=part.flags,
                    timeout_us=part.timeout_us,
                    bf16=self._bf16_inputs,
                )
            )
        return out

    def _parts(self, execution: Execution) -> tuple[RequestPart, ...]:
        if execution.parts:
            return execution.parts
        rows = execution.batch_size if self._batched else 1
        return (RequestPart(max(1, rows), execution.outputs),)

    def _failure(self, exc: BaseException) -> InternalError:
        return InternalError(
            f"Failed to process the request(s) for model '{self.instance_name}', message: {describe(exc)}"
        )

    # -- a batch ------------------------------------------------------------------------------
    def execute(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        """The whole batch as one request (warmup samples); the per-request path is :meth:`execute_parts`."""
        rows = next(iter(inputs.values())).shape[0] if self._batched and inputs else 1
        part = self.execute_parts(inputs, Execution(inputs, tuple(output_names), rows))[0]
        if part.error is not None:
            raise part.error
        return part.outputs

    def execute_parts(self, inputs: dict[str, np.ndarray], execution: Execution) -> list[PartResult]:
        parts = self._parts(execution)
        if self.decoupled:
            answers: list[PartResult] = []
            done = threading.Event()
            collected: dict[int, list[PartResult]] = {}

            def emit(index: int, part: PartResult) -> None:
                collected.setdefault(index, []).append(part)
                if sum(1 for p in collected.values() if p and p[-1].final) == len(parts):
                    done.set()

            self.stream(inputs, execution, emit, lambda index: False)
            if not done.wait(DECOUPLED_COLLECT_S):
                error = InternalError(
                    f"model '{self.instance_name}' sent no final response in {DECOUPLED_COLLECT_S:g}s"
                )
                return [PartResult(error=error) for _ in parts]
            for i in range(len(parts)):
                answers.append(next((p for p in collected.get(i, []) if not p.empty), PartResult()))
            return answers
        requests = self._requests(inputs, parts)
        count = len(requests)
        answers_sent = _Answers(count)
        senders = []  # weakly: a sender the model lets go of unanswered ends the wait for it
        for i, (request, part) in enumerate(zip(requests, parts, strict=True)):
            cancelled = _fired(part.cancel) if part.cancel is not None else _never
            sender = pb_utils.InferenceResponseSender(answers_sent.emitter(i), cancelled, decoupled=False)
            request.attach(sender, cancelled)
            senders.append(weakref.ref(sender, answers_sent.gone(i)))  # held until the end of this call
        del sender, request, part
        try:
            returned = self._call(self._exec_context, self.model.execute, requests)
            del requests  # what the model answers later, it keeps
            if returned is None:
                answers_sent.wait(self._late_answer_s)
            elif isinstance(returned, list) and len(returned) == count and None in returned:
                # A None entry: that request answers through its sender, later perhaps (as in Triton).
                for i, response in enumerate(returned):
                    if response is not None:
                        answers_sent.returned(i)
                answers_sent.wait(self._late_answer_s)
            return self._collect(returned, count, parts, answers_sent)
        except MODEL_ERRORS as exc:
            error = self._failure(exc)
            return [
                _to_part(sent, self._wanted(part)) if sent is not None else PartResult(error=error)
                for sent, part in zip(answers_sent.sent, parts, strict=True)
            ]
        finally:
            for ref in senders:
                open_sender = ref()
                if open_sender is not None:
                    open_sender.close()

    def _collect(
        self,
        returned: Any,
        count: int,
        parts: tuple[RequestPart, ...],
        answers: _Answers,
    ) -> list[PartResult]:
        if returned is None:
            responses: list[Any] = [None] * count
        elif not isinstance(returned, list):
            raise _Contract(f"Expected a list in the execute return, found type '{type(returned)}'.")
        elif len(returned) != count:
            raise _Contract(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{count}, and InferenceResponse(s) size is:{len(returned)}\n"
            )
        else:
            responses = returned
        out = []
        for i, (response, part) in enumerate(zip(responses, parts, strict=True)):
            sent = answers.sent[i]
            if response is None:
                if sent is None:
                    out.append(
                        PartResult(
                            error=InternalError(
                                f"model '{self.instance_name}' returned None for request {i} of its batch and sent no "
                                "response for it through its response sender"
                            )
                        )
                    )
                    continue
                response = sent
            elif not isinstance(response, pb_utils.InferenceResponse):
                raise _Contract(
                    "Expected an 'InferenceResponse' object in the execute function return list, found type "
                    f"'{type(response)}'."
                )
            elif sent is not None:
                raise _Contract("Unable to send response. Non-decoupled model cannot send more than one response.")
            out.append(_to_part(response, self._wanted(part)))
        return out

    def _wanted(self, part: RequestPart) -> frozenset[str]:
        return frozenset(part.outputs or self._all_outputs)

    # -- decoupled ------------------------------------------------------------------------------
    def stream(
        self,
        inputs: dict[str, np.ndarray],
        execution: Execution,
        emit: Emit,
        cancelled: Callable[[int], bool],
    ) -> None:
        """Run a decoupled execution: each response goes to ``emit(part index, result)`` (from any thread)
        as the model sends it, the last one of each request marked final.  Returns when ``execute`` has."""
        parts = self._parts(execution)
        requests = self._requests(inputs, parts)
        streams = []
        for i, (request, part) in enumerate(zip(requests, parts, strict=True)):
            stream = _StreamPart(i, emit, self._wanted(part))
            sender = pb_utils.InferenceResponseSender(stream.send, _cancel_check(cancelled, i), decoupled=True)
            request.attach(sender, _cancel_check(cancelled, i))
            stream.sender = weakref.ref(sender)
            # A sender the model lets go of without FINAL: its client gets an error instead of waiting for ever.
            weakref.finalize(sender, stream.fail, InternalError(_ABANDONED.format(model=self.instance_name)))
            streams.append(stream)
        del sender, request, part
        try:
            returned = self._call(self._exec_context, self.model.execute, requests, wait=False)
            if returned is not None and not asyncio.isfuture(returned) and not hasattr(returned, "add_done_callback"):
                raise _Contract(
                    f"Python model '{self.instance_name}' is using the decoupled mode and the execute function must "
                    "return None."
                )
            if returned is not None:
                returned.add_done_callback(_after_async(streams, self._failure, self.instance_name))
        except MODEL_ERRORS as exc:
            error = self._failure(exc)
            for stream in streams:
                stream.fail(error)

    # -- readiness and closing ---------------------------------------------------------------------
    def is_ready(self) -> bool:
        """The model's own readiness hook (``is_model_ready`` or ``is_ready``), if it has one."""
        hook = getattr(self.model, "is_model_ready", None) or getattr(self.model, "is_ready", None)
        if hook is None:
            return True
        try:
            return bool(self._call(self._base, hook))
        except MODEL_ERRORS:
            return False

    def close(self) -> None:
        """``finalize`` once: its instance no longer serves its own threads' BLS calls from here on."""
        if self._closed:
            return
        self._closed = True
        stopped(self._exec_context)
        finalize = getattr(self.model, "finalize", None)
        if finalize is not None:
            try:
                self._call(self._base, finalize)
            except MODEL_ERRORS as exc:
                logger.warning("finalize of %s raised: %s", self.instance_name, describe(exc))
        self._stop_loop()

    def _stop_loop(self) -> None:
        if self._loop is not None:
            self._loop.stop()
            self._loop = None


_ABANDONED = (
    "model '{model}' released a request without sending its final response (TRITONSERVER_RESPONSE_COMPLETE_FINAL)"
)


def _cancel_check(cancelled: Callable[[int], bool], index: int) -> Callable[[], bool]:
    return lambda: cancelled(index)


def _fired(signal: CancelSignal) -> Callable[[], bool]:
    """A non-decoupled request's ``is_cancelled()``: its caller went away while it executes."""
    return lambda: signal.fired


def _after_async(
    streams: list[_StreamPart], failure: Callable[[BaseException], InternalError], name: str
) -> Callable[[Any], None]:
    """What a decoupled model's ``async def execute`` leaves behind: an exception ends its open requests."""

    def done(future: Any) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is None:
            return
        logger.error("async execute of %s raised: %s", name, describe(exc))
        error = failure(exc)
        for stream in streams:
            stream.fail(error)

    return done


def _to_part(response: pb_utils.InferenceResponse, wanted: frozenset[str]) -> PartResult:
    """A model's response as the server carries it: the outputs its request asked for (Triton prunes the
    others), or its error."""
    error = response.error()
    if error is not None:
        return PartResult(error=error.as_serve_error(), parameters=response.parameter_dict())
    outputs = {}
    for tensor in response.output_tensors():
        name = tensor.name()
        if name in wanted:
            outputs[name] = _plain(tensor._data)
    return PartResult(outputs=outputs, parameters=response.parameter_dict())


def _plain(array: np.ndarray) -> np.ndarray:
    """BYTES as ``bytes`` elements (a model may put ``str`` in an object array, which Triton encodes)."""
    if array.dtype.kind != "O" or not array.size:
        return array
    flat = array.ravel()
    if all(isinstance(x, bytes) for x in flat):
        return array
    return np.array([x if isinstance(x, bytes) else str(x).encode() for x in flat], dtype=np.object_).reshape(
        array.shape
    )
