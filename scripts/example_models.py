"""Write small Triton model directories (ONNX + config.pbtxt) for examples and tests.

Every function writes ``<repo>/<name>/<version>/model.onnx`` for each of
``versions`` plus ``<repo>/<name>/config.pbtxt`` (except :func:`no_config_onnx`)
and returns ``<repo>/<name>``.  Models are built with ``onnx.helper`` at opset
17 / IR 8, which any onnxruntime >= 1.13 loads, so tests need no downloads and
no checked-in binaries.  Configs are written as text, the way users write them,
with both ``platform: "onnxruntime_onnx"`` and ``backend: "onnxruntime"`` (the
pair Triton accepts), and parse with our ``ModelConfig``.

``extra_config`` (every function) is appended verbatim to config.pbtxt, e.g.
``'instance_group [ { kind: KIND_CPU count: 2 } ]'``.

``scripts.gen_example_repo`` builds the example repository from them, and tests reuse them.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the IR of onnx 1.12 / opset 17; accepted by every onnxruntime we support

# Triton wire datatype -> (ONNX element type, numpy dtype).  BF16 is left out: numpy
# cannot hold it, so neither onnxruntime's Python API nor our tests can feed it.
ONNX_TYPES: dict[str, tuple[int, np.dtype]] = {
    "BOOL": (TensorProto.BOOL, np.dtype(np.bool_)),
    "UINT8": (TensorProto.UINT8, np.dtype(np.uint8)),
    "UINT16": (TensorProto.UINT16, np.dtype(np.uint16)),
    "UINT32": (TensorProto.UINT32, np.dtype(np.uint32)),
    "UINT64": (TensorProto.UINT64, np.dtype(np.uint64)),
    "INT8": (TensorProto.INT8, np.dtype(np.int8)),
    "INT16": (TensorProto.INT16, np.dtype(np.int16)),
    "INT32": (TensorProto.INT32, np.dtype(np.int32)),
    "INT64": (TensorProto.INT64, np.dtype(np.int64)),
    "FP16": (TensorProto.FLOAT16, np.dtype(np.float16)),
    "FP32": (TensorProto.FLOAT, np.dtype(np.float32)),
    "FP64": (TensorProto.DOUBLE, np.dtype(np.float64)),
    "BYTES": (TensorProto.STRING, np.dtype(object)),
}

# Datatypes whose identity model runs in onnxruntime (checked by tests/unit/test_example_models.py).
IDENTITY_DATATYPES: tuple[str, ...] = tuple(ONNX_TYPES)

# Datatypes onnxruntime's CPU Add and Sub kernels both implement (checked with 1.31): all numeric.
ADD_SUB_DATATYPES: tuple[str, ...] = tuple(d for d in ONNX_TYPES if d not in ("BOOL", "BYTES"))

PathLike = str | pathlib.Path


def config_type(datatype: str) -> str:
    """config.pbtxt's name for a wire datatype (``BYTES`` is ``TYPE_STRING``)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


# --- models -----------------------------------------------------------------------------------


def add_sub(
    repo: PathLike,
    name: str = "add_sub",
    max_batch_size: int = 8,
    dims: int = 16,
    dtype: str = "FP32",
    dynamic_batching: bool = False,
    *,
    versions: Sequence[int] = (1,),
    extra_config: str = "",
) -> pathlib.Path:
    """Triton's classic ``simple``: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    if dtype not in ADD_SUB_DATATYPES:
        raise ValueError(f"add_sub supports {ADD_SUB_DATATYPES}, not {dtype!r}")
    model = _add_sub_graph(name, max_batch_size, dims, dtype)
    config = _config(
        name,
        max_batch_size,
        inputs=[("INPUT0", dtype, [dims]), ("INPUT1", dtype, [dims])],
        outputs=[("OUTPUT0", dtype, [dims]), ("OUTPUT1", dtype, [dims])],
        dynamic_batching=_dynamic_batching(dynamic_batching, None, None),
        extra=extra_config,
    )
    return _write(repo, name, model, config, versions)


def identity(
    repo: PathLike,
    datatype: str,
    name: str | None = None,
    max_batch_size: int = 8,
    *,
    versions: Sequence[int] = (1,),
    extra_config: str = "",
) -> pathlib.Path:
    """OUTPUT0 = INPUT0 with dims [-1], for round-tripping one datatype through the server."""
    if datatype not in ONNX_TYPES:
        raise ValueError(f"identity supports {tuple(ONNX_TYPES)}, not {datatype!r}")
    name = name or f"identity_{datatype.lower()}"
    elem = ONNX_TYPES[datatype][0]
    shape = _shape(max_batch_size, ["n"])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        name,
        [helper.make_tensor_value_info("INPUT0", elem, shape)],
        [helper.make_tensor_value_info("OUTPUT0", elem, shape)],
    )
    config = _config(
        name,
        max_batch_size,
        inputs=[("INPUT0", datatype, [-1])],
        outputs=[("OUTPUT0", datatype, [-1])],
        extra=extra_config,
    )
    return _write(repo, name, _model(graph), config, versions)


def add_sub_ensemble(
    repo: PathLike, name: str = "add_sub_ensemble", step_model: str = "add_sub", dims: int = 16
) -> pathlib.Path:
    """An ensemble of two ``add_sub`` steps: (a+b, a-b) then their sum and difference, i.e. OUT_2A = 2a and
    OUT_2B = 2b; a third step, independent of the second, passes a+b through as OUT_SUM."""
    d = pathlib.Path(repo) / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        f'input [ {{ name: "IN_A" data_type: TYPE_FP32 dims: [ {dims} ] }}, '
        f'{{ name: "IN_B" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
        f'output [ {{ name: "OUT_2A" data_type: TYPE_FP32 dims: [ {dims} ] }}, '
        f'{{ name: "OUT_2B" data_type: TYPE_FP32 dims: [ {dims} ] }}, '
        f'{{ name: "OUT_SUM" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
        "ensemble_scheduling { step [\n"
        f'  {{ model_name: "{step_model}" model_version: -1 input_map {{ key: "INPUT0" value: "IN_A" }} '
        'input_map { key: "INPUT1" value: "IN_B" } output_map { key: "OUTPUT0" value: "sum" } '
        'output_map { key: "OUTPUT1" value: "diff" } },\n'
        f'  {{ model_name: "{step_model}" model_version: -1 input_map {{ key: "INPUT0" value: "sum" }} '
        'input_map { key: "INPUT1" value: "diff" } output_map { key: "OUTPUT0" value: "OUT_2A" } '
        'output_map { key: "OUTPUT1" value: "OUT_2B" } },\n'
        f'  {{ model_name: "{step_model}" model_version: -1 input_map {{ key: "INPUT0" value: "sum" }} '
        'input_map { key: "INPUT1" value: "zero" } output_map { key: "OUTPUT0" value: "OUT_SUM" } },\n'
        f'  {{ model_name: "{step_model}" model_version: -1 input_map {{ key: "INPUT0" value: "diff" }} '
        'input_map { key: "INPUT1" value: "diff" } output_map { key: "OUTPUT1" value: "zero" } }\n'
        "] }\n"
    )
    return d


# Tuned on the 2-core AMD EPYC dev VM (onnxruntime 1.31, intra_op_num_threads=1): 9-10 ms
# for one sample at batch 1 (about 0.33 ms a layer), and about 4x the samples/s at batch 64
# (about 160 ms a batch).  Scale ``layers`` to retune on other hardware.
MLP_IN_DIM = 256
MLP_HIDDEN = 2048
MLP_OUT_DIM = 16
MLP_LAYERS = 28


def mlp(
    repo: PathLike,
    name: str = "mlp",
    max_batch_size: int = 64,
    in_dim: int = MLP_IN_DIM,
    hidden: int = MLP_HIDDEN,
    out_dim: int = MLP_OUT_DIM,
    dynamic_batching: bool = False,
    preferred: Sequence[int] | None = None,
    max_queue_delay_us: int | None = None,
    seed: int = 0,
    *,
    layers: int = MLP_LAYERS,
    versions: Sequence[int] = (1,),
    extra_config: str = "",
) -> pathlib.Path:
    """A CPU-heavy FP32 MLP (Gemm+Relu x ``layers``) for batching and scaling benchmarks.

    INPUT0 [in_dim] -> OUTPUT0 [out_dim].  The ``layers - 2`` hidden layers share one
    ``hidden x hidden`` weight matrix: 16 MiB at the default size, so it stays in L3 and
    the file stays small, while each sample still costs ``layers`` matrix products.
    Weights are He-scaled so activations neither vanish nor overflow through the depth.
    Giving ``preferred`` or ``max_queue_delay_us`` turns on dynamic batching.
    """
    if layers < 2:
        raise ValueError(f"mlp needs at least 2 layers, got {layers}")
    rng = np.random.default_rng(seed)

    def dense(n_in: int, n_out: int, tag: str) -> list[onnx.TensorProto]:
        w = (rng.standard_normal((n_out, n_in)) * np.sqrt(2.0 / n_in)).astype(np.float32)
        b = (rng.standard_normal(n_out) * 0.01).astype(np.float32)
        return [numpy_helper.from_array(w, f"W_{tag}"), numpy_helper.from_array(b, f"B_{tag}")]

    inits = dense(in_dim, hidden, "in") + dense(hidden, hidden, "hidden") + dense(hidden, out_dim, "out")
    nodes: list[onnx.NodeProto] = []
    prev = "INPUT0"
    for i in range(layers):
        tag = "in" if i == 0 else "out" if i == layers - 1 else "hidden"
        if i == layers - 1:
            nodes.append(helper.make_node("Gemm", [prev, f"W_{tag}", f"B_{tag}"], ["OUTPUT0"], transB=1))
        else:
            nodes.append(helper.make_node("Gemm", [prev, f"W_{tag}", f"B_{tag}"], [f"gemm{i}"], transB=1))
            nodes.append(helper.make_node("Relu", [f"gemm{i}"], [f"relu{i}"]))
            prev = f"relu{i}"
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, _shape(max_batch_size, [in_dim]))],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, _shape(max_batch_size, [out_dim]))],
        inits,
    )
    if max_batch_size == 0:
        # Gemm wants 2-D operands; without a batch dim, run the single sample as a 1-row batch.
        graph = _unbatched_mlp(graph, in_dim, out_dim)
    config = _config(
        name,
        max_batch_size,
        inputs=[("INPUT0", "FP32", [in_dim])],
        outputs=[("OUTPUT0", "FP32", [out_dim])],
        dynamic_batching=_dynamic_batching(dynamic_batching, preferred, max_queue_delay_us),
        extra=extra_config,
    )
    return _write(repo, name, _model(graph), config, versions)


def no_config_onnx(repo: PathLike, name: str, *, dims: int = 16, versions: Sequence[int] = (1,)) -> pathlib.Path:
    """add_sub (FP32) with no config.pbtxt, to exercise configs generated from the ONNX file.

    The batch dim is symbolic (``batch``), so a generated config should set max_batch_size > 0.
    """
    return _write(repo, name, _add_sub_graph(name, 1, dims, "FP32"), None, versions)


# --- timing -----------------------------------------------------------------------------------


def time_model_ms(model_file: PathLike, feeds: dict[str, np.ndarray], *, iters: int = 50) -> float:
    """Median wall time of one onnxruntime run, single-threaded as a serving replica runs it."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model_file), opts, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, feeds)
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        session.run(None, feeds)
        samples.append(time.perf_counter() - start)
    return float(np.median(samples) * 1e3)


def time_mlp_ms(model_dir: PathLike, batch: int = 1, *, iters: int = 50) -> float:
    """Median single-thread latency of the mlp in ``model_dir`` (version 1) at ``batch``."""
    model_file = pathlib.Path(model_dir) / "1" / "model.onnx"
    graph_input = onnx.load(str(model_file), load_external_data=False).graph.input[0]
    dims = [d.dim_value or 1 for d in graph_input.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).random((batch, dims[-1]), dtype=np.float32)
    if len(dims) == 1:
        x = x[0]
    return time_model_ms(model_file, {"INPUT0": x}, iters=iters)


# --- helpers ----------------------------------------------------------------------------------


def _shape(max_batch_size: int, dims: list[int | str]) -> list[int | str]:
    return ["batch", *dims] if max_batch_size > 0 else dims


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="serve_app.example_models"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _add_sub_graph(name: str, max_batch_size: int, dims: int, dtype: str) -> onnx.ModelProto:
    elem = ONNX_TYPES[dtype][0]
    shape = _shape(max_batch_size, [dims])
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        name,
        [helper.make_tensor_value_info(n, elem, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, elem, shape) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return _model(graph)


def _unbatched_mlp(graph: onnx.GraphProto, in_dim: int, out_dim: int) -> onnx.GraphProto:
    """Wrap the Gemm chain in Reshape [in_dim] -> [1, in_dim] and back to [out_dim]."""
    nodes = list(graph.node)
    nodes[0].input[0] = "input_2d"
    nodes[-1].output[0] = "output_2d"
    reshape_in = helper.make_node("Reshape", ["INPUT0", "shape_in"], ["input_2d"])
    reshape_out = helper.make_node("Reshape", ["output_2d", "shape_out"], ["OUTPUT0"])
    inits = [
        *graph.initializer,
        numpy_helper.from_array(np.array([1, in_dim], np.int64), "shape_in"),
        numpy_helper.from_array(np.array([out_dim], np.int64), "shape_out"),
    ]
    return helper.make_graph(
        [reshape_in, *nodes, reshape_out], graph.name, list(graph.input), list(graph.output), inits
    )


def _dynamic_batching(enabled: bool, preferred: Sequence[int] | None, max_queue_delay_us: int | None) -> str | None:
    if not (enabled or preferred or max_queue_delay_us is not None):
        return None
    lines = []
    if preferred:
        lines.append(f"  preferred_batch_size: [ {', '.join(str(int(p)) for p in preferred)} ]")
    if max_queue_delay_us is not None:
        lines.append(f"  max_queue_delay_microseconds: {int(max_queue_delay_us)}")
    return "dynamic_batching {\n" + "".join(f"{line}\n" for line in lines) + "}"


def _io_block(kind: str, tensors: Iterable[tuple[str, str, list[int]]]) -> str:
    entries = [
        "  {\n"
        f'    name: "{name}"\n'
        f"    data_type: {config_type(datatype)}\n"
        f"    dims: [ {', '.join(str(d) for d in dims)} ]\n"
        "  }"
        for name, datatype, dims in tensors
    ]
    return f"{kind} [\n" + ",\n".join(entries) + "\n]"


def _config(
    name: str,
    max_batch_size: int,
    *,
    inputs: list[tuple[str, str, list[int]]],
    outputs: list[tuple[str, str, list[int]]],
    dynamic_batching: str | None = None,
    extra: str = "",
) -> str:
    parts = [
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nbackend: "onnxruntime"\nmax_batch_size: {max_batch_size}',
        _io_block("input", inputs),
        _io_block("output", outputs),
    ]
    if dynamic_batching:
        parts.append(dynamic_batching)
    if extra:
        parts.append(extra.strip())
    return "\n".join(parts) + "\n"


def _write(
    repo: PathLike, name: str, model: onnx.ModelProto, config: str | None, versions: Sequence[int]
) -> pathlib.Path:
    if not versions:
        raise ValueError("versions must name at least one version")
    model_dir = pathlib.Path(repo) / name
    model_dir.mkdir(parents=True, exist_ok=True)
    blob = model.SerializeToString()
    for version in versions:
        if int(version) < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        version_dir = model_dir / str(int(version))
        version_dir.mkdir(exist_ok=True)
        (version_dir / "model.onnx").write_bytes(blob)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir
