#!/usr/bin/env python3
"""Inject faults into a real serve_app under load and print what clients saw.

    scripts/faults [--clients 3] [--keep-log]

Starts `python -m serve_app` (its own Ray, free ports, explicit model control) over a temporary
repository holding ``fault_add`` (add_sub, two instances), then, each under steady load from
``--clients`` HTTP client threads: SIGKILLs one model replica, SIGSTOPs one for 5 s (the server runs
with ``--instance-timeout-s 3``), SIGKILLs the gateway, SIGKILLs the sequence router, and SIGKILLs a
replica of ``fault_seq`` (an accumulator with implicit state and state backup, two instances x 4 slots)
while each client steps its own sequences (20 steps each) and checks every running sum.  For each it
prints requests served and failed (by status), the slowest failure, when every client succeeded again
and when Serve had replaced the process; for the sequence fault also sequences completed and broken.
Bounded: each fault gives up after 90 s.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

from scripts import example_models
from tests.support import faults as fi, soak as soak_lib
from tests.support.net import free_port

# The fault tests kill one instance's process: each instance of these models gets its own.
DEDICATED = 'parameters { key: "dedicated_process" value: { string_value: "true" } }\n'
MODEL = "fault_add"
SEQ_MODEL = "fault_seq"
SEQ_LENGTH = 20


class SequenceSteps:
    """Calls for fi.under_load: each call is the next step of this client's sequence, its sum checked."""

    ids = iter(range(1, 1 << 62))
    lock = threading.Lock()
    completed = 0
    broken = 0

    def __init__(self, url: str) -> None:
        import tritonclient.http as httpclient

        self.client = httpclient.InferenceServerClient(url, network_timeout=90)
        self.inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
        self.seq_id, self.step, self.total = 0, 0, 0

    def __call__(self) -> None:
        if self.step == 0:
            with SequenceSteps.lock:
                self.seq_id, self.total = next(SequenceSteps.ids), 0
        value = self.step + 1
        self.inp.set_data_from_numpy(np.full((1, 1), value, np.int32))
        try:
            r = self.client.infer(
                SEQ_MODEL, [self.inp], sequence_id=self.seq_id, sequence_start=self.step == 0,
                sequence_end=self.step == SEQ_LENGTH - 1,
            )  # fmt: skip
        except Exception:
            with SequenceSteps.lock:
                SequenceSteps.broken += 1
            self.step = 0  # start a new sequence
            raise
        self.total += value
        got = int(r.as_numpy("OUTPUT").reshape(-1)[0])
        if got != self.total:
            with SequenceSteps.lock:
                SequenceSteps.broken += 1
            self.step = 0
            raise AssertionError(f"sequence {self.seq_id}: sum {got}, expected {self.total}")
        self.step = (self.step + 1) % SEQ_LENGTH
        if self.step == 0:
            with SequenceSteps.lock:
                SequenceSteps.completed += 1


def start(repo: pathlib.Path, log: pathlib.Path) -> tuple[subprocess.Popen[bytes], str]:
    http = free_port()
    cmd = [sys.executable, "-m", "serve_app", "--model-repository", str(repo), "--host", "127.0.0.1",
           "--http-port", str(http), "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
           "--instance-cpus", "0.5", "--model-control-mode", "explicit", "--load-model", "*",
           "--instance-timeout-s", "3"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"127.0.0.1:{http}"
    deadline = time.monotonic() + 240
    while b"serve_app ready" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    return proc, url


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--keep-log", action="store_true")
    args = ap.parse_args()
    print(fi.HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp) / "repo"
        example_models.add_sub(
            repo, name=MODEL, extra_config="instance_group [ { kind: KIND_CPU count: 2 } ]\n" + DEDICATED
        )
        soak_lib.accumulator(repo, SEQ_MODEL, max_batch_size=4, instances=2, idle_us=30_000_000, parameters=DEDICATED)
        log = pathlib.Path(tmp) / "server.log"
        proc, url = start(repo, log)
        session = proc.pid
        dep = f"{MODEL}.v1.g0"

        class _Rows(list[fi.Outcome]):  # print each fault's row as soon as it is measured
            def append(self, row: fi.Outcome) -> None:
                print(row.row(), flush=True)
                super().append(row)

        rows = _Rows()
        try:
            victim = fi.replica_pids(session, dep)[0]
            rows.append(fi.under_load(
                "model replica SIGKILL", lambda: fi.add_sub_infer(url, MODEL), lambda: fi.kill(victim),
                clients=args.clients,
                replaced=lambda: sorted(fi.replica_pids(session, dep)) not in ([], [victim]) and victim not in
                fi.replica_pids(session, dep) and len(fi.replica_pids(session, dep)) == 2,
            ))  # fmt: skip
            stopped = fi.replica_pids(session, dep)[0]

            def pause() -> None:
                fi.kill(stopped, signal.SIGSTOP)
                time.sleep(5)
                fi.kill(stopped, signal.SIGCONT)

            rows.append(fi.under_load(
                "model replica SIGSTOP 5 s (timeout 3 s)", lambda: fi.add_sub_infer(url, MODEL),
                lambda: threading.Thread(target=pause, daemon=True).start(), clients=args.clients, settle_s=6,
            ))  # fmt: skip
            (gateway,) = fi.replica_pids(session, "gateway")
            rows.append(fi.under_load(
                "gateway SIGKILL", lambda: fi.add_sub_infer(url, MODEL), lambda: fi.kill(gateway),
                clients=args.clients, replaced=lambda: bool(set(fi.replica_pids(session, "gateway")) - {gateway}),
            ))  # fmt: skip
            (router,) = fi.replica_pids(session, "sequence_router")
            rows.append(fi.under_load(
                "sequence router SIGKILL", lambda: fi.add_sub_infer(url, MODEL), lambda: fi.kill(router),
                clients=args.clients,
                replaced=lambda: bool(set(fi.replica_pids(session, "sequence_router")) - {router}),
            ))  # fmt: skip
            seq_dep = f"{SEQ_MODEL}.v1.g0"
            seq_victim = fi.replica_pids(session, seq_dep)[0]
            rows.append(fi.under_load(
                "sequence model replica SIGKILL (state backup)", lambda: SequenceSteps(url),
                lambda: fi.kill(seq_victim), clients=args.clients,
                replaced=lambda: seq_victim not in fi.replica_pids(session, seq_dep)
                and len(fi.replica_pids(session, seq_dep)) == 2,
            ))  # fmt: skip
            print(f"sequences of {SEQ_LENGTH} steps: {SequenceSteps.completed} completed with every sum right, "
                  f"{SequenceSteps.broken} broken", flush=True)  # fmt: skip
            ready = False
            for _ in range(60):  # the last fault's process may still be coming back
                try:
                    with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=10) as r:
                        ready = r.status == 200
                        break
                except OSError:
                    time.sleep(1)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            if args.keep_log:
                print(log.read_text()[-5000:])
        print(f"server ready after all faults: {ready}; exit code {proc.returncode}")
        bad = [r for r in rows if set(r.failed) & {"500", "StatusCode.INTERNAL"}]
        return 1 if bad or not ready or SequenceSteps.broken else 0


if __name__ == "__main__":
    sys.exit(main())
