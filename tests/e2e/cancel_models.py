"""``gate``: a Python model whose execution waits until the test opens its gate, so requests sent meanwhile
wait in the gateway's queue for as long as the test needs (no timing involved).

Its ``execute`` creates ``running`` in the model's directory when it starts and waits for ``open`` there (at
most two minutes, so a failed test never leaves it blocked); the test removes ``open`` to close it again.
"""

from __future__ import annotations

import pathlib
import textwrap

GATE_PY = """
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]

    def execute(self, requests):
        open(os.path.join(self.dir, "running"), "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(self.dir, "open")) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.remove(os.path.join(self.dir, "running"))
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""

GATE_CONFIG = """
name: "gate"
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { }
"""


def build(repo: pathlib.Path) -> pathlib.Path:
    d = repo / "gate"
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(textwrap.dedent(GATE_PY).lstrip())
    (d / "config.pbtxt").write_text(textwrap.dedent(GATE_CONFIG).lstrip())
    return d
