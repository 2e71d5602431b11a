"""Implicit state (``sequence_batching.state``): kept per slot in the instance that runs the sequence.

The output state a model produces for request *i* of a sequence is fed back as
its input state for request *i+1*.  A START request gets the initial state:
``zero_data`` or ``data_file`` (raw row-major bytes under
``<model>/initial_state/``, confined there as ``serve_app.security.paths``
says) when configured, otherwise zeros with every variable dimension set
to 1 (Triton leaves that buffer uninitialised; zeros are one of its possible
contents).  The state is dropped when the sequence leaves its slot.  It lives
in the instance's process, next to the model.

``TYPE_STRING`` state is an object array of ``bytes``, as BYTES tensors are
everywhere else: its "zeros" are empty strings (Triton zeroes each element's
length), and its ``data_file`` holds the elements as Triton serializes BYTES
(a 4-byte little-endian length before each element's bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from serve_app import datatypes
from serve_app.errors import InvalidArgument, InvalidConfig
from serve_app.protos import model_config_pb2 as mc
from serve_app.runtime.warmup import parse_strings
from serve_app.security.paths import confined

INITIAL_STATE_DIR = "initial_state"


@dataclass(frozen=True, slots=True)
class StateSpec:
    input_name: str
    output_name: str
    initial: np.ndarray  # the state a START request gets (no batch dimension)


def zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeros of ``dtype``; for strings (object arrays), empty ``bytes``."""
    if dtype != np.object_:
        return np.zeros(shape, dtype=dtype)
    arr = np.empty(shape, dtype=object)
    arr.fill(b"")
    return arr


def zeros_like(arr: np.ndarray) -> np.ndarray:
    """:func:`zeros` shaped and typed like ``arr`` (a padding row of a direct batch)."""
    return zeros(arr.shape, arr.dtype)


def _check_initial(model: str, field: str, state: mc.ModelSequenceBatching.State) -> tuple[int, ...]:
    """Triton's checks of ``initial_state`` (its messages, after the model and field); returns its shape."""
    name = state.input_name

    def fail(message: str) -> InvalidConfig:
        return InvalidConfig(f"model '{model}': {field}.initial_state: {message}")

    if len(state.initial_state) > 1:
        raise fail(
            f"initial_state field for state input '{name}' must contain exactly one or zero element. "
            f"Found '{len(state.initial_state)}' elements."
        )
    init = state.initial_state[0]
    if init.data_type != state.data_type:
        raise fail(
            f"The data type used for 'initial_state' field of state '{name}' does not match the state data type."
        )
    if not init.name:
        raise fail(f"Field 'name' must be set when using initial_state for state input '{name}'.")
    if len(init.dims) != len(state.dims):
        raise fail(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input "
            f"'{name}'. {len(init.dims)} != {len(state.dims)}"
        )
    for dim, declared in zip(init.dims, state.dims, strict=True):
        if dim < 0:
            raise fail(f"'initial_state' field for state input name '{name}' contains variable dimensions.")
        if declared >= 0 and dim != declared:
            raise fail(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim description. "
                f"{dim} != {declared}"
            )
    return tuple(int(d) for d in init.dims)


def _initial(model: str, model_dir: Path, index: int, state: mc.ModelSequenceBatching.State) -> np.ndarray:
    field = f"sequence_batching.state[{index}]"
    dtype = np.dtype(datatypes.from_config(mc.DataType.Name(state.data_type)).numpy)
    if not state.initial_state:
        return zeros(tuple(1 if d < 0 else d for d in state.dims), dtype)
    shape = _check_initial(model, field, state)
    init = state.initial_state[0]
    if init.WhichOneof("state_data") == "zero_data":
        return zeros(shape, dtype)
    path = confined(
        model_dir / INITIAL_STATE_DIR,
        init.data_file,
        f"{field}.initial_state[0].data_file",
        root=model_dir,
        within=f"the model's '{INITIAL_STATE_DIR}' directory",
        error=lambda detail: InvalidConfig(f"model '{model}': {detail}"),
    )
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidConfig(
            f"model '{model}': {field}.initial_state[0].data_file: cannot read '{init.data_file}': {exc.strerror}"
        ) from None
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == np.object_:
        try:
            return parse_strings(raw, count, f"data_file '{init.data_file}'").reshape(shape)
        except InvalidArgument as exc:
            raise InvalidConfig(f"model '{model}': {field}.initial_state[0].{exc.message}") from None
    expected = count * dtype.itemsize
    if len(raw) < expected:  # Triton reads the first bytes of a longer file
        raise InvalidConfig(
            f"model '{model}': {field}.initial_state[0].data_file: initial_state setting expects {expected} bytes, "
            f"but the data provided from {init.data_file} only has {len(raw)} bytes."
        )
    return cast(np.ndarray, np.frombuffer(raw[:expected], dtype=dtype).reshape(shape).copy())  # stubs: Any


class ImplicitState:
    def __init__(self, config: mc.ModelConfig, model_dir: Path) -> None:
        self.specs = tuple(
            StateSpec(s.input_name, s.output_name, _initial(config.name, model_dir, i, s))
            for i, s in enumerate(config.sequence_batching.state)
        )
        self.output_names = tuple(s.output_name for s in self.specs)
        self._values: dict[int, dict[str, np.ndarray]] = {}  # slot -> input name -> state (no batch dim)

    def __bool__(self) -> bool:
        return bool(self.specs)

    def row_states(self, slot: int | None, start: bool) -> dict[str, np.ndarray]:
        """The input states of one row: the initial ones at START (or for an empty row), else the slot's."""
        held = None if start or slot is None else self._values.get(slot)
        return {s.input_name: (held[s.input_name] if held else s.initial) for s in self.specs}

    def store(self, slot: int, outputs: dict[str, np.ndarray], row: int | None) -> None:
        """Keep the output states of one row (``row`` in a batch, or None for an unbatched model)."""
        self._values[slot] = {
            s.input_name: outputs[s.output_name] if row is None else outputs[s.output_name][row] for s in self.specs
        }

    def held(self, slot: int) -> dict[str, np.ndarray] | None:
        """The states a slot's sequence holds now (None before its first step)."""
        return self._values.get(slot)

    def put(self, slot: int, states: dict[str, np.ndarray]) -> None:
        """Set a slot's states (a sequence restored from another instance)."""
        self._values[slot] = {s.input_name: states[s.input_name] for s in self.specs}

    def drop(self, slot: int) -> None:
        self._values.pop(slot, None)
