"""Python models whose execution waits until the test opens a gate, so requests sent meanwhile wait in the
gateway's queue for as long as the test needs (no timing involved): ``gate`` (cancellation), ``prio_gate`` (the
dynamic batcher's priority levels and queue policies) and ``rl_*`` (the rate limiter, below).

``gate``'s ``execute`` creates ``running`` in the model's directory when it starts and waits for ``open`` there (at
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


# ``prio_gate``: one request per execution, behind the same gate, open until a test closes it (``open`` is
# written with the model); each execution appends its input's value to ``order.txt`` in the model's directory.
PRIORITY_GATE_PY = GATE_PY.replace(
    '        os.remove(os.path.join(self.dir, "running"))\n',
    '        os.remove(os.path.join(self.dir, "running"))\n'
    '        with open(os.path.join(self.dir, "order.txt"), "a") as f:\n'
    "            for r in requests:\n"
    "                f.write(f\"{float(pb_utils.get_input_tensor_by_name(r, 'IN').as_numpy().flat[0]):g}\\n\")\n",
)

PRIORITY_GATE_CONFIG = """
name: "prio_gate"
backend: "python"
max_batch_size: 1
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def build_priority_gate(repo: pathlib.Path, batching: str) -> pathlib.Path:
    """``prio_gate`` with the dynamic batching block ``batching`` (priority levels and their queue policies)."""
    d = repo / "prio_gate"
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(textwrap.dedent(PRIORITY_GATE_PY).lstrip())
    (d / "config.pbtxt").write_text(textwrap.dedent(PRIORITY_GATE_CONFIG).lstrip() + batching)
    (d / "open").touch()
    return d


# Rate limiter: three models whose single instances share the resource R (one unit). ``rl_first`` holds it
# until the test creates ``rl_open`` in the repository root; ``rl_high`` (priority 1) and ``rl_low``
# (priority 2) take a little while each.  Every execution appends "<model> start" and "<model> end" to
# ``rl_log.txt`` in the repository root.
RATE_LIMITED_PY = """
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]
        self.root = os.path.dirname(args["model_repository"])

    def _log(self, what):
        with open(os.path.join(self.root, "rl_log.txt"), "a") as f:
            f.write(f"{self.name} {what}\\n")

    def execute(self, requests):
        self._log("start")
        if self.name == "rl_first":
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(self.root, "rl_open")) and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            time.sleep(0.05)
        self._log("end")
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""

RATE_LIMITED_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU
                   rate_limiter {{ resources [ {{ name: "R" count: 1 }} ] priority: {priority} }} }} ]
"""


def build_rate_limited(repo: pathlib.Path) -> None:
    for name, priority in (("rl_first", 1), ("rl_high", 1), ("rl_low", 2)):
        d = repo / name
        (d / "1").mkdir(parents=True)
        (d / "1" / "model.py").write_text(textwrap.dedent(RATE_LIMITED_PY).lstrip())
        (d / "config.pbtxt").write_text(
            textwrap.dedent(RATE_LIMITED_CONFIG.format(name=name, priority=priority)).lstrip()
        )
