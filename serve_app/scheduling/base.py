"""What every scheduler offers the service, the gateway and the metrics (Triton's ``scheduler.h``).

A model version's scheduler takes its validated requests (:meth:`submit`),
counts them (:attr:`stats`) and tells whether it still holds any
(:meth:`drained`), so a replaced version is dropped only once its requests
are answered.  The dynamic batcher (``model_scheduler.py``), the ensemble
scheduler and the sequence batcher's gateway side implement it.
"""

from __future__ import annotations

from typing import Protocol

from serve_app.inference.options import RequestOptions
from serve_app.inference.types import InferRequest, InferResponse
from serve_app.stats import ModelStats


class Scheduler(Protocol):
    stats: ModelStats

    async def submit(self, request: InferRequest, options: RequestOptions, arrival_ns: int) -> InferResponse:
        """Queue a validated request and wait for its response."""
        ...

    def drained(self) -> bool:
        """No request of this scheduler is queued or running."""
        ...
