"""What a model sees of its process as under Triton's stub: ``sys.argv``, and ``SystemExit`` as a model error.

Triton's stub is an embedded interpreter started without arguments (``sys.argv == ['']``) and catches
every Python exception, ``SystemExit`` included: a model that calls ``unittest.main()`` or
``argparse`` works, and one that exits fails its load or its batch instead of hanging its instance.
"""

from __future__ import annotations

import asyncio
import pathlib
import threading

import numpy as np
import pytest

from serve_app.backends.python import utils as pb_utils
from serve_app.errors import InternalError
from serve_app.inference.execution import RequestPart
from serve_app.inference.types import InferRequest, InferResponse, InferTensor
from tests.unit.backends.python.conftest import INSTANCE, Factory
from tests.unit.backends.python.test_backend import execution, part

FAILED = f"Failed to process the request(s) for model '{INSTANCE}', message: "

ARGV_PY = """
import argparse
import sys
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils


class Check(unittest.TestCase):
    def test_nothing(self):
        self.assertTrue(True)


class TritonPythonModel:
    def initialize(self, args):
        self.argv = list(sys.argv)
        self.parsed = vars(argparse.ArgumentParser().parse_args())
        self.mode = "ok"

    def execute(self, requests):
        if self.mode == "exit":
            sys.exit(3)
        if self.mode == "argparse":
            parser = argparse.ArgumentParser()
            parser.add_argument("--needed", required=True)
            parser.parse_args()
        # As Triton's QA models do: the test run's outcome is the response.
        result = unittest.main("model", exit=False).result
        ok = np.array([result.wasSuccessful()], dtype=bool)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", ok)]) for _ in requests]
"""

ASYNC_EXIT_PY = """
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        if requests[0].request_id() == "exit":
            sys.exit("bye")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.zeros(4, np.float32))]) for _ in requests]
"""


def test_model_sees_the_stubs_argv(make: Factory) -> None:
    backend = make(ARGV_PY)
    assert backend.model.argv == [""]
    assert backend.model.parsed == {}
    (result,) = backend.execute_parts({}, execution(part(1.0)))
    assert result.error is None
    assert result.outputs["OUTPUT0"].tolist() == [True]


@pytest.mark.parametrize(("mode", "message"), [("exit", "SystemExit: 3"), ("argparse", "SystemExit: 2")])
def test_system_exit_in_execute_fails_the_batch(make: Factory, mode: str, message: str) -> None:
    backend = make(ARGV_PY)
    backend.model.mode = mode
    results = backend.execute_parts({}, execution(part(1.0), part(2.0)))
    for result in results:
        assert isinstance(result.error, InternalError)
        assert result.error.message.startswith(FAILED + message)
    backend.model.mode = "ok"
    (again,) = backend.execute_parts({}, execution(part(1.0)))
    assert again.error is None


def test_system_exit_in_initialize_fails_the_load(make: Factory) -> None:
    code = """
    import sys


    class TritonPythonModel:
        def initialize(self, args):
            sys.exit("no config")

        def execute(self, requests):
            return []
    """
    with pytest.raises(InternalError) as err:
        make(code)
    assert err.value.message.startswith("SystemExit: no config")


def test_system_exit_at_import_fails_the_load(make: Factory) -> None:
    with pytest.raises(InternalError) as err:
        make("import sys\nsys.exit(4)\n")
    assert err.value.message.startswith("SystemExit: 4")


def test_system_exit_in_async_execute_leaves_its_loop_serving(make: Factory) -> None:
    backend = make(ASYNC_EXIT_PY)
    (failed,) = backend.execute_parts({}, execution(part(1.0, rid="exit")))
    assert isinstance(failed.error, InternalError)
    assert failed.error.message.startswith(FAILED + "SystemExit: bye")
    (served,) = backend.execute_parts({}, execution(part(1.0)))
    assert served.error is None
    np.testing.assert_array_equal(served.outputs["OUTPUT0"], np.zeros(4, np.float32))


DLPACK_IDENTITY_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            tensor.as_numpy()[0] += 100  # inputs are the model's own to write into
            out = pb_utils.Tensor.from_dlpack("OUTPUT0", tensor.to_dlpack())
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def test_read_only_inputs_reach_the_model_writable(make: Factory) -> None:
    """Inputs decoded from a request body are read-only views of it; the model gets arrays of its own."""
    backend = make(DLPACK_IDENTITY_PY)
    body = np.arange(4, dtype=np.float32).tobytes()
    data = np.frombuffer(body, dtype=np.float32)
    assert not data.flags.writeable
    request = RequestPart(1, ("OUTPUT0",), "", {}, inputs={"INPUT0": data})
    (result,) = backend.execute_parts({}, execution(request))
    assert result.error is None
    assert result.outputs["OUTPUT0"].tolist() == [100.0, 1.0, 2.0, 3.0]
    assert data.tolist() == [0.0, 1.0, 2.0, 3.0]


BLS_IN_THREAD_PY = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.early = None

    def call(self, value, out):
        request = pb_utils.InferenceRequest(
            model_name="other",
            requested_output_names=["OUT"],
            inputs=[pb_utils.Tensor("IN", np.array([value], np.float32))],
        )
        try:
            out.append(request.exec())
        except pb_utils.TritonModelException as exc:
            out.append(exc)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = []
            worker = threading.Thread(target=self.call, args=(float(x[0]), out))
            worker.start()
            worker.join()
            result = pb_utils.get_output_tensor_by_name(out[0], "OUT").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", result)]))
        return responses

    def finalize(self):
        self.late = []
        worker = threading.Thread(target=self.call, args=(1.0, self.late))
        worker.start()
        worker.join()
"""


class DoublingLink:
    """A server whose one model, ``other``, doubles ``IN`` into ``OUT``."""

    async def infer(self, request: InferRequest) -> InferResponse:
        (tensor,) = request.inputs
        out = InferTensor("OUT", "FP32", tensor.shape, np.asarray(tensor.data) * 2)
        return InferResponse(request.model_name, "1", outputs=[out])


def test_bls_from_a_thread_the_model_starts(make: Factory) -> None:
    """Triton serves BLS from any thread of the model's between initialize and finalize; not after."""
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        backend = make(BLS_IN_THREAD_PY, server_link=DoublingLink(), loop=loop)
        (result,) = backend.execute_parts({}, execution(part(3.0)))
        assert result.error is None
        assert result.outputs["OUTPUT0"].tolist() == [6.0]
        backend.close()
        (late,) = backend.model.late
        assert isinstance(late, pb_utils.TritonModelException)
        assert str(late) == "BLS is only supported during the 'execute' function."
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(timeout=10)
        loop.close()


def test_model_py_imports_its_neighbours_relatively_and_absolutely(make: Factory, tmp_path: pathlib.Path) -> None:
    """Triton imports model.py as a module of its version directory's package: a model split over files."""
    version_dir = tmp_path / "m" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "scaling.py").write_text("FACTOR = 3.0\n")
    (version_dir / "offsets.py").write_text("OFFSET = 1.0\n")
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    import offsets

    from .scaling import FACTOR


    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * FACTOR + offsets.OFFSET)]))
            return out
    """
    (result,) = make(code).execute_parts({}, execution(part(2.0)))
    assert result.error is None
    assert result.outputs["OUTPUT0"].tolist() == [7.0] * 4


LATE_ANSWER_PY = """
import threading

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.go = threading.Event()

    def answer(self, requests):
        self.go.wait(30)
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 10)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )

    def execute(self, requests):
        threading.Thread(target=self.answer, args=(requests,)).start()
        self.go.set()
        return None
"""


def test_a_model_may_answer_after_execute_returned_none(make: Factory) -> None:
    """As Triton lets a non-decoupled model do: its senders stay open until each request has its response."""
    backend = make(LATE_ANSWER_PY)
    results = backend.execute_parts({}, execution(part(1.0), part(2.0)))
    assert [r.error for r in results] == [None, None]
    assert [r.outputs["OUTPUT0"].tolist() for r in results] == [[10.0] * 4, [20.0] * 4]
