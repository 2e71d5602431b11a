"""Test-only models built with onnx.helper (no downloads)."""

from __future__ import annotations

import pathlib

import onnx
from onnx import TensorProto, helper

# wire name -> ONNX element type; every datatype ONNX Identity runs in onnxruntime.
IDENTITY_TYPES: dict[str, int] = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def _config_type(wire: str) -> str:
    return "TYPE_STRING" if wire == "BYTES" else f"TYPE_{wire}"


def identity_all(repo: pathlib.Path, name: str = "identity_all", max_batch_size: int = 8) -> pathlib.Path:
    """One model with IN_<T> -> OUT_<T> for every datatype, so one replica covers them all."""
    inputs, outputs, nodes, cfg_in, cfg_out = [], [], [], [], []
    for wire, et in IDENTITY_TYPES.items():
        shape = ["batch", "n"] if max_batch_size > 0 else ["n"]
        inputs.append(helper.make_tensor_value_info(f"IN_{wire}", et, shape))
        outputs.append(helper.make_tensor_value_info(f"OUT_{wire}", et, shape))
        nodes.append(helper.make_node("Identity", [f"IN_{wire}"], [f"OUT_{wire}"]))
        cfg_in.append(f'  {{ name: "IN_{wire}" data_type: {_config_type(wire)} dims: [ -1 ] }}')
        cfg_out.append(f'  {{ name: "OUT_{wire}" data_type: {_config_type(wire)} dims: [ -1 ] }}')
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    d = repo / name
    (d / "1").mkdir(parents=True)
    onnx.save(model, str(d / "1" / "model.onnx"))
    ins, outs = ",\n".join(cfg_in), ",\n".join(cfg_out)
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        f"input [\n{ins}\n]\noutput [\n{outs}\n]\n"
    )
    return d


def as_bytes(x: object) -> bytes:
    """tritonclient returns BYTES elements as str when they came as JSON."""
    return x.encode() if isinstance(x, str) else bytes(x)  # type: ignore[arg-type]


def slow_identity(repo: pathlib.Path, name: str, extra_config: str, *, size: int = 1024, matmuls: int = 32) -> None:
    """OUT = IN ([-1, 1] FP32), after ``matmuls`` products of a ``size``-square matrix (a few hundred ms on one
    core, whatever the batch size), so that requests observably queue behind an execution.

    The products depend on the input (through ``sum(IN) * 0``) so onnxruntime cannot fold them at load.
    """
    import numpy as np
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([0.0], np.float32), "ZERO")]
    nodes = [
        helper.make_node("ReduceSum", ["IN"], ["s"], keepdims=0),
        helper.make_node("Mul", ["s", "ZERO"], ["s0"]),
        helper.make_node("Add", ["W", "s0"], ["a0"]),
    ]
    prev = "a0"
    for i in range(matmuls):
        nodes.append(helper.make_node("MatMul", [prev, "W"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"]))
        prev = f"t{i}"
    nodes += [
        helper.make_node("ReduceSum", [prev], ["z"], keepdims=0),
        helper.make_node("Mul", ["z", "ZERO"], ["z0"]),
        helper.make_node("Add", ["IN", "z0"], ["OUT"]),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["batch", 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    d = repo / name
    (d / "1").mkdir(parents=True)
    onnx.save(model, str(d / "1" / "model.onnx"))
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n' + extra_config
    )
