"""A Python model as Triton's stub runs it, on the real server through tritonclient: one ``model.py`` with no
``config.pbtxt`` (it completes to the python backend, its ``auto_complete_config`` adds its tensors), loaded
into the session server by model control, in a process of its own.

It checks what such a model sees there: ``sys.argv == [""]``, ``sys.exit`` in ``execute`` as a failed
request (the instance keeps serving), writable inputs through DLPack, BLS from a thread of its own with a
``bytes`` model name, model metadata naming the backend, and ``finalize`` on unload.
"""

from __future__ import annotations

import pathlib
import shutil
import textwrap
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Server

NAME = "py_stub_behaviour"

MODEL_PY = """
import json
import pathlib
import sys
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]})
        config.add_output({"name": "ARGV", "data_type": "TYPE_STRING", "dims": [-1]})
        return config

    def initialize(self, args):
        self.argv = list(sys.argv)
        self.marker = pathlib.Path(args["model_repository"]) / "finalized"

    def bls(self, x, out):
        request = pb_utils.InferenceRequest(
            model_name=b"py_add_sub",
            requested_output_names=[b"OUTPUT0"],
            inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)],
        )
        out.append(request.exec())

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = json.loads(request.parameters()).get("mode", "")
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            if mode == "exit":
                sys.exit(3)
            if mode == "dlpack":
                x.as_numpy()[:] += 1
                out = pb_utils.Tensor.from_dlpack("OUTPUT0", x.to_dlpack())
            elif mode == "bls_thread":
                answers = []
                worker = threading.Thread(target=self.bls, args=(x.as_numpy(), answers))
                worker.start()
                worker.join()
                if answers[0].has_error():
                    raise pb_utils.TritonModelException(answers[0].error().message())
                out = pb_utils.Tensor("OUTPUT0", pb_utils.get_output_tensor_by_name(answers[0], "OUTPUT0").as_numpy())
            else:
                out = pb_utils.Tensor("OUTPUT0", x.as_numpy())
            argv = pb_utils.Tensor("ARGV", np.array([a.encode() for a in self.argv], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out, argv]))
        return responses

    def finalize(self):
        self.marker.write_text("finalized")
"""

X = np.arange(16, dtype=np.float32)


@pytest.fixture(scope="module")
def loaded(server: Server) -> Iterator[pathlib.Path]:
    """The model loaded into the session server; unloaded (if a test has not) and removed after the module."""
    model_dir = server.repo / NAME
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY).lstrip())
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    client.load_model(NAME)
    yield model_dir
    client.unload_model(NAME)
    shutil.rmtree(model_dir, ignore_errors=True)


def infer(server: Server, mode: str = "") -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    tensor = httpclient.InferInput("INPUT0", [16], "FP32")
    tensor.set_data_from_numpy(X, binary_data=True)
    return client.infer(NAME, [tensor], parameters={"mode": mode} if mode else None)


def test_a_model_py_alone_completes_to_the_python_backend(server: Server, loaded: pathlib.Path) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.get_model_metadata(NAME)["platform"] == "python"
    assert client.get_model_config(NAME)["backend"] == "python"
    result = infer(server)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), X)
    assert result.as_numpy("ARGV").tolist() == [b""]


def test_sys_exit_fails_the_request_and_the_instance_serves_on(server: Server, loaded: pathlib.Path) -> None:
    with pytest.raises(InferenceServerException) as err:
        infer(server, "exit")
    assert err.value.status() == "500"
    assert "SystemExit: 3" in str(err.value)
    np.testing.assert_array_equal(infer(server).as_numpy("OUTPUT0"), X)


def test_inputs_are_writable_and_export_through_dlpack(server: Server, loaded: pathlib.Path) -> None:
    np.testing.assert_array_equal(infer(server, "dlpack").as_numpy("OUTPUT0"), X + 1)


def test_bls_from_a_thread_of_the_model_with_a_bytes_model_name(server: Server, loaded: pathlib.Path) -> None:
    np.testing.assert_array_equal(infer(server, "bls_thread").as_numpy("OUTPUT0"), X + X)


def test_finalize_runs_on_unload(server: Server, loaded: pathlib.Path) -> None:
    marker = loaded / "finalized"
    httpclient.InferenceServerClient(server.http_url, network_timeout=300).unload_model(NAME)
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.read_text() == "finalized"
    index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    assert [e["state"] for e in index if e["name"] == NAME] == ["UNAVAILABLE"]
