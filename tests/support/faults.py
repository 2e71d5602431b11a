"""Fault injection against a running serve_app started with its own Ray (``start_new_session``).

Used by ``scripts/faults`` (prints figures) and ``tests/e2e/test_faults.py`` (asserts on them).  Each
fault runs under steady load from a few client threads and is measured the same way: requests that
failed (by status), how long until every client succeeded again, and whether Serve replaced the
process.  Processes are found by their Ray title (``ray::ServeReplica:<app>:<deployment>``) within the
server's session, so other Ray clusters on the machine are out of reach.
"""

from __future__ import annotations

import collections
import os
import pathlib
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


def replica_pids(session: int, deployment: str) -> list[int]:
    """Live Serve replica processes of ``deployment`` in the server's session ``session``."""
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, _ppid, _pgrp, sid = stat.rsplit(")", 1)[1].split()[:4]
        if state != "Z" and int(sid) == session and "ServeReplica:" in title and f":{deployment}" in title:
            pids.append(int(entry.name))
    return sorted(pids)


def add_sub_infer(http_url: str, model: str, timeout_s: float = 30.0) -> Callable[[], None]:
    """One add_sub request with its answer checked, as a callable a load thread repeats."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(http_url, network_timeout=timeout_s, connection_timeout=timeout_s)
    a = np.arange(16, dtype=np.float32).reshape(1, 16)

    def call() -> None:
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        out = client.infer(model, inputs).as_numpy("OUTPUT0")
        if not np.array_equal(out, a + a):
            raise AssertionError("wrong answer")

    return call


@dataclass
class Outcome:
    """What the clients saw around one fault."""

    fault: str
    ok: int = 0
    failed: collections.Counter[str] = field(default_factory=collections.Counter)
    slowest_failure_s: float = 0.0  # longest a failed request waited for its error
    recovery_s: float | None = None  # fault → the first moment every client succeeded again
    replaced_s: float | None = None  # fault → a new process of the killed replica was running
    errors: list[str] = field(default_factory=list)

    def row(self) -> str:
        failed = ", ".join(f"{k}: {v}" for k, v in sorted(self.failed.items())) or "none"
        rec = "-" if self.recovery_s is None else f"{self.recovery_s:.1f}"
        rep = "-" if self.replaced_s is None else f"{self.replaced_s:.1f}"
        return f"| {self.fault} | {self.ok} | {failed} | {self.slowest_failure_s:.2f} | {rec} | {rep} |"


HEADER = (
    "| fault | requests ok | failed (by status) | slowest failure s | every client ok again after s | "
    "process replaced after s |\n| --- | --- | --- | --- | --- | --- |"
)


def _status(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    text = status() if callable(status) else None
    if text:
        return str(text)
    name = type(exc).__name__
    return "connection refused" if "Connection" in name or "refused" in str(exc).lower() else name


def under_load(
    fault: str,
    make_call: Callable[[], Callable[[], None]],
    inject: Callable[[], None],
    *,
    clients: int = 3,
    before_s: float = 1.0,
    settle_s: float = 2.0,
    max_s: float = 90.0,
    replaced: Callable[[], bool] | None = None,
) -> Outcome:
    """Run ``clients`` load threads, ``inject`` the fault after ``before_s``, and keep going until every
    client has succeeded again (and ``replaced()`` holds, if given) plus ``settle_s``, or ``max_s``."""
    out = Outcome(fault)
    lock = threading.Lock()
    stop = threading.Event()
    injected_at = [0.0]
    last_fail = [0.0] * clients
    ok_after = [0.0] * clients  # first success after the client's last failure (after the fault)

    def run(i: int) -> None:
        call = make_call()
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                call()
                with lock:
                    out.ok += 1
                    if injected_at[0] and not ok_after[i] and time.monotonic() > injected_at[0]:
                        ok_after[i] = time.monotonic()
            except Exception as exc:
                took = time.monotonic() - t0
                with lock:
                    out.failed[_status(exc)] += 1
                    out.slowest_failure_s = max(out.slowest_failure_s, took)
                    last_fail[i] = time.monotonic()
                    ok_after[i] = 0.0
                    if len(out.errors) < 5:
                        out.errors.append(str(exc)[:300])
                time.sleep(0.05)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(before_s)
    injected_at[0] = time.monotonic()
    with lock:
        for i in range(clients):
            ok_after[i] = 0.0
    inject()
    deadline = injected_at[0] + max_s
    while time.monotonic() < deadline:
        now = time.monotonic()
        if replaced is not None and out.replaced_s is None and replaced():
            out.replaced_s = now - injected_at[0]
        with lock:
            all_ok = all(ok_after)
            if all_ok and out.recovery_s is None:
                # recovered when the last client's first success after its last failure came
                out.recovery_s = max(0.0, max(ok_after) - injected_at[0]) if any(last_fail) else 0.0
        if all_ok and (replaced is None or out.replaced_s is not None):
            time.sleep(settle_s)
            break
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    return out


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    os.kill(pid, sig)
