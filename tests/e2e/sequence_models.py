"""Test-only models for the sequence batcher, built with onnx.helper (no downloads).

Every model here speaks only what Triton's sequence batcher feeds a model: the request's own inputs,
the control tensors declared under ``sequence_batching.control_input`` and the implicit state
declared under ``sequence_batching.state``. None of those control/state tensors appears in the
config's ``input`` list (Triton's rule); the output state of the accumulators is also listed in
``output`` so that a client may ask for it.

=============  =====  ==========================  =========  ========================================
model          mbs    strategy                    instances  what it computes
=============  =====  ==========================  =========  ========================================
seq_accum      4      direct, idle 5 s            2          OUTPUT = running sum (state, zeros)
seq_accum_file 4      direct, idle 10 s           1          OUTPUT = 100 + running sum (data_file)
seq_ctl        2      direct, idle 10 s           2          echoes INPUT and START/END/READY/CORRID
seq_ctl32      2      direct, idle 10 s           1          as seq_ctl, CORRID is TYPE_INT32
seq_idle       0      direct, idle 1 s            1          running sum (one slot in all)
seq_oldest     4      oldest (4 candidates), 10 s 2          running sum and CORRID echo
seq_kill       2      direct, idle 30 s           2          running sum, state backup off (replica kill)
seq_survive    2      direct, idle 30 s           2          running sum, state backup on (replica kill)
seq_old_idle   1      oldest (1 candidate), 2 s   1          running sum (one slot in all)
seq_text       2      direct, idle 10 s           1          OUTPUT = "<" + every INPUT so far (string state)
seq_ensemble   4      ensemble over seq_accum     -          OUTPUT = seq_accum's running sum
=============  =====  ==========================  =========  ========================================
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

THREADS = 'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'

ZERO_STATE = """  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }
    }
  ]
"""

FILE_STATE = """  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state: { data_type: TYPE_INT32 dims: [ 1 ] data_file: "initial_state_data" name: "hundred" }
    }
  ]
"""

# The value the data_file variant starts from (int32, little-endian, in <model>/initial_state/).
FILE_INITIAL_STATE = 100


def _control(name: str, kind: str) -> str:
    return f'    {{ name: "{name}" control [ {{ kind: {kind} int32_false_true: [ 0, 1 ] }} ] }}'


def _corrid(config_type: str) -> str:
    return f'    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {config_type} }} ] }}'


def _controls(*lines: str) -> str:
    return "  control_input [\n" + ",\n".join(lines) + "\n  ]\n"


def _save(
    repo: pathlib.Path,
    name: str,
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int]],
    outputs: list[tuple[str, int]],
    *,
    max_batch_size: int,
    config_io: str,
    sequence_batching: str,
    instances: int,
    initializers: list[onnx.TensorProto] | None = None,
    parameters: str = "",
) -> pathlib.Path:
    """Every tensor here is one element per batch row: [batch, 1], or [1] without batching."""
    shape: list[str | int] = ["batch", 1] if max_batch_size > 0 else [1]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, t, shape) for n, t in inputs],
        [helper.make_tensor_value_info(n, t, shape) for n, t in outputs],
        initializers or [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    d = repo / name
    (d / "1").mkdir(parents=True)
    onnx.save(model, str(d / "1" / "model.onnx"))
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        + config_io
        + "sequence_batching {\n"
        + sequence_batching
        + "}\n"
        + f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
        + THREADS
        + parameters
    )
    return d


NO_BACKUP = 'parameters { key: "sequence_state_backup" value: { string_value: "false" } }\n'
# The replica-kill tests kill one instance's process: each of these models' instances gets its own.
DEDICATED = 'parameters { key: "dedicated_process" value: { string_value: "true" } }\n'

ACCUM_IO = (
    'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    "output [\n"
    '  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },\n'
    '  { name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] }\n'
    "]\n"
)


def accumulator(
    repo: pathlib.Path,
    name: str,
    *,
    max_batch_size: int,
    instances: int,
    strategy: str = "  direct { }\n",
    idle_us: int | None = None,
    state: str = ZERO_STATE,
    parameters: str = "",
) -> pathlib.Path:
    """OUTPUT_STATE = INPUT_STATE + INPUT; OUTPUT = OUTPUT_STATE: the running sum of the sequence's inputs."""
    nodes = [
        helper.make_node("Add", ["INPUT_STATE", "INPUT"], ["OUTPUT_STATE"]),
        helper.make_node("Identity", ["OUTPUT_STATE"], ["OUTPUT"]),
    ]
    idle = f"  max_sequence_idle_microseconds: {idle_us}\n" if idle_us is not None else ""
    return _save(
        repo,
        name,
        nodes,
        [("INPUT", TensorProto.INT32), ("INPUT_STATE", TensorProto.INT32)],
        [("OUTPUT", TensorProto.INT32), ("OUTPUT_STATE", TensorProto.INT32)],
        max_batch_size=max_batch_size,
        config_io=ACCUM_IO,
        sequence_batching=idle + strategy + state,
        instances=instances,
        parameters=parameters,
    )


def accumulator_from_file(repo: pathlib.Path, name: str = "seq_accum_file") -> pathlib.Path:
    d = accumulator(repo, name, max_batch_size=4, instances=1, idle_us=10_000_000, state=FILE_STATE)
    (d / "initial_state").mkdir()
    (d / "initial_state" / "initial_state_data").write_bytes(np.array([FILE_INITIAL_STATE], "<i4").tobytes())
    return d


def control_echo(
    repo: pathlib.Path, name: str, *, corrid_type: str, instances: int, idle_us: int | None = None
) -> pathlib.Path:
    """OUTPUT = INPUT and OUT_<control> = <control> for START, END, READY (int32 0/1) and CORRID."""
    corrid_et = {"TYPE_UINT64": TensorProto.UINT64, "TYPE_INT32": TensorProto.INT32}[corrid_type]
    names = ("START", "END", "READY", "CORRID")
    nodes = [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])]
    nodes += [helper.make_node("Identity", [n], [f"OUT_{n}"]) for n in names]
    inputs = [("INPUT", TensorProto.INT32)] + [(n, TensorProto.INT32) for n in names[:3]] + [("CORRID", corrid_et)]
    outputs = [("OUTPUT", TensorProto.INT32)]
    outputs += [(f"OUT_{n}", TensorProto.INT32) for n in names[:3]] + [("OUT_CORRID", corrid_et)]
    config_io = (
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "output [\n"
        '  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },\n'
        '  { name: "OUT_START" data_type: TYPE_INT32 dims: [ 1 ] },\n'
        '  { name: "OUT_END" data_type: TYPE_INT32 dims: [ 1 ] },\n'
        '  { name: "OUT_READY" data_type: TYPE_INT32 dims: [ 1 ] },\n'
        f'  {{ name: "OUT_CORRID" data_type: {corrid_type} dims: [ 1 ] }}\n'
        "]\n"
    )
    idle = f"  max_sequence_idle_microseconds: {idle_us}\n" if idle_us is not None else ""
    seq = (
        idle
        + "  direct { }\n"
        + _controls(
            _control("START", "CONTROL_SEQUENCE_START"),
            _control("END", "CONTROL_SEQUENCE_END"),
            _control("READY", "CONTROL_SEQUENCE_READY"),
            _corrid(corrid_type),
        )
    )
    return _save(
        repo, name, nodes, inputs, outputs, max_batch_size=2, config_io=config_io, sequence_batching=seq,
        instances=instances,
    )  # fmt: skip


def oldest_accumulator(repo: pathlib.Path, name: str = "seq_oldest") -> pathlib.Path:
    """The accumulator under the oldest strategy, with START/END (only consumed as ``* 0``) and a CORRID echo.

    START and END are folded into the sum multiplied by zero, so the graph consumes every control
    input (no dangling graph inputs) without changing the result.
    """
    nodes = [
        helper.make_node("Add", ["START", "END"], ["flags"]),
        helper.make_node("Mul", ["flags", "ZERO"], ["flags0"]),
        helper.make_node("Add", ["INPUT_STATE", "INPUT"], ["sum"]),
        helper.make_node("Add", ["sum", "flags0"], ["OUTPUT_STATE"]),
        helper.make_node("Identity", ["OUTPUT_STATE"], ["OUTPUT"]),
        helper.make_node("Identity", ["CORRID"], ["OUT_CORRID"]),
    ]
    graph_inputs = [
        ("INPUT", TensorProto.INT32),
        ("INPUT_STATE", TensorProto.INT32),
        ("START", TensorProto.INT32),
        ("END", TensorProto.INT32),
        ("CORRID", TensorProto.UINT64),
    ]
    graph_outputs = [
        ("OUTPUT", TensorProto.INT32),
        ("OUTPUT_STATE", TensorProto.INT32),
        ("OUT_CORRID", TensorProto.UINT64),
    ]
    config_io = (
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "output [\n"
        '  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },\n'
        '  { name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] },\n'
        '  { name: "OUT_CORRID" data_type: TYPE_UINT64 dims: [ 1 ] }\n'
        "]\n"
    )
    seq = (
        "  max_sequence_idle_microseconds: 10000000\n"
        "  oldest {\n"
        "    max_candidate_sequences: 4\n"
        "    preferred_batch_size: [ 4 ]\n"
        "    max_queue_delay_microseconds: 100000\n"
        "  }\n"
        + _controls(
            _control("START", "CONTROL_SEQUENCE_START"),
            _control("END", "CONTROL_SEQUENCE_END"),
            _corrid("TYPE_UINT64"),
        )
        + ZERO_STATE
    )
    zero = numpy_helper.from_array(np.array([0], np.int32), "ZERO")
    return _save(
        repo, name, nodes, graph_inputs, graph_outputs, max_batch_size=4, config_io=config_io,
        sequence_batching=seq, instances=2, initializers=[zero],
    )  # fmt: skip


# seq_text's initial state, from its data_file: BYTES serialized as Triton reads it (length, then bytes).
TEXT_PREFIX = b"<"


def string_accumulator(repo: pathlib.Path, name: str = "seq_text") -> pathlib.Path:
    """OUTPUT_STATE = StringConcat(INPUT_STATE, INPUT); OUTPUT = OUTPUT_STATE: a TYPE_STRING implicit state."""
    graph = helper.make_graph(
        [
            helper.make_node("StringConcat", ["INPUT_STATE", "INPUT"], ["OUTPUT_STATE"]),
            helper.make_node("Identity", ["OUTPUT_STATE"], ["OUTPUT"]),
        ],
        name,
        [helper.make_tensor_value_info(n, TensorProto.STRING, ["batch", 1]) for n in ("INPUT", "INPUT_STATE")],
        [helper.make_tensor_value_info(n, TensorProto.STRING, ["batch", 1]) for n in ("OUTPUT", "OUTPUT_STATE")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])  # StringConcat: opset 20
    model.ir_version = 9
    onnx.checker.check_model(model)
    d = repo / name
    (d / "1").mkdir(parents=True)
    onnx.save(model, str(d / "1" / "model.onnx"))
    (d / "initial_state").mkdir()
    (d / "initial_state" / "prefix").write_bytes(len(TEXT_PREFIX).to_bytes(4, "little") + TEXT_PREFIX)
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 2\n'
        'input [ { name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        "sequence_batching {\n"
        "  max_sequence_idle_microseconds: 10000000\n"
        "  direct { }\n"
        '  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_STRING dims: [ 1 ]\n'
        '            initial_state: { data_type: TYPE_STRING dims: [ 1 ] data_file: "prefix" name: "prefix" } } ]\n'
        "}\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n" + THREADS
    )
    return d


def sequence_ensemble(repo: pathlib.Path, name: str = "seq_ensemble", step_model: str = "seq_accum") -> pathlib.Path:
    """An ensemble whose one step is a sequence model: the request's sequence flags reach that step."""
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        f'ensemble_scheduling {{ step [ {{ model_name: "{step_model}" model_version: -1 '
        'input_map { key: "INPUT" value: "INPUT" } output_map { key: "OUTPUT" value: "OUTPUT" } } ] }\n'
    )
    return d


def build_all(repo: pathlib.Path) -> None:
    accumulator(repo, "seq_accum", max_batch_size=4, instances=2, idle_us=5_000_000)
    accumulator_from_file(repo)
    control_echo(repo, "seq_ctl", corrid_type="TYPE_UINT64", instances=2, idle_us=10_000_000)
    control_echo(repo, "seq_ctl32", corrid_type="TYPE_INT32", instances=1, idle_us=10_000_000)
    accumulator(repo, "seq_idle", max_batch_size=0, instances=1, idle_us=1_000_000)
    oldest_accumulator(repo)
    accumulator(repo, "seq_kill", max_batch_size=2, instances=2, idle_us=30_000_000, parameters=NO_BACKUP + DEDICATED)
    accumulator(repo, "seq_survive", max_batch_size=2, instances=2, idle_us=30_000_000, parameters=DEDICATED)
    accumulator(
        repo, "seq_old_idle", max_batch_size=1, instances=1, idle_us=2_000_000,
        strategy="  oldest { max_candidate_sequences: 1 }\n",
    )  # fmt: skip
    string_accumulator(repo)
    sequence_ensemble(repo)
