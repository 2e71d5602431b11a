"""Which sequence models keep their implicit state outside their instances, so sequences survive a crash.

For a model whose state is implicit (``sequence_batching.state``), each answer
an instance sends carries the sequence's state after that step, and the
gateway passes it on to the sequence router before the answer leaves (no step
waits for the router).  When an instance dies, the router places each of its
sequences in a free slot of another instance (of a replacement, if no other
has one) with the last state it received, and gateways send the next steps
there.  The guarantee:

- the restored state is the one after the last step whose answer a gateway
  received; a step in flight when the instance died is sent again on it, so
  the client sees it succeed and no step is applied twice or skipped;
- after a router restart the states come from the instances' snapshots, which
  may include a step whose answer was on its way: that step's answer comes
  with it, and is returned instead of running the step again;
- a step that ends a sequence is not backed up (the sequence leaves its slot);
- a sequence with no backup yet (its START was in flight) starts again; one
  for which no slot frees within the restore wait ends with the "was lost"
  error.

It is on by default (``auto``) when the declared state of one sequence is at
most 64 KiB (variable dimensions counted as 1): the router holds one state
per live sequence, and every answer carries one.  The config parameter
``sequence_state_backup`` (``true``/``false``/``auto``) decides otherwise.
Models that keep state inside the model (no implicit state) can't be backed
up: their sequences end with the "was lost" error when their instance dies.
"""

from __future__ import annotations

import numpy as np

from serve_app import datatypes
from serve_app.config.pbtxt import config_error
from serve_app.protos import model_config_pb2 as mc

PARAMETER = "sequence_state_backup"
AUTO_MAX_BYTES = 64 << 10
_VALUES = ("auto", "true", "false")


def declared_state_bytes(config: mc.ModelConfig) -> int:
    """Bytes of implicit state per sequence as declared (variable dimensions counted as 1)."""
    total = 0
    for state in config.sequence_batching.state:
        dtype = datatypes.from_config(mc.DataType.Name(state.data_type)).numpy
        count = int(np.prod([max(1, d) for d in state.dims], dtype=np.int64))
        total += count * max(1, np.dtype(dtype).itemsize)
    return total


def state_backup_enabled(config: mc.ModelConfig, *, path: str = "config.pbtxt") -> bool:
    """Whether the model's sequences are backed up; a bad parameter raises ``InvalidConfig``."""
    param = config.parameters.get(PARAMETER)
    value = "auto" if param is None else param.string_value.strip().lower()
    if value not in _VALUES:
        raise config_error(
            config.name, path, f"parameters: '{PARAMETER}' must be one of {', '.join(_VALUES)} (got {value!r})"
        )
    if param is not None and not config.HasField("sequence_batching"):
        raise config_error(config.name, path, f"parameters: '{PARAMETER}' needs sequence_batching")
    stateful = bool(config.sequence_batching.state)
    if value == "true" and not stateful:
        raise config_error(
            config.name,
            path,
            f"parameters: '{PARAMETER}' is true but the model has no implicit state (sequence_batching.state); "
            "state kept inside the model can't be backed up",
        )
    if value == "false" or not stateful:
        return False
    return value == "true" or declared_state_bytes(config) <= AUTO_MAX_BYTES
