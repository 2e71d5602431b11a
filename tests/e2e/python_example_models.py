"""Models shaped as Triton's python_backend examples, for test_python_backend_examples.py.

Each one has the example's name, config (tensor names, datatypes, dims, batching, decoupled policy,
instance count) and the ``triton_python_backend_utils`` calls its ``model.py`` makes, so a client
written for the example runs against it unchanged.  The code is ours:

* ``add_sub``: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32 [4]).
* ``pytorch``: the same through a ``torch.nn.Module`` defined in ``model.py`` (only with PyTorch).
* ``bls_sync``: ``exec()`` on the model named by its MODEL_NAME input, its outputs passed on.
* ``bls_async``: ``async execute`` awaiting ``async_exec()`` on ``pytorch`` and ``add_sub`` together:
  OUTPUT0 from the first, OUTPUT1 from the second.
* ``repeat_int32`` (decoupled): OUT = [IN[i]], IDX = [i] from a thread, DELAY[i] ms apart; ``execute``
  returns after WAIT ms.
* ``square_int32`` (decoupled): IN = [n] answered n times with OUT = [n] from a thread.
* ``bls_decoupled_sync`` / ``_async``: SUM of the OUT values ``square_int32`` streams back, through
  ``exec(decoupled=True)``, or two ``async_exec(decoupled=True)`` awaited together (twice the sum).
* ``nobatch_auto_complete`` / ``batch_auto_complete``: ``model.py`` alone; ``auto_complete_config``
  adds the add_sub tensors and sets ``max_batch_size`` 0, or 4 with dynamic batching.
* ``custom_metrics``: add_sub on three instances, adding each execution's time to a counter
  ``requests_process_latency_ns{model="custom_metrics",version="1"}``.
"""

from __future__ import annotations

import importlib.util
import pathlib
import textwrap

HAS_TORCH = importlib.util.find_spec("torch") is not None

ADD_SUB_CONFIG = """
name: "{name}"
backend: "python"

input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
input [ {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]

instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""

ADD_SUB_PY = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtypes = {
            name: pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, name)["data_type"])
            for name in ("OUTPUT0", "OUTPUT1")
        }

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = {"OUTPUT0": a + b, "OUTPUT1": a - b}
            tensors = [pb_utils.Tensor(n, v.astype(self.dtypes[n])) for n, v in outputs.items()]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
"""

PYTORCH_PY = """
import json

import torch
import triton_python_backend_utils as pb_utils


class SumAndDifference(torch.nn.Module):
    def forward(self, a, b):
        return a + b, a - b


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        out = pb_utils.get_output_config_by_name(config, "OUTPUT0")
        self.dtype = pb_utils.triton_string_to_numpy(out["data_type"])
        self.net = SumAndDifference().eval()

    def execute(self, requests):
        responses = []
        with torch.no_grad():
            for request in requests:
                a, b = (torch.from_numpy(pb_utils.get_input_tensor_by_name(request, n).as_numpy())
                        for n in ("INPUT0", "INPUT1"))
                total, difference = self.net(a, b)
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUTPUT0", total.numpy().astype(self.dtype)),
                    pb_utils.Tensor("OUTPUT1", difference.numpy().astype(self.dtype)),
                ]))
        return responses
"""

BLS_SYNC_CONFIG = """
name: "bls_sync"
backend: "python"

input [ { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
input [ { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]

instance_group [ { kind: KIND_CPU } ]
"""

BLS_SYNC_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]  # bytes, as sent
            call = pb_utils.InferenceRequest(
                model_name=target,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")],
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=answer.output_tensors()))
        return responses
"""

BLS_ASYNC_PY = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")]
            calls = [
                pb_utils.InferenceRequest(
                    model_name=target, requested_output_names=["OUTPUT0", "OUTPUT1"], inputs=inputs
                ).async_exec()
                for target in ("pytorch", "add_sub")
            ]
            from_pytorch, from_add_sub = await asyncio.gather(*calls)
            for answer in (from_pytorch, from_add_sub):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(from_pytorch, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(from_add_sub, "OUTPUT1"),
            ]))
        return responses
"""

REPEAT_CONFIG = """
name: "repeat_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU } ]
"""

# The two decoupled models count their sender threads, and finalize waits for them, as the examples do.
REPEAT_PY = """
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("repeat_int32 answers through its response sender: decoupled only")
        self.out_dtype = pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, "OUT")["data_type"])
        self.idx_dtype = pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, "IDX")["data_type"])
        width = config.get("parameters", {}).get("output_num_elements", {}).get("string_value", 1)
        self.width = int(width)
        self.busy = 0
        self.lock = threading.Lock()

    def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException(f"one request per execution, got {len(requests)}")
        request = requests[0]
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
        if values.shape != delays.shape:
            raise pb_utils.TritonModelException(f"IN {list(values.shape)} and DELAY {list(delays.shape)} differ")
        with self.lock:
            self.busy += 1
        worker = threading.Thread(target=self.stream, args=(request.get_response_sender(), values, delays))
        worker.daemon = True
        worker.start()
        time.sleep(int(pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()[0]) / 1000)
        return None

    def stream(self, sender, values, delays):
        for i, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(int(delay) / 1000)
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("IDX", np.array([i], self.idx_dtype)),
                pb_utils.Tensor("OUT", np.full((self.width,), value, self.out_dtype)),
            ]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self.lock:
            self.busy -= 1

    def finalize(self):
        while True:
            with self.lock:
                if self.busy == 0:
                    return
            time.sleep(0.05)
"""

SQUARE_CONFIG = """
name: "square_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""

SQUARE_PY = """
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("square_int32 answers through its response sender: decoupled only")
        tensors = [pb_utils.get_input_config_by_name(config, "IN"), pb_utils.get_output_config_by_name(config, "OUT")]
        for tensor in tensors:
            if tensor["dims"] != [1] or tensor["data_type"] != "TYPE_INT32":
                raise pb_utils.TritonModelException(f"{tensor['name']} must be TYPE_INT32 [1], got {tensor}")
        self.busy = 0
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            with self.lock:
                self.busy += 1
            threading.Thread(target=self.stream, args=(request.get_response_sender(), n), daemon=True).start()
        return None

    def stream(self, sender, n):
        for _ in range(int(n[0])):
            sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", np.array([n[0]], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self.lock:
            self.busy -= 1

    def finalize(self):
        while True:
            with self.lock:
                if self.busy == 0:
                    return
            time.sleep(0.05)
"""

BLS_DECOUPLED_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""

# Both sum into a default-int array and answer with it, as the examples do (SUM goes out as INT64).
BLS_DECOUPLED_SYNC_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException(f"one request per execution, got {len(requests)}")
        n = pb_utils.get_input_tensor_by_name(requests[0], "IN")
        call = pb_utils.InferenceRequest(model_name="square_int32", inputs=[n], requested_output_names=["OUT"])
        total = np.array([0])
        for answer in call.exec(decoupled=True):
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            if answer.output_tensors():  # the last one carries only the final flag
                total += pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy()
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])]
"""

BLS_DECOUPLED_ASYNC_PY = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException(f"one request per execution, got {len(requests)}")
        n = pb_utils.get_input_tensor_by_name(requests[0], "IN")
        calls = [
            pb_utils.InferenceRequest(
                model_name="square_int32", inputs=[n], requested_output_names=["OUT"]
            ).async_exec(decoupled=True)
            for _ in range(2)
        ]
        total = np.array([0])
        for answers in await asyncio.gather(*calls):
            for answer in answers:
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                if answer.output_tensors():
                    total += pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy()
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])]
"""

AUTO_COMPLETE_PY = """
import json

import triton_python_backend_utils as pb_utils

TENSORS = {
    "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("INPUT0", "INPUT1")],
    "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("OUTPUT0", "OUTPUT1")],
}


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config.as_dict()
        adders = {"input": auto_complete_model_config.add_input, "output": auto_complete_model_config.add_output}
        for kind, tensors in TENSORS.items():
            present = {t["name"] for t in config[kind]}
            for tensor in tensors:
                if tensor["name"] not in present:
                    adders[kind](tensor)
        auto_complete_model_config.set_max_batch_size({max_batch_size})
        if {max_batch_size}:
            auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtype = pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a, b = (pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in ("INPUT0", "INPUT1"))
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype)),
            ]))
        return responses
"""

CUSTOM_METRICS_PY = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(
            name="requests_process_latency_ns",
            description="Cumulative time spent processing requests",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.latency = self.family.Metric(labels={"model": "custom_metrics", "version": "1"})

    def execute(self, requests):
        started = time.time_ns()
        responses = []
        for request in requests:
            a, b = (pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in ("INPUT0", "INPUT1"))
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b),
            ]))
        self.latency.increment(max(time.time_ns() - started, 1))
        pb_utils.Logger.log_info(f"Cumulative requests processing latency: {self.latency.value()}")
        return responses
"""


def _write(repo: pathlib.Path, name: str, model_py: str, config: str = "") -> None:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(textwrap.dedent(model_py).lstrip())
    if config:
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config).lstrip())


def build(repo: pathlib.Path) -> pathlib.Path:
    """Every model above into ``repo`` (``pytorch`` only where PyTorch imports)."""
    _write(repo, "add_sub", ADD_SUB_PY, ADD_SUB_CONFIG.format(name="add_sub", count=1))
    if HAS_TORCH:
        _write(repo, "pytorch", PYTORCH_PY, ADD_SUB_CONFIG.format(name="pytorch", count=1))
    _write(repo, "bls_sync", BLS_SYNC_PY, BLS_SYNC_CONFIG)
    _write(repo, "bls_async", BLS_ASYNC_PY, ADD_SUB_CONFIG.format(name="bls_async", count=1))
    _write(repo, "repeat_int32", REPEAT_PY, REPEAT_CONFIG)
    _write(repo, "square_int32", SQUARE_PY, SQUARE_CONFIG)
    _write(repo, "bls_decoupled_sync", BLS_DECOUPLED_SYNC_PY, BLS_DECOUPLED_CONFIG.format(name="bls_decoupled_sync"))
    _write(repo, "bls_decoupled_async", BLS_DECOUPLED_ASYNC_PY, BLS_DECOUPLED_CONFIG.format(name="bls_decoupled_async"))
    _write(repo, "nobatch_auto_complete", AUTO_COMPLETE_PY.replace("{max_batch_size}", "0"))
    _write(repo, "batch_auto_complete", AUTO_COMPLETE_PY.replace("{max_batch_size}", "4"))
    _write(repo, "custom_metrics", CUSTOM_METRICS_PY, ADD_SUB_CONFIG.format(name="custom_metrics", count=3))
    return repo
