"""The router's copy of each live sequence's implicit state.

Gateways pass on a :class:`~serve_app.sequence.messages.StateBackup` for each
step they answer (see ``config/state_backup.py``); only the latest state (the
highest step number) is kept.  States that come from an instance's snapshot
(after a router restart) may include a step whose answer had not been
delivered: they carry that step's answer, kept here (the last :data:`RECENT`),
so a gateway asking about that step is answered from here instead of running
it twice.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from serve_app.inference.options import CorrId
from serve_app.sequence.messages import StateBackup

RECENT = 4  # answers kept per sequence


@dataclass(slots=True)
class BackupRecord:
    slot_token: int
    states: dict[str, np.ndarray]
    no: int = 0
    recent: deque[tuple[int, dict[str, np.ndarray]]] = field(default_factory=lambda: deque(maxlen=RECENT))


class SequenceBackups:
    def __init__(self) -> None:
        self._records: dict[CorrId, BackupRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, corr_id: object) -> bool:
        return corr_id in self._records

    def store(self, backup: StateBackup) -> None:
        """Keep ``backup`` as the sequence's state (the caller checked that it comes from its owner)."""
        record = self._records.get(backup.corr_id)
        if record is None or record.slot_token != backup.slot_token:
            record = BackupRecord(backup.slot_token, backup.states, backup.no)
            self._records[backup.corr_id] = record
        elif backup.no >= record.no:  # backups of one sequence may arrive out of order through several gateways
            record.states, record.no = backup.states, backup.no
        else:
            return
        repeated = bool(record.recent) and record.recent[-1][0] == backup.step_id  # a full-state resync
        if backup.step_id and backup.outputs is not None and not repeated:
            record.recent.append((backup.step_id, backup.outputs))

    def get(self, corr_id: CorrId) -> BackupRecord | None:
        return self._records.get(corr_id)

    def moved(self, corr_id: CorrId, slot_token: int) -> None:
        """The sequence was restored under a new slot_token: later backups come with it."""
        record = self._records.get(corr_id)
        if record is not None:
            record.slot_token = slot_token

    def drop(self, corr_id: CorrId) -> None:
        self._records.pop(corr_id, None)

    def answer(self, corr_id: CorrId, step_id: int) -> dict[str, np.ndarray] | None:
        """The outputs of step ``step_id`` if it is in the backed-up state (else None: it must run)."""
        record = self._records.get(corr_id)
        if record is None or not step_id:
            return None
        for sid, outputs in record.recent:
            if sid == step_id:
                return outputs
        return None
