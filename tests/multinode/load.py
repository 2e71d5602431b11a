"""Steady load through some gateways while a fault happens: every request's outcome and when it ended."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from tritonclient.utils import InferenceServerException

from tests.multinode import clients


@dataclass
class Outcome:
    ended: float  # time.monotonic()
    took_s: float
    error: str | None  # the status of a failed request (gRPC code name), None when it succeeded
    message: str = ""


@dataclass
class Load:
    """``per_gateway`` threads per address, each sending add_sub (or asking ``where`` a where_* model runs)
    over gRPC, one request after another."""

    addresses: list[str]
    per_gateway: int = 2
    where: str = ""
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(a,), daemon=True)
            for a in self.addresses
            for _ in range(self.per_gateway)
        ]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=clients.TIMEOUT_S + 10)

    def _run(self, address: str) -> None:
        client = clients.grpc(address)
        while not self._stop.is_set():
            t0 = time.monotonic()
            error, message = None, ""
            try:
                if self.where:
                    clients.where(client, self.where)
                else:
                    clients.add_sub(client)
            except InferenceServerException as exc:
                error, message = str(exc.status()), str(exc.message())
            except Exception as exc:
                error, message = type(exc).__name__, str(exc)
            now = time.monotonic()
            with self._lock:
                self.outcomes.append(Outcome(now, now - t0, error, message))
            if error is not None:
                time.sleep(0.05)

    def since(self, t: float) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.ended >= t]

    def settle(self, t: float, quiet_s: float, timeout_s: float) -> float:
        """Wait until the last ``quiet_s`` seconds had successes and no failure (after ``t``); the time that
        took from ``t``, or the timeout when it never settled."""
        deadline = t + timeout_s
        while time.monotonic() < deadline:
            now = time.monotonic()
            recent = self.since(now - quiet_s)
            if now - t >= quiet_s and recent and all(o.error is None for o in recent):
                failures = [o.ended for o in self.since(t) if o.error is not None]
                return (max(failures) if failures else t) - t
            time.sleep(0.5)
        return timeout_s
