"""A model's tensor signature, resolved once from its ModelConfig at load time.

Request validation, metadata and the raw binary request all need names,
datatypes and shapes; reading them from protobuf on every request would be slow
and repetitive, so :meth:`ModelSignature.from_config` turns the config into
plain frozen dataclasses with datatypes already looked up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from serve_app import datatypes
from serve_app.datatypes import DataType
from serve_app.errors import InvalidArgument, InvalidConfig
from serve_app.protos import model_config_pb2 as mc

WILDCARD_DIM = -1
INT_ONLY: frozenset[type] = frozenset({int})  # exactly int: a bool (JSON's true) or a float is not a dimension


def all_ints(values: Iterable[object]) -> bool:
    """Every element is exactly an ``int``, checked in C: shapes and integer data arrive on every request."""
    return INT_ONLY.issuperset(map(type, values))


def format_dims(dims: Sequence[int]) -> str:
    """Triton's way of printing a shape: ``[-1,16]`` (no spaces)."""
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output as configured.  ``dims`` excludes the batch dimension."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    optional: bool = False
    is_shape_tensor: bool = False

    @property
    def wire_datatype(self) -> str:
        """The v2 protocol name, e.g. ``FP32`` (``BYTES`` for TYPE_STRING)."""
        return self.datatype.wire_name

    def full_dims(self, max_batch_size: int) -> tuple[int, ...]:
        """The shape a client sends: ``[-1] + dims`` when the model batches."""
        if max_batch_size > 0:
            return (WILDCARD_DIM, *self.dims)
        return self.dims

    def full_shape(self, max_batch_size: int) -> list[int]:
        """``full_dims`` as a list, the form model metadata reports."""
        return list(self.full_dims(max_batch_size))

    def matches(self, dims: Sequence[int]) -> bool:
        """Whether ``dims`` (batch dimension already removed) fits ``self.dims``."""
        if dims == self.dims:  # the usual case: a tuple equal to a shape without wildcards
            return True
        if len(dims) != len(self.dims):
            return False
        return all(c in (WILDCARD_DIM, d) for c, d in zip(self.dims, dims, strict=True))


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """Inputs and outputs of one model version, in config order."""

    name: str
    version: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    required_inputs: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.required_inputs:
            req = tuple(n for n, s in self.inputs.items() if not s.optional)
            object.__setattr__(self, "required_inputs", req)

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    def full_dims(self, spec: TensorSpec) -> tuple[int, ...]:
        """Client-facing shape of ``spec`` (with ``-1`` batch dim when batching)."""
        return spec.full_dims(self.max_batch_size)

    def full_shape(self, spec: TensorSpec) -> list[int]:
        """``full_dims`` as a list, e.g. ``[-1, 16]`` for model metadata."""
        return spec.full_shape(self.max_batch_size)

    def format_full_dims(self, spec: TensorSpec) -> str:
        """``full_dims`` printed like Triton, e.g. ``[-1,16]``."""
        return format_dims(self.full_dims(spec))

    @classmethod
    def from_config(cls, config: mc.ModelConfig, version: str) -> ModelSignature:
        """Resolve names, datatypes, dims and reshapes of ``config`` once."""
        inputs = {t.name: _spec(config.name, "input", i, t, t.optional) for i, t in enumerate(config.input)}
        outputs = {t.name: _spec(config.name, "output", i, t, False) for i, t in enumerate(config.output)}
        return cls(
            name=config.name,
            version=str(version),
            max_batch_size=int(config.max_batch_size),
            inputs=inputs,
            outputs=outputs,
        )


def _spec(model: str, kind: str, index: int, t: mc.ModelInput | mc.ModelOutput, optional: bool) -> TensorSpec:
    type_name = mc.DataType.Name(t.data_type) if t.data_type in mc.DataType.values() else str(t.data_type)
    try:
        dt = datatypes.from_config(type_name)
    except InvalidArgument:
        raise InvalidConfig(
            f"model '{model}': {kind} '{t.name}' ({kind}[{index}].data_type) has unsupported data type '{type_name}'"
        ) from None
    reshape = tuple(int(d) for d in t.reshape.shape) if t.HasField("reshape") else None
    return TensorSpec(
        name=t.name,
        datatype=dt,
        dims=tuple(int(d) for d in t.dims),
        reshape=reshape,
        optional=bool(optional),
        is_shape_tensor=bool(t.is_shape_tensor),
    )
