"""A non-decoupled Python model sees a request whose caller went away while it executes as cancelled
(``request.is_cancelled()``), as Triton's does for a cancelled gRPC call, in process."""

from __future__ import annotations

import asyncio
import pathlib
import textwrap

import numpy as np

from serve_app.inference.types import InferRequest, InferTensor
from serve_app.local.service import LocalService

CONFIG = """
name: "py_wait_cancel"
backend: "python"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

# Waits (at most 60 s) for its request to be cancelled, and leaves a file saying whether it was.
MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]

    def execute(self, requests):
        (request,) = requests
        open(os.path.join(self.dir, "started"), "w").close()
        deadline = time.monotonic() + 60
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(os.path.join(self.dir, "seen"), "w") as f:
            f.write(str(request.is_cancelled()))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1, np.float32))])]
"""


async def test_a_caller_that_goes_away_cancels_the_executing_request(tmp_path: pathlib.Path) -> None:
    model_dir = tmp_path / "py_wait_cancel"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(textwrap.dedent(CONFIG))
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    host = LocalService.from_repository(tmp_path)
    try:
        service = host.service
        request = InferRequest("py_wait_cancel", inputs=[InferTensor("IN", "FP32", (1,), np.zeros(1, np.float32))])
        call = asyncio.ensure_future(service.infer(service.model("py_wait_cancel"), request))
        while not (model_dir / "started").exists():
            await asyncio.sleep(0.01)
        call.cancel()  # as the gRPC server does when its client cancels the call
        while not (model_dir / "seen").exists():
            await asyncio.sleep(0.01)
        assert (model_dir / "seen").read_text() == "True"
    finally:
        host.close()
