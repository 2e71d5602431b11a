"""Python models for test_python_streams.py, written as Triton users write them: a BLS caller that cancels a
decoupled model's stream (the shape of Triton's ``decoupled_bls_cancel`` QA models), and a decoupled model
with a dynamic batcher.

``py_until_cancelled`` runs in a process of its own, so a BLS cancel crosses from the gateway to it; the
others run in the gateway.
"""

from __future__ import annotations

import pathlib
import textwrap

SHARED = 'parameters { key: "dedicated_process" value: { string_value: "false" } }\n'

UNTIL_CANCELLED_PY = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sends INPUT back every DELAY ms, MAX_RESPONSE_COUNT times, unless its request is cancelled first
    (then a CANCELLED error is its final response); IGNORE_CANCEL makes it go on regardless."""

    def execute(self, requests):
        request = requests[0]
        value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()[0]
        count = int(pb_utils.get_input_tensor_by_name(request, "MAX_RESPONSE_COUNT").as_numpy()[0])
        delay = int(pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()[0])
        ignore = bool(pb_utils.get_input_tensor_by_name(request, "IGNORE_CANCEL").as_numpy()[0])
        sender = request.get_response_sender()
        for n in range(count):
            if not ignore and request.is_cancelled():
                error = pb_utils.TritonError("request has been cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([value], np.int32))])
            last = n + 1 == count
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
            if not last:
                time.sleep(delay / 1000)
        return None
'''

UNTIL_CANCELLED_CONFIG = """
name: "py_until_cancelled"
backend: "python"
model_transaction_policy { decoupled: true }
input [
  { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "MAX_RESPONSE_COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "DELAY" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IGNORE_CANCEL" data_type: TYPE_BOOL dims: [ 1 ] }
]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# Sums py_until_cancelled's responses and cancels the stream once MAX_SUM is reached; IS_CANCELLED says
# whether the stream then ended with a CANCELLED error.  {call} is how the stream is opened.
BLS_CANCEL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

MAX_RESPONSE_COUNT = 8
DELAY_MS = 100


class TritonPythonModel:
    {define}execute(self, requests):
        request = requests[0]
        max_sum = int(pb_utils.get_input_tensor_by_name(request, "MAX_SUM").as_numpy()[0])
        inputs = [
            pb_utils.get_input_tensor_by_name(request, "INPUT"),
            pb_utils.Tensor("MAX_RESPONSE_COUNT", np.array([MAX_RESPONSE_COUNT], np.int32)),
            pb_utils.Tensor("DELAY", np.array([DELAY_MS], np.int32)),
            pb_utils.get_input_tensor_by_name(request, "IGNORE_CANCEL"),
        ]
        bls = pb_utils.InferenceRequest(
            model_name="py_until_cancelled", inputs=inputs, requested_output_names=["OUTPUT"]
        )
        stream = {call}
        total, cancelled, error = 0, False, None
        for response in stream:
            if response.has_error():
                if response.error().code() == pb_utils.TritonError.CANCELLED:
                    cancelled = True
                else:
                    error = response.error()
                break
            total += int(pb_utils.get_output_tensor_by_name(response, "OUTPUT").as_numpy()[0])
            if total >= max_sum:
                stream.cancel()
        stream.cancel()  # after the final response: does nothing
        outputs = [
            pb_utils.Tensor("SUM", np.array([total], np.int32)),
            pb_utils.Tensor("IS_CANCELLED", np.array([cancelled], np.bool_)),
        ]
        return [pb_utils.InferenceResponse(outputs, error=error)]
"""

BLS_CANCEL_CONFIG = """
name: "{name}"
backend: "python"
input [
  {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "MAX_SUM" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "IGNORE_CANCEL" data_type: TYPE_BOOL dims: [ 1 ] }}
]
output [
  {{ name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "IS_CANCELLED" data_type: TYPE_BOOL dims: [ 1 ] }}
]
"""

BATCHED_STREAM_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers each request of a batch on its own sender: IN + 1, then IN + 2 with the final flag; BATCH says
    how many requests its execute had."""

    def execute(self, requests):
        batch = np.array([[len(requests)]], np.int32)
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for step, flags in ((1, 0), (2, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)):
                outputs = [pb_utils.Tensor("OUT", value + step), pb_utils.Tensor("BATCH", batch)]
                sender.send(pb_utils.InferenceResponse(outputs), flags=flags)
        return None
'''

# The batcher waits (up to 60 s) for three requests: those a test sends together share one execute.
BATCHED_STREAM_CONFIG = """
name: "py_stream_batched"
backend: "python"
max_batch_size: 4
model_transaction_policy { decoupled: true }
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 60000000 }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""


def _write(repo: pathlib.Path, name: str, config: str, model_py: str) -> None:
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "1" / "model.py").write_text(textwrap.dedent(model_py).lstrip())
    (d / "config.pbtxt").write_text(textwrap.dedent(config).lstrip())


def build(repo: pathlib.Path) -> None:
    _write(repo, "py_until_cancelled", UNTIL_CANCELLED_CONFIG, UNTIL_CANCELLED_PY)
    callers = {
        "py_bls_cancel": ("def ", "bls.exec(decoupled=True)"),
        "py_bls_async_cancel": ("async def ", "await bls.async_exec(decoupled=True)"),
    }
    for name, (define, call) in callers.items():
        model_py = BLS_CANCEL_PY.replace("{define}", define).replace("{call}", call)
        _write(repo, name, BLS_CANCEL_CONFIG.format(name=name) + SHARED, model_py)
    _write(repo, "py_stream_batched", BATCHED_STREAM_CONFIG + SHARED, BATCHED_STREAM_PY)
