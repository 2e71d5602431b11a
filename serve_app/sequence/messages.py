"""What crosses between gateways, the sequence router and sequence instances: plain, picklable data.

A :class:`SequenceStep` is one request of a sequence on its way to its
instance and slot; a :class:`StepResult` is what comes back.  The other
messages are the router's vocabulary: assignments, slot events, state
backups and restores.  Each crosses a direct channel as one pickle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from serve_app.errors import ServeError
from serve_app.inference.options import CorrId
from serve_app.inference.types import ParamValue


@dataclass(frozen=True, slots=True)
class Assignment:
    """Where a sequence lives: an instance (by id and channel address) and a slot in it.

    ``slot_token`` is drawn anew each time a slot is given to a sequence, so an
    instance can tell a current owner from a stale one with the same ID.
    """

    instance: str
    address: tuple[str, int]
    slot: int
    slot_token: int


@dataclass(slots=True)
class SequenceStep:
    """One request of a sequence, validated in the gateway, for the instance that holds the sequence."""

    corr_id: CorrId
    slot: int
    slot_token: int
    start: bool
    end: bool
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]  # what the client wants back (state outputs are added by the instance)
    batch_size: int  # 1, or 0 when the model does not batch
    step_id: int = 0  # drawn by the gateway: tells, after a crash, whether the state backed up includes this step
    instance: str = ""  # the instance that holds the sequence (a host holds several)
    request_id: str = ""
    parameters: dict[str, ParamValue] = field(default_factory=dict)  # the request's own (backends that read them)


@dataclass(slots=True)
class StepResult:
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    error: ServeError | None = None
    not_here: bool = False  # the instance does not hold this sequence in that slot (a stale assignment)
    queue_ns: int = 0  # in the instance, from arrival to the start of its execution
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    execution_batch: int = 0  # >0 on one step of each execution: the execution's size, for batch statistics
    backup: StateBackup | None = None  # the sequence's state after this step, for the gateway to pass on


# What the requests of a backlogged sequence get when their timeout ends its wait (Triton's text).
BACKLOG_TIMEOUT = "timeout of the corresponding sequence has been expired"


# Messages to the sequence router (gateway -> router) and to instances (router -> instance).
@dataclass(frozen=True, slots=True)
class AssignRequest:
    """START: a slot for the sequence (the one it holds if active); waits in the backlog when all are taken,
    for at most ``timeout_us`` (the request's ``timeout``; 0: no limit)."""

    model: str  # "<name>:<version>"
    corr_id: CorrId
    timeout_us: int = 0


@dataclass(frozen=True, slots=True)
class LookupRequest:
    """A step whose gateway does not know the sequence's place: where is it (waits while backlogged, the
    backlog's wait then ending after ``timeout_us`` at the latest)?"""

    model: str
    corr_id: CorrId
    timeout_us: int = 0


@dataclass(frozen=True, slots=True)
class BacklogDeadline:
    """Gateway to router, one way: a step held behind its sequence's START, which waits in the backlog, carries
    a ``timeout``: the sequence's wait ends after ``timeout_us`` at the latest (Triton's backlog timeout)."""

    model: str
    corr_id: CorrId
    timeout_us: int


@dataclass(frozen=True, slots=True)
class PollEvents:
    """Router to instance: report slots released since the last poll (``snapshot``: every occupied slot,
    with its state when backed up)."""

    snapshot: bool = False
    wait_s: float = 1.0
    instance: str = ""  # the instance asked (a host holds several)


@dataclass(frozen=True, slots=True)
class SlotEvent:
    slot: int
    corr_id: CorrId
    slot_token: int


@dataclass(frozen=True, slots=True)
class InstanceEvents:
    instance: str
    released: tuple[SlotEvent, ...] = ()
    occupied: tuple[SlotEvent, ...] = ()  # with a snapshot
    draining: bool = False  # the instance is stopping: no new sequences
    backups: tuple[StateBackup, ...] = ()  # with a snapshot: the state of every occupied slot


@dataclass(frozen=True, slots=True)
class StateBackup:
    """The implicit state of one sequence after its ``no``-th step, for the router (see
    ``config/state_backup.py``).  ``step_id`` and ``outputs``: that step and its answer, sent only in a
    snapshot (a step that ran but whose answer may not have been delivered)."""

    corr_id: CorrId
    slot: int
    slot_token: int
    states: dict[str, np.ndarray]
    instance: str = ""
    no: int = 0
    step_id: int = 0
    outputs: dict[str, np.ndarray] | None = None


@dataclass(frozen=True, slots=True)
class StateBackups:
    """Gateway to router: the states of sequences after steps the gateway has just answered."""

    model: str
    backups: tuple[StateBackup, ...]


@dataclass(frozen=True, slots=True)
class RestoreSequence:
    """Router to instance: hold this sequence in this (free) slot, with this state, from now on."""

    slot: int
    corr_id: CorrId
    slot_token: int
    states: dict[str, np.ndarray]
    no: int = 0  # the steps the sequence has run: the next backup is numbered after them
    instance: str = ""  # the instance that takes it (a host holds several)


@dataclass(frozen=True, slots=True)
class RecoverRequest:
    """Gateway to router: a step of this sequence failed with its instance; where does it go on, and
    does the state there include the step (``step_id``)?"""

    model: str
    corr_id: CorrId
    failed_instance: str
    step_id: int


@dataclass(frozen=True, slots=True)
class Recovery:
    """Where the sequence now lives; ``outputs``: the failed step had been executed and backed up, and
    this was its answer (don't run it again)."""

    assignment: Assignment
    outputs: dict[str, np.ndarray] | None = None
    no: int = 0  # the step number of the restored state (the gateway checks it against its last answer)
