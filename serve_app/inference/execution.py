"""What crosses the hop to a model instance: whole executions, not requests.

The gateway's scheduler merges the requests of a batch into one
:class:`Execution` (one tensor per input, batch dimension first) before the
hop, so a Ray call carries a few arrays instead of many request objects; the
instance answers with one :class:`ExecutionResult` per execution, with the
timings the statistics extension reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from serve_app.errors import ServeError


@dataclass(slots=True)
class Execution:
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]  # outputs to produce; the union of what the batch's requests asked for
    batch_size: int  # 0 when the model does not batch
    queue_ns: int = 0  # how long its oldest request waited in the gateway's queue


@dataclass(slots=True)
class ExecutionResult:
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    error: ServeError | None = None
    wait_ns: int = 0  # time spent in the instance before the execution started
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
