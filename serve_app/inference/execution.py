"""What crosses the hop to a model instance: whole executions, not requests.

The gateway's scheduler merges the requests of a batch into one
:class:`Execution` (one tensor per input, batch dimension first) before the
hop, so a Ray call carries a few arrays instead of many request objects; the
instance answers with one :class:`ExecutionResult` per execution, with the
timings the statistics extension reports.

Backends that take the requests of a batch one by one (the Python backend,
as Triton hands its ``execute`` a list of requests) also get each request's
part of it (:class:`RequestPart`: its rows, outputs, parameters, sequence
flags) and answer each request on its own (:class:`PartResult`), so one
request's error or output shape doesn't touch the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from serve_app.errors import ServeError
from serve_app.inference.cancel import CancelSignal
from serve_app.inference.custom_metrics import Snapshot
from serve_app.inference.types import ParamValue
from serve_app.observability.trace_settings import TraceLink

CorrelationId = int | str
# The request index of the item a decoupled execution's stream yields once the model's ``execute`` has
# returned (its responses may go on from threads): from then on, the instance takes the next batch.
EXECUTED = -1
FLAG_START, FLAG_END = 1, 2  # Triton's TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END


@dataclass(frozen=True, slots=True)
class RequestPart:
    """One request of an execution: ``rows`` of the merged inputs (1 when the model does not batch)."""

    rows: int
    outputs: tuple[str, ...]  # the outputs it asked for (all of the model's when it named none)
    id: str = ""
    parameters: dict[str, ParamValue] = field(default_factory=dict)  # without the reserved ones
    correlation_id: CorrelationId = 0
    flags: int = 0  # Triton's TRITONSERVER_REQUEST_FLAG_SEQUENCE_START (1) | _END (2)
    timeout_us: int = 0
    inputs: dict[str, np.ndarray] | None = None  # its own tensors (None: its rows of the execution's inputs)
    cancel: CancelSignal | None = field(default=None, compare=False)  # fired: the model sees it cancelled


@dataclass(slots=True)
class PartResult:
    """One request's answer in an execution that answers requests one by one."""

    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    error: ServeError | None = None
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    # A decoupled model's responses come one by one: the last one carries ``final``; a final with ``empty``
    # is the flag alone (no response), and carries the time from the execution's start to it.
    final: bool = True
    empty: bool = False
    compute_ns: int = 0
    custom_metrics: Snapshot | None = None  # on a final one: the process's custom metrics, for the gateway


@dataclass(slots=True)
class Execution:
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]  # outputs to produce; the union of what the batch's requests asked for
    batch_size: int  # 0 when the model does not batch
    queue_ns: int = 0  # how long its oldest request waited in the gateway's queue
    parts: tuple[RequestPart, ...] = ()  # each request's share, for backends that answer them one by one
    traces: tuple[TraceLink, ...] = ()  # its traced requests' model spans: the instance records a compute span each


@dataclass(slots=True)
class ExecutionResult:
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    error: ServeError | None = None
    wait_ns: int = 0  # time spent in the instance before the execution started
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    parts: list[PartResult] | None = None  # one per ``Execution.parts``, when the backend answers them one by one
    # The instance process's custom metrics (a Python model's MetricFamily), carried to the gateway
    custom_metrics: Snapshot | None = None
