"""Sequence models for in-process tests and the fuzzer: accumulators (direct, oldest, without batching,
with a short idle timeout, with a state from a data file) and control echoes, as small ONNX graphs."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper

ACC_DIRECT, ACC_OLDEST, CTL_DIRECT, CTL_OLDEST = "acc_direct", "acc_oldest", "ctl_direct", "ctl_oldest"
ACC_NOBATCH, ACC_IDLE = "acc_nobatch", "acc_idle"
INITIAL = 100  # acc_nobatch's initial state, from its data file

ONNX_TYPE = {
    "TYPE_INT32": TensorProto.INT32,
    "TYPE_FP32": TensorProto.FLOAT,
    "TYPE_BOOL": TensorProto.BOOL,
    "TYPE_UINT64": TensorProto.UINT64,
    "TYPE_INT64": TensorProto.INT64,
    "TYPE_UINT32": TensorProto.UINT32,
    "TYPE_STRING": TensorProto.STRING,
}


# --------------------------------------------------------------------------- model repository


def _write(repo: pathlib.Path, name: str, graph: onnx.GraphProto, config: str) -> pathlib.Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    d = repo / name
    (d / "1").mkdir(parents=True)
    onnx.save(model, str(d / "1" / "model.onnx"))
    (d / "config.pbtxt").write_text(f'name: "{name}"\nplatform: "onnxruntime_onnx"\n{config}')
    return d


def _bool_control(name: str, kind: str, values: str) -> str:
    return f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} {values} }} ] }}'


def _corrid_control(data_type: str) -> str:
    return f'{{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {data_type} }} ] }}'


def accumulator(
    repo: pathlib.Path,
    name: str,
    strategy: str,
    *,
    max_batch_size: int = 4,
    idle_us: int = 5_000_000,
    initial: str = "",
) -> pathlib.Path:
    """OUTPUT_STATE = INPUT + INPUT_STATE; OUTPUT = OUTPUT_STATE; OUT_START / OUT_CORRID echo START / CORRID."""
    batch = ["b"] if max_batch_size > 0 else []
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["OUTPUT_STATE"]),
            helper.make_node("Identity", ["OUTPUT_STATE"], ["OUTPUT"]),
            helper.make_node("Identity", ["START"], ["OUT_START"]),
            helper.make_node("Identity", ["CORRID"], ["OUT_CORRID"]),
        ],
        name,
        [
            vi("INPUT", TensorProto.INT32, [*batch, 1]),
            vi("INPUT_STATE", TensorProto.INT32, [*batch, 1]),
            vi("START", TensorProto.INT32, [*batch, 1]),
            vi("CORRID", TensorProto.UINT64, [*batch, 1]),
        ],
        [
            vi("OUTPUT", TensorProto.INT32, [*batch, 1]),
            vi("OUTPUT_STATE", TensorProto.INT32, [*batch, 1]),
            vi("OUT_START", TensorProto.INT32, [*batch, 1]),
            vi("OUT_CORRID", TensorProto.UINT64, [*batch, 1]),
        ],
    )
    init = initial or 'initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" }'
    config = f"""
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "OUT_START" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "OUT_CORRID" data_type: TYPE_UINT64 dims: [ 1 ] }}
]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [
    {_bool_control("START", "START", "int32_false_true: [ 0, 1 ]")},
    {_corrid_control("TYPE_UINT64")}
  ]
  state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] {init} }} ]
}}
"""
    return _write(repo, name, graph, config)


def control_echo(repo: pathlib.Path, name: str, strategy: str, corrid_type: str) -> pathlib.Path:
    """OUTPUT = INPUT; OUT_<control> = the control tensor the batcher fed (max_batch_size 2)."""
    vi = helper.make_tensor_value_info
    controls = [
        ("START", "TYPE_FP32", _bool_control("START", "START", "fp32_false_true: [ 0, 1 ]")),
        ("END", "TYPE_BOOL", _bool_control("END", "END", "bool_false_true: [ false, true ]")),
        ("READY", "TYPE_INT32", _bool_control("READY", "READY", "int32_false_true: [ 0, 1 ]")),
        ("CORRID", corrid_type, _corrid_control(corrid_type)),
    ]
    nodes = [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])]
    nodes += [helper.make_node("Identity", [c], [f"OUT_{c}"]) for c, _, _ in controls]
    graph = helper.make_graph(
        nodes,
        name,
        [vi("INPUT", TensorProto.INT32, ["b", 1])] + [vi(c, ONNX_TYPE[t], ["b", 1]) for c, t, _ in controls],
        [vi("OUTPUT", TensorProto.INT32, ["b", 1])] + [vi(f"OUT_{c}", ONNX_TYPE[t], ["b", 1]) for c, t, _ in controls],
    )
    outputs = ",\n  ".join(
        ['{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }']
        + [f'{{ name: "OUT_{c}" data_type: {t} dims: [ 1 ] }}' for c, t, _ in controls]
    )
    config = f"""
max_batch_size: 2
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {outputs}
]
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  {strategy}
  control_input [ {", ".join(c for _, _, c in controls)} ]
}}
"""
    return _write(repo, name, graph, config)


def build_sequence_repository(repo: pathlib.Path) -> pathlib.Path:
    accumulator(repo, ACC_DIRECT, "direct { }")
    accumulator(
        repo,
        ACC_OLDEST,
        "oldest { max_candidate_sequences: 3 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 1000 }",
    )
    control_echo(repo, CTL_DIRECT, "direct { }", "TYPE_INT32")
    control_echo(repo, CTL_OLDEST, "oldest { max_candidate_sequences: 4 }", "TYPE_STRING")
    d = accumulator(
        repo,
        ACC_NOBATCH,
        "direct { }",
        max_batch_size=0,
        initial='initial_state: { data_type: TYPE_INT32 dims: [ 1 ] data_file: "hundred" name: "from file" }',
    )
    (d / "initial_state").mkdir()
    (d / "initial_state" / "hundred").write_bytes(np.array([INITIAL], dtype=np.int32).tobytes())
    accumulator(repo, ACC_IDLE, "direct { }", max_batch_size=1, idle_us=30_000)
    return repo
