"""The models Triton's published example clients call, built here so the clients run against us unchanged.

Names, tensors, configs and outputs follow Triton's ``docs/examples/model_repository`` and the QA
generators that made its model files (``qa/common/gen_qa_*``): the clients check exact values, so the
semantics below are those they expect, not a guess.

* ``simple`` / ``simple_int8``: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32 / INT8 [16]).
* ``simple_string``: the same on BYTES [16] holding decimal integers (ONNX Cast string <-> int32).
* ``simple_identity``: BYTES [-1] echoed.
* ``simple_sequence`` (direct): OUTPUT = (INPUT + START) * READY, as Triton's QA sequence models
  (``INPUT + START``, 0 when not ready: "the tests know to expect this").
* ``simple_dyna_sequence`` (oldest, 2 instances): OUTPUT = (INPUT + START + END * CORRID) * READY, the QA
  dyna-sequence models' formula; CORRID is UINT64.
* ``simple_string_dyna_sequence``: Triton's dyna_sequence backend with a string CORRID: a running sum
  reset at START, plus the correlation ID (a decimal string) on the END request. Here it is ONNX with an
  INT32 implicit state in place of the backend's own memory.
* ``repeat_int32``: Triton's decoupled repeat backend as a Python model: one response OUT = [IN[i]]
  (IDX = [i]) DELAY[i] ms apart, then the final flag alone after WAIT ms.
* ``inception_graphdef``: only its tensors (``input`` FP32 [299, 299, 3] NHWC -> softmax
  ``InceptionV3/Predictions/Softmax`` [1001]) for grpc_client.py's raw-stub call; no real network.
"""

from __future__ import annotations

import pathlib
import textwrap
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from scripts import example_models

SIMPLE, SIMPLE_INT8, SIMPLE_STRING, SIMPLE_IDENTITY = "simple", "simple_int8", "simple_string", "simple_identity"
SIMPLE_SEQUENCE, SIMPLE_DYNA_SEQUENCE = "simple_sequence", "simple_dyna_sequence"
SIMPLE_STRING_DYNA_SEQUENCE, REPEAT_INT32, INCEPTION = (
    "simple_string_dyna_sequence",
    "repeat_int32",
    "inception_graphdef",
)

ALL_MODELS = (
    SIMPLE,
    SIMPLE_INT8,
    SIMPLE_STRING,
    SIMPLE_IDENTITY,
    SIMPLE_SEQUENCE,
    SIMPLE_DYNA_SEQUENCE,
    SIMPLE_STRING_DYNA_SEQUENCE,
    REPEAT_INT32,
    INCEPTION,
)

_vi = helper.make_tensor_value_info


def _write_onnx(repo: pathlib.Path, name: str, graph: onnx.GraphProto, config: str) -> pathlib.Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", example_models.OPSET)])
    model.ir_version = example_models.IR_VERSION
    onnx.checker.check_model(model)
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(d / "1" / "model.onnx"))
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\n' + textwrap.dedent(config).lstrip()
    )
    return d


def simple_string(repo: pathlib.Path) -> pathlib.Path:
    """add/sub on BYTES [16] of decimal integers: Cast to INT32, compute, Cast back to strings."""
    shape = ["batch", 16]
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
            helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("Sub", ["a", "b"], ["diff"]),
            helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
            helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=TensorProto.STRING),
        ],
        SIMPLE_STRING,
        [_vi(n, TensorProto.STRING, shape) for n in ("INPUT0", "INPUT1")],
        [_vi(n, TensorProto.STRING, shape) for n in ("OUTPUT0", "OUTPUT1")],
    )
    config = """
    max_batch_size: 8
    input [
      { name: "INPUT0" data_type: TYPE_STRING dims: [ 16 ] },
      { name: "INPUT1" data_type: TYPE_STRING dims: [ 16 ] }
    ]
    output [
      { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 16 ] },
      { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 16 ] }
    ]
    """
    return _write_onnx(repo, SIMPLE_STRING, graph, config)


def _control(name: str, kind: str) -> str:
    return f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} int32_false_true: [ 0, 1 ] }} ] }}'


def _corrid(data_type: str) -> str:
    return f'{{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {data_type} }} ] }}'


_SEQUENCE_IO = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

_OLDEST = """
  max_sequence_idle_microseconds: 10000000
  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }
"""


def simple_sequence(repo: pathlib.Path) -> pathlib.Path:
    """OUTPUT = (INPUT + START) * READY, with Triton's simple_sequence config (direct strategy)."""
    s = ["batch", 1]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT", "START"], ["sum"]),
            helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"]),
        ],
        SIMPLE_SEQUENCE,
        [_vi(n, TensorProto.INT32, s) for n in ("INPUT", "START", "READY")],
        [_vi("OUTPUT", TensorProto.INT32, s)],
    )
    config = f"""
max_batch_size: 8
sequence_batching {{
  control_input [ {_control("START", "START")}, {_control("READY", "READY")} ]
}}
{_SEQUENCE_IO}
instance_group [ {{ kind: KIND_CPU }} ]
"""
    return _write_onnx(repo, SIMPLE_SEQUENCE, graph, config)


def simple_dyna_sequence(repo: pathlib.Path) -> pathlib.Path:
    """OUTPUT = (INPUT + START + END * CORRID) * READY, with Triton's simple_dyna_sequence config."""
    s = ["batch", 1]
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["CORRID"], ["corrid"], to=TensorProto.INT32),
            helper.make_node("Mul", ["END", "corrid"], ["end_corrid"]),
            helper.make_node("Add", ["INPUT", "START"], ["sum"]),
            helper.make_node("Add", ["sum", "end_corrid"], ["total"]),
            helper.make_node("Mul", ["total", "READY"], ["OUTPUT"]),
        ],
        SIMPLE_DYNA_SEQUENCE,
        [_vi(n, TensorProto.INT32, s) for n in ("INPUT", "START", "END", "READY")]
        + [_vi("CORRID", TensorProto.UINT64, s)],
        [_vi("OUTPUT", TensorProto.INT32, s)],
    )
    config = f"""
max_batch_size: 8
sequence_batching {{
{_OLDEST}
  control_input [
    {_control("START", "START")}, {_control("END", "END")}, {_control("READY", "READY")}, {_corrid("TYPE_UINT64")}
  ]
}}
{_SEQUENCE_IO}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
"""
    return _write_onnx(repo, SIMPLE_DYNA_SEQUENCE, graph, config)


def simple_string_dyna_sequence(repo: pathlib.Path) -> pathlib.Path:
    """A running sum (reset at START by the implicit state) plus the string CORRID as a number at END."""
    s = ["batch", 1]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["OUTPUT_STATE"]),
            helper.make_node("Cast", ["CORRID"], ["corrid"], to=TensorProto.INT32),
            helper.make_node("Mul", ["END", "corrid"], ["end_corrid"]),
            helper.make_node("Add", ["OUTPUT_STATE", "end_corrid"], ["total"]),
            helper.make_node("Mul", ["total", "READY"], ["OUTPUT"]),
        ],
        SIMPLE_STRING_DYNA_SEQUENCE,
        [_vi(n, TensorProto.INT32, s) for n in ("INPUT", "INPUT_STATE", "START", "END", "READY")]
        + [_vi("CORRID", TensorProto.STRING, s)],
        [_vi(n, TensorProto.INT32, s) for n in ("OUTPUT", "OUTPUT_STATE")],
    )
    config = f"""
max_batch_size: 8
sequence_batching {{
{_OLDEST}
  control_input [
    {_control("START", "START")}, {_control("END", "END")}, {_control("READY", "READY")}, {_corrid("TYPE_STRING")}
  ]
  state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
}}
{_SEQUENCE_IO}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
"""
    return _write_onnx(repo, SIMPLE_STRING_DYNA_SEQUENCE, graph, config)


def inception_graphdef(repo: pathlib.Path) -> pathlib.Path:
    """inception_graphdef's tensors: the mean colour of the image through a fixed 3 x 1001 layer, softmaxed."""
    weights = np.random.default_rng(0).standard_normal((3, 1001)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["input"], ["colour"], axes=[1, 2], keepdims=0),
            helper.make_node("MatMul", ["colour", "W"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["InceptionV3/Predictions/Softmax"], axis=-1),
        ],
        INCEPTION,
        [_vi("input", TensorProto.FLOAT, ["batch", 299, 299, 3])],
        [_vi("InceptionV3/Predictions/Softmax", TensorProto.FLOAT, ["batch", 1001])],
        [numpy_helper.from_array(weights, "W")],
    )
    config = """
    max_batch_size: 128
    input [ { name: "input" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 299, 299, 3 ] } ]
    output [ { name: "InceptionV3/Predictions/Softmax" data_type: TYPE_FP32 dims: [ 1001 ] } ]
    instance_group [ { kind: KIND_CPU } ]
    """
    return _write_onnx(repo, INCEPTION, graph, config)


REPEAT_PY = '''
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Triton's repeat backend: OUT = [IN[i]], IDX = [i] every DELAY[i] ms, then the final flag after WAIT ms."""

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.respond, args=(request,), daemon=True).start()
        return None

    def respond(self, request):
        sender = request.get_response_sender()
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
        wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
        for i, value in enumerate(values):
            time.sleep(int(delays[i]) / 1000 if i < len(delays) else 0)
            out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
            idx = pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out, idx]))
        time.sleep(int(wait[0]) / 1000)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

REPEAT_CONFIG = f"""
name: "{REPEAT_INT32}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] }},
  {{ name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }}
]
output [
  {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def repeat_int32(repo: pathlib.Path) -> pathlib.Path:
    d = repo / REPEAT_INT32
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "1" / "model.py").write_text(textwrap.dedent(REPEAT_PY).lstrip())
    (d / "config.pbtxt").write_text(REPEAT_CONFIG.lstrip())
    return d


def build(repo: pathlib.Path, names: Iterable[str] = ALL_MODELS) -> pathlib.Path:
    """Write the named models (all by default) into ``repo``."""
    builders = {
        SIMPLE: lambda r: example_models.add_sub(r, name=SIMPLE, dtype="INT32"),
        SIMPLE_INT8: lambda r: example_models.add_sub(r, name=SIMPLE_INT8, dtype="INT8"),
        SIMPLE_STRING: simple_string,
        SIMPLE_IDENTITY: lambda r: example_models.identity(r, "BYTES", name=SIMPLE_IDENTITY),
        SIMPLE_SEQUENCE: simple_sequence,
        SIMPLE_DYNA_SEQUENCE: simple_dyna_sequence,
        SIMPLE_STRING_DYNA_SEQUENCE: simple_string_dyna_sequence,
        REPEAT_INT32: repeat_int32,
        INCEPTION: inception_graphdef,
    }
    repo.mkdir(parents=True, exist_ok=True)
    for name in names:
        builders[name](repo)
    return repo


if __name__ == "__main__":  # python -m tests.support.triton_simple_models DIR [MODEL ...]
    import sys

    build(pathlib.Path(sys.argv[1]), sys.argv[2:] or ALL_MODELS)
