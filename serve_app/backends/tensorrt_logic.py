"""The TensorRT backend's decisions, as pure functions over plain engine metadata.

Nothing here imports ``tensorrt`` or touches a GPU, so every rule is unit-tested
on any machine: the ``tensorrt`` module (``serve_app.backends.tensorrt``) reads an
engine into an :class:`EngineMetadata` and asks these functions what to do.

* Data types: TensorRT ``DataType`` names (``FLOAT``, ``HALF``, ...) to config
  types and numpy dtypes (:func:`config_type_name`, :func:`numpy_dtype`).
* Optimization profiles: which profiles an instance may use (the instance
  group's ``profile`` field, :func:`instance_profiles`) and which of them serves a
  request's input shapes (:func:`select_profile`: the admissible profile whose
  ``opt`` shapes are nearest, as Triton's GetMostOptimizedProfile).
* Shape tensors: the values an engine's shape-tensor input receives
  (:func:`shape_tensor_values`: the batch size first when the model batches).
* Output shapes: what the engine reports once the inputs are set
  (:func:`output_shape`, :func:`nbytes`).
* Checking a config against the engine at load (:func:`check_config`) and
  completing a config from the engine (:func:`complete_config_from_engine`, the
  counterpart of Triton's tensorrt backend AutoCompleteConfig).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn, cast

import numpy as np
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from serve_app import datatypes
from serve_app.config.pbtxt import config_error
from serve_app.errors import InternalError, InvalidArgument
from serve_app.inference.signature import format_dims
from serve_app.protos import model_config_pb2 as mc

WILDCARD_DIM = -1

# TensorRT DataType member names -> config data types.  FP8, INT4, FP4 and E8M0
# have no Triton data type: an engine tensor of those types can't be served.
TRT_TO_CONFIG: dict[str, str] = {
    "FLOAT": "TYPE_FP32",
    "HALF": "TYPE_FP16",
    "BF16": "TYPE_BF16",
    "INT8": "TYPE_INT8",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
}
CONFIG_TO_TRT: dict[str, str] = {c: t for t, c in TRT_TO_CONFIG.items()}


def trt_dtype_name(dtype: object) -> str:
    """``tensorrt.DataType.FLOAT`` -> ``"FLOAT"`` (pybind11 enums carry ``.name``)."""
    name = getattr(dtype, "name", None)
    if isinstance(name, str) and name:
        return name
    return str(dtype).rsplit(".", 1)[-1]


def config_type_name(trt_name: str) -> str:
    """The config type (``TYPE_FP32``) of a TensorRT type name; ValueError when Triton has none."""
    try:
        return TRT_TO_CONFIG[trt_name]
    except KeyError:
        raise ValueError(f"TensorRT data type {trt_name} has no Triton data type") from None


def numpy_dtype(trt_name: str) -> np.dtype:
    """The numpy dtype that holds a TensorRT type (uint16 storage for BF16, as the datatype table)."""
    return datatypes.from_config(config_type_name(trt_name)).numpy


# --------------------------------------------------------------------------- engine metadata


@dataclass(frozen=True, slots=True)
class ProfileRange:
    """min/opt/max of one input in one optimization profile: dims for an
    execution tensor, values for a shape tensor."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def contains(self, point: Sequence[int]) -> bool:
        if len(point) != len(self.min):
            return False
        return all(lo <= v <= hi for lo, v, hi in zip(self.min, point, self.max, strict=True))

    def distance(self, point: Sequence[int]) -> int:
        """Manhattan distance from ``opt`` (how Triton ranks admissible profiles)."""
        return sum(abs(o - v) for o, v in zip(self.opt, point, strict=True))


@dataclass(frozen=True, slots=True)
class EngineTensor:
    """One I/O tensor of an engine."""

    name: str
    is_input: bool
    dtype: str  # TensorRT DataType name, e.g. "FLOAT"
    shape: tuple[int, ...]  # -1 for a dynamic dimension
    is_shape_tensor: bool = False  # engine.is_shape_inference_io: values live in host memory
    on_host: bool = False  # engine.get_tensor_location is HOST


@dataclass(frozen=True)
class EngineMetadata:
    """What the backend and auto-complete need to know about an engine."""

    tensors: tuple[EngineTensor, ...]
    # profiles[p][input name]: the range of that input in profile p (dims, or values for a shape tensor)
    profiles: tuple[Mapping[str, ProfileRange], ...] = field(default=())

    @property
    def num_profiles(self) -> int:
        return len(self.profiles)

    @property
    def inputs(self) -> tuple[EngineTensor, ...]:
        return tuple(t for t in self.tensors if t.is_input)

    @property
    def outputs(self) -> tuple[EngineTensor, ...]:
        return tuple(t for t in self.tensors if not t.is_input)

    def tensor(self, name: str) -> EngineTensor | None:
        return next((t for t in self.tensors if t.name == name), None)


# --------------------------------------------------------------------------- profiles


def _profile_index(text: str, num_profiles: int, field_name: str) -> int:
    try:
        index = int(text)
    except ValueError:
        index = -1
    if not text.strip().isdigit() or not 0 <= index < num_profiles:
        raise ValueError(
            f"{field_name}: profile '{text}' is not an optimization profile of the TensorRT engine, which has "
            f"{num_profiles} (valid: 0..{num_profiles - 1})"
        )
    return index


def instance_profiles(config: mc.ModelConfig, group_index: int | None, num_profiles: int) -> tuple[int, ...]:
    """The optimization profiles an instance of ``config.instance_group[group_index]`` may use, ascending.

    A group that lists no ``profile`` uses profile 0 only (Triton's default
    context).  With ``group_index`` None (the instance's group is not known), the
    union over all groups.  Raises ValueError naming the field for an index the
    engine does not have.
    """
    if num_profiles < 1:
        raise ValueError("the TensorRT engine has no optimization profile")
    groups = list(enumerate(config.instance_group))
    if group_index is not None:
        groups = [(i, g) for i, g in groups if i == group_index]
    chosen: set[int] = set()
    for i, group in groups:
        if not group.profile:
            chosen.add(0)
        for text in group.profile:
            chosen.add(_profile_index(text, num_profiles, f"instance_group[{i}].profile"))
    return tuple(sorted(chosen or {0}))


def select_profile(
    meta: EngineMetadata,
    allowed: Sequence[int],
    shapes: Mapping[str, Sequence[int]],
    values: Mapping[str, Sequence[int]] | None = None,
    *,
    model: str,
) -> int:
    """The profile among ``allowed`` for a request: every input's shape (and every
    shape tensor's values) within the profile's min..max, nearest to its ``opt``;
    the lowest index on a tie.  InvalidArgument listing why each profile was refused."""
    values = values or {}
    best: int | None = None
    best_distance = 0
    refused: list[str] = []
    for p in allowed:
        ranges = meta.profiles[p]
        distance = 0
        reason = ""
        for what, points in (("shape", shapes), ("values", values)):
            for name, point in points.items():
                r = ranges.get(name)
                if r is None:
                    continue
                if not r.contains(point):
                    reason = (
                        f"input '{name}' {what} {format_dims(point)} is outside "
                        f"{format_dims(r.min)}..{format_dims(r.max)}"
                    )
                    break
                distance += r.distance(point)
            if reason:
                break
        if reason:
            refused.append(f"profile {p}: {reason}")
        elif best is None or distance < best_distance:
            best, best_distance = p, distance
    if best is None:
        raise InvalidArgument(
            f"model '{model}': no optimization profile of this instance (profiles {list(allowed)}) accepts "
            f"the request's inputs: " + "; ".join(refused)
        )
    return best


def engine_can_batch(meta: EngineMetadata) -> bool:
    """Whether the engine has a batch dimension: every execution input and output
    has a dynamic first dimension (and there is at least one execution input)."""
    execution = [t for t in meta.tensors if not t.is_shape_tensor]
    if not any(t.is_input for t in execution):
        return False
    return all(t.shape and t.shape[0] == WILDCARD_DIM for t in execution)


def profile_batch_limit(meta: EngineMetadata, profiles: Iterable[int]) -> int:
    """The largest batch the profiles take, as Triton's GetMaxSupportedBatchSize:
    per profile the smallest ``max[0]`` over the inputs (the first value of a
    shape tensor's max), then the largest over the profiles."""
    best = 0
    for p in profiles:
        limit: int | None = None
        for t in meta.inputs:
            r = meta.profiles[p].get(t.name)
            if r is None or not r.max:
                continue
            limit = r.max[0] if limit is None else min(limit, r.max[0])
        best = max(best, limit or 0)
    return best


# --------------------------------------------------------------------------- per execution


def shape_tensor_values(
    name: str, values: np.ndarray, *, engine_shape: Sequence[int], batch_size: int | None, model: str
) -> np.ndarray:
    """The int64 values to give the engine's shape-tensor input ``name``.

    When the model batches (``batch_size`` not None) the request carries the
    values without the batch (config ``dims`` [k], engine shape [k + 1]) and the
    batch size goes first, as Triton does.  A batch merged by plain concatenation
    (n equal copies) is taken once.
    """
    flat = np.asarray(values).reshape(-1).astype(np.int64, copy=False)
    expected = int(engine_shape[0]) if len(engine_shape) == 1 and engine_shape[0] >= 0 else None
    if batch_size is None:
        if expected is not None and flat.size != expected:
            raise InvalidArgument(f"model '{model}': shape tensor '{name}' needs {expected} values, got {flat.size}")
        return flat
    per_request = None if expected is None else expected - 1
    if per_request is not None and flat.size != per_request:
        copies = flat.size // per_request if per_request > 0 else 0
        chunks = flat.reshape(copies, per_request) if copies and copies * per_request == flat.size else None
        if chunks is None or not (chunks == chunks[0]).all():
            raise InvalidArgument(
                f"model '{model}': shape tensor '{name}' needs {per_request} values (the batch size is added "
                f"first), got {flat.size}"
            )
        flat = chunks[0]
    return np.concatenate([np.array([batch_size], dtype=np.int64), flat])


def output_shape(name: str, reported: Sequence[int] | None, *, model: str) -> tuple[int, ...]:
    """The concrete shape of an output once the inputs are set, from
    ``context.get_tensor_shape``; InternalError for a shape TensorRT can't tell
    before running (data-dependent outputs are not supported)."""
    if reported is None:
        raise InternalError(f"model '{model}': TensorRT reports no shape for output '{name}'")
    shape = tuple(int(d) for d in reported)
    if any(d < 0 for d in shape):
        raise InternalError(
            f"model '{model}': output '{name}' has shape {format_dims(shape)} after the inputs were set: "
            "data-dependent output shapes are not supported"
        )
    return shape


def nbytes(shape: Sequence[int], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


# --------------------------------------------------------------------------- config vs engine


def _config_shape(io: mc.ModelInput | mc.ModelOutput) -> tuple[int, ...]:
    return tuple(io.reshape.shape) if io.HasField("reshape") else tuple(io.dims)


def _fed_inputs(config: mc.ModelConfig) -> set[str]:
    sb = config.sequence_batching
    return {c.name for c in sb.control_input} | {s.input_name for s in sb.state}


def _check_tensor(io: mc.ModelInput | mc.ModelOutput, t: EngineTensor, field_name: str, batching: bool) -> None:
    def fail(detail: str) -> NoReturn:
        raise ValueError(f"{field_name}: {detail}")

    try:
        engine_type = config_type_name(t.dtype)
    except ValueError as exc:
        fail(f"'{t.name}': {exc}")
    config_type = mc.DataType.Name(io.data_type) if io.data_type in mc.DataType.values() else str(io.data_type)
    if config_type != engine_type:
        fail(f"'{t.name}' has data type {config_type} but the TensorRT engine expects {engine_type}")
    if io.is_shape_tensor and not t.is_shape_tensor:
        fail(f"'{t.name}' is incorrectly specified as a shape tensor: the engine's is an execution tensor")
    if t.is_shape_tensor and not io.is_shape_tensor:
        fail(f"'{t.name}' is incorrectly specified as an execution tensor: the engine's is a shape tensor")
    dims = _config_shape(io)
    if t.is_shape_tensor:
        if len(t.shape) > 1:
            fail(f"shape tensor '{t.name}' must be 0-d or 1-d in the engine, which has {format_dims(t.shape)}")
        if len(t.shape) == 1:
            wanted = t.shape[0] - (1 if batching else 0)
            if len(dims) != 1 or dims[0] == WILDCARD_DIM or (t.shape[0] >= 0 and dims[0] != wanted):
                extra = " (the batch size is its first value)" if batching else ""
                fail(
                    f"shape tensor '{t.name}' has engine shape {format_dims(t.shape)}{extra}, "
                    f"so its dims must be [{wanted}]; the configuration has {format_dims(dims)}"
                )
        return
    full = (WILDCARD_DIM, *dims) if batching else dims
    ok = len(full) == len(t.shape) and all(WILDCARD_DIM in (c, e) or c == e for c, e in zip(full, t.shape, strict=True))
    if not ok:
        because = (
            " (an initial batch dimension because max_batch_size > 0, followed by the configured dims)"
            if batching
            else ""
        )
        fail(
            f"the TensorRT engine's '{t.name}' has shape {format_dims(t.shape)} but the configuration "
            f"specifies {format_dims(full)}{because}"
        )


def check_config(config: mc.ModelConfig, meta: EngineMetadata, allowed: Sequence[int]) -> None:
    """Reject, at load, a config that does not describe the engine: names, data
    types, shape-tensor flags, dims (``reshape`` when given) and a max_batch_size
    larger than the instance's profiles take.  Raises ValueError naming the field."""
    batching = config.max_batch_size > 0
    engine_inputs = {t.name: t for t in meta.inputs}
    engine_outputs = {t.name: t for t in meta.outputs}
    sides: tuple[tuple[str, Sequence[mc.ModelInput | mc.ModelOutput], dict[str, EngineTensor]], ...] = (
        ("input", config.input, engine_inputs),
        ("output", config.output, engine_outputs),
    )
    for kind, ios, engine in sides:
        for i, io in enumerate(ios):
            t = engine.get(io.name)
            if t is None:
                allowed_names = ", ".join(sorted(engine)) or "none"
                raise ValueError(
                    f"{kind}[{i}].name: unexpected inference {kind} '{io.name}', allowed {kind}s are: {allowed_names}"
                )
            _check_tensor(io, t, f"{kind}[{i}]", batching)
    given = {io.name for io in config.input} | _fed_inputs(config)
    missing = [n for n in engine_inputs if n not in given]
    if missing:
        raise ValueError(f"input: the TensorRT engine's input(s) {missing} are not in the model configuration")
    if batching:
        limit = profile_batch_limit(meta, allowed)
        if config.max_batch_size > limit:
            raise ValueError(
                f"max_batch_size: configuration specified max-batch {config.max_batch_size} but the TensorRT "
                f"engine's profiles {list(allowed)} only support max-batch {limit}"
            )


# --------------------------------------------------------------------------- auto-complete


def _reference_dims(t: EngineTensor, batching: bool) -> tuple[list[int], bool]:
    """Config dims for engine tensor ``t`` and whether it needs an empty reshape."""
    if t.is_shape_tensor:
        if len(t.shape) == 1:
            return [t.shape[0] - 1 if batching else t.shape[0]], False
        return [1], True
    dims = list(t.shape[1:] if batching else t.shape)
    if not dims:
        return [1], True
    return dims, False


def _batch_hint(config: mc.ModelConfig, meta: EngineMetadata, *, model: str, path: str) -> tuple[bool, int]:
    """Triton's ExtractBatchHintFromIOConfig: (whether configured dims imply a
    batch dimension, how many tensors have configured dims)."""
    says: dict[bool, str] = {}
    shaped = 0
    ios: list[mc.ModelInput | mc.ModelOutput] = [*config.input, *config.output]
    for io in ios:
        dims = _config_shape(io)
        t = meta.tensor(io.name)
        if not dims or t is None:
            continue
        shaped += 1
        rank_with_batch = len(t.shape) == len(dims) + 1
        shape_with_batch = len(t.shape) == 1 and t.shape[0] == dims[0] + 1
        batch = shape_with_batch if t.is_shape_tensor else rank_with_batch
        says.setdefault(batch, io.name)
    if len(says) == 2:
        raise config_error(
            model,
            path,
            f"unable to autofill: the configured dims of '{says[True]}' imply a batch dimension but those of "
            f"'{says[False]}' do not",
        )
    return bool(says.get(True, False)), shaped


def complete_config_from_engine(
    config: mc.ModelConfig, meta: EngineMetadata, *, model: str, path: str
) -> mc.ModelConfig:
    """A completed copy of ``config`` for a TensorRT engine (Triton's tensorrt
    backend auto-complete), to run before ``normalize_config``.

    * ``max_batch_size`` (when 0): the largest batch of the instance groups'
      profiles (profile 0 when none lists any), if every execution tensor's first
      dimension is dynamic; else 0.  Configured dims that leave no room for a
      batch dimension keep it 0.  A configured value above what the engine takes
      is an error.  Above 1 with no scheduler, ``dynamic_batching`` is added.
    * Inputs/outputs: an empty list gets every engine tensor (inputs the sequence
      batcher feeds left out); a listed tensor gets its missing data_type and dims
      (an empty reshape for a tensor that is only the batch dimension) and
      ``is_shape_tensor`` when the engine's is one.  Names the engine lacks are
      left for the load-time check to report.
    """
    out = mc.ModelConfig()
    out.CopyFrom(config)
    try:
        profiles = instance_profiles(out, None, meta.num_profiles)
    except ValueError as exc:
        raise config_error(model, path, f"unable to autofill: {exc}") from None
    hint, shaped = _batch_hint(out, meta, model=model, path=path)
    limit = profile_batch_limit(meta, profiles) if engine_can_batch(meta) else 0
    if hint and limit == 0:
        raise config_error(
            model,
            path,
            "unable to autofill: the configured dims hint at a batch dimension but the TensorRT engine does "
            "not support batching (its first dimensions are not dynamic)",
        )
    if shaped and not hint:
        limit = 0
    if out.max_batch_size == 0:
        out.max_batch_size = limit
    elif out.max_batch_size > limit:
        raise config_error(
            model,
            path,
            f"max_batch_size: configuration specified max-batch {out.max_batch_size} but the TensorRT engine "
            f"only supports max-batch {limit}",
        )
    if out.max_batch_size > 1 and out.WhichOneof("scheduling_choice") is None:
        out.dynamic_batching.SetInParent()

    batching = out.max_batch_size > 0
    fed = _fed_inputs(out)
    sides: tuple[
        tuple[
            str,
            RepeatedCompositeFieldContainer[mc.ModelInput] | RepeatedCompositeFieldContainer[mc.ModelOutput],
            tuple[EngineTensor, ...],
        ],
        ...,
    ] = (("input", out.input, meta.inputs), ("output", out.output, meta.outputs))
    for kind, ios, tensors in sides:
        if not ios:
            for tensor in tensors:
                if kind == "output" or tensor.name not in fed:
                    ios.add(name=tensor.name)
        by_name = {t.name: t for t in tensors}
        listed: Sequence[mc.ModelInput | mc.ModelOutput] = ios
        for i, io in enumerate(listed):
            t = by_name.get(io.name)
            if t is None:
                continue
            if io.data_type == mc.TYPE_INVALID:
                try:
                    # protoc's stubs type the field as the enum class, types-protobuf gives Value() an int
                    io.data_type = cast(mc.DataType, mc.DataType.Value(config_type_name(t.dtype)))
                except ValueError as exc:
                    raise config_error(model, path, f"{kind}[{i}].data_type: '{t.name}': {exc}") from None
            if io.is_shape_tensor and not t.is_shape_tensor:
                raise config_error(
                    model, path, f"{kind}[{i}].is_shape_tensor: '{t.name}' is incorrectly specified as a shape tensor"
                )
            if t.is_shape_tensor:
                io.is_shape_tensor = True
            if not io.dims and not io.HasField("reshape"):
                dims, empty_reshape = _reference_dims(t, batching)
                io.dims.extend(dims)
                if empty_reshape:
                    io.reshape.SetInParent()
    return out
