"""The control tensors the sequence batcher feeds a model: START, END, READY and CORRID.

Each is declared in ``sequence_batching.control_input``, not in the model's
inputs; the batcher fills one element per batch row (shape ``[rows, 1]`` when
the model batches, ``[1]`` when it does not).  Boolean controls take the
configured false/true values (``int32_false_true``, ``fp32_false_true`` or
``bool_false_true``); CORRID carries the correlation ID in its ``data_type``
(32-bit types keep the low 32 bits, as Triton does).  A row with no request
(an empty direct slot) has READY, START and END false and CORRID 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from serve_app.errors import InvalidArgument
from serve_app.inference.options import CorrId
from serve_app.protos import model_config_pb2 as mc

Kind = mc.ModelSequenceBatching.Control.Kind
START, READY, END, CORRID = (
    Kind.CONTROL_SEQUENCE_START,
    Kind.CONTROL_SEQUENCE_READY,
    Kind.CONTROL_SEQUENCE_END,
    Kind.CONTROL_SEQUENCE_CORRID,
)

_CORRID_DTYPES: dict[int, type] = {
    mc.TYPE_UINT64: np.uint64,
    mc.TYPE_INT64: np.int64,
    mc.TYPE_UINT32: np.uint32,
    mc.TYPE_INT32: np.int32,
    mc.TYPE_STRING: np.object_,
}


@dataclass(frozen=True, slots=True)
class RowControl:
    """What one batch row tells the model."""

    start: bool = False
    end: bool = False
    ready: bool = False
    corr_id: CorrId = 0


@dataclass(frozen=True, slots=True)
class _BoolControl:
    name: str
    kind: int
    false: np.ndarray  # 0-d, of the control's dtype
    true: np.ndarray


def _bool_control(name: str, control: mc.ModelSequenceBatching.Control) -> _BoolControl:
    if control.int32_false_true:
        values = np.array(control.int32_false_true, dtype=np.int32)
    elif control.fp32_false_true:
        values = np.array(control.fp32_false_true, dtype=np.float32)
    else:
        values = np.array(control.bool_false_true, dtype=np.bool_)
    return _BoolControl(name, control.kind, values[0], values[1])


class SequenceControls:
    def __init__(self, model_name: str, bools: Sequence[_BoolControl], corrid: tuple[str, int] | None) -> None:
        self.model_name = model_name
        self._bools = tuple(bools)
        self._corrid = corrid  # (tensor name, config data type)

    @classmethod
    def from_model_config(cls, config: mc.ModelConfig) -> SequenceControls:
        bools: list[_BoolControl] = []
        corrid: tuple[str, int] | None = None
        for control_input in config.sequence_batching.control_input:
            for control in control_input.control:
                if control.kind == CORRID:
                    corrid = (control_input.name, control.data_type)
                else:
                    bools.append(_bool_control(control_input.name, control))
        return cls(config.name, bools, corrid)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self._bools) + ((self._corrid[0],) if self._corrid else ())

    def check_corr_id(self, corr_id: CorrId) -> None:
        """A string ID can't feed a numeric CORRID control: reject it before it is queued."""
        if self._corrid is not None and isinstance(corr_id, str) and self._corrid[1] != mc.TYPE_STRING:
            raise InvalidArgument(
                f"sequence batching control '{self._corrid[0]}' of model '{self.model_name}' expects a "
                f"{mc.DataType.Name(self._corrid[1])} correlation ID, got the string '{corr_id}'"
            )

    def tensors(self, rows: Sequence[RowControl], batched: bool) -> dict[str, np.ndarray]:
        """One tensor per control for these rows."""
        shape = (len(rows), 1) if batched else (1,)
        out: dict[str, np.ndarray] = {}
        for b in self._bools:
            if b.kind == START:
                flags = [r.start and r.ready for r in rows]
            elif b.kind == END:
                flags = [r.end and r.ready for r in rows]
            else:
                flags = [r.ready for r in rows]
            out[b.name] = np.array([b.true if f else b.false for f in flags], dtype=b.true.dtype).reshape(shape)
        if self._corrid is not None:
            name, data_type = self._corrid
            out[name] = _corr_ids([r.corr_id if r.ready else 0 for r in rows], data_type).reshape(shape)
        return out


def _corr_ids(ids: list[CorrId], data_type: int) -> np.ndarray:
    if data_type == mc.TYPE_STRING:
        return np.array([str(i).encode() if i != 0 else b"" for i in ids], dtype=np.object_)
    wide = np.array([int(i) & 0xFFFFFFFFFFFFFFFF for i in ids], dtype=np.uint64)
    if data_type == mc.TYPE_UINT64:
        return wide
    if data_type == mc.TYPE_INT64:
        return wide.view(np.int64)
    low = cast(np.ndarray, (wide & np.uint64(0xFFFFFFFF)).astype(np.uint32))  # numpy's stubs: Any for array & scalar
    return low if data_type == mc.TYPE_UINT32 else low.view(np.int32)
