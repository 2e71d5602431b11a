#!/usr/bin/env python3
"""Soak serve_app: a mix of models and sequences at ~70% of measured capacity; errors, p99 drift, RSS growth.

    scripts/soak [--duration-s 600] [--interval-s 30] [--load 0.7] [--calibration-s 10]
                 [--clients 32] [--calibration-clients 16] [--sequences 12] [--seed 0] [--server-arg=...]
    scripts/soak --http HOST:PORT --grpc HOST:PORT [--session SID] ...   # soak a running server

By default it builds a temporary repository (add_sub, identity_fp32, a small batched mlp and
``seq_accum``, a 2-instance x 8-slot running-sum accumulator with implicit state) and starts
`python -m serve_app` on free ports in a session of its own.  With ``--http/--grpc`` it soaks a running
server instead: it needs ``add_sub`` READY, and also uses ``identity_fp32``, ``mlp`` and any READY
accumulator-like sequence model (INPUT/OUTPUT INT32 [1], implicit state INPUT_STATE -> OUTPUT_STATE, no
control inputs: e.g. tests/e2e/sequence_models.py ``seq_accum``) it finds.  Its RSS figures cover the
session of the local process listening on the HTTP port (all of serve_app's own Ray when it started Ray;
``--session`` overrides, and a remote server gets none).

1. Calibration: ``--calibration-clients`` threads send the mix back to back; after a warm-up of a fifth of
   ``--calibration-s``, the completions per second over ``--calibration-s`` are the capacity.
2. Soak: tickets are scheduled open-loop at ``--load`` x capacity (ticket i is due at t0 + i/rate,
   whatever the answers do) and taken by a pool of ``--clients`` threads; each ticket is one request of
   the mix: unary HTTP (add_sub, identity_fp32), unary gRPC (add_sub, mlp) or one step of one of
   ``--sequences`` live sequences over gRPC (random length 5-50, START/END, every answer checked against
   the running sum).  Any exception, non-2xx or wrong answer is an error.
3. Every ``--interval-s`` one line: elapsed, ok/errors, achieved rate, p50/p99 per kind, the p99 of how
   late tickets started (client lag), and RSS per process group of the server's session.
4. Summary: totals, errors by op and status, p99 first vs last interval, RSS first vs last per group.
5. With ``--abuse N``: N cases of abuse over sockets (``tests/support/fuzz/sockets.py``: bad request heads,
   oversized, nested and empty-object bodies up to 16 MiB, gRPC messages over the limit or of empty inputs,
   HTTP/2 garbage), each to be answered as its limit says and never with a 5xx; the server's processes'
   RSS, ``--settle-s`` after the last, must be back within 5% of before.
   Exit 1 on any error, a server not ready at the end, memory not back after the abuse, or (own server) an
   unclean shutdown.

Bounded: everything, server start and stop included, ends within duration + calibration + 120 s (and
0.1 s per abuse case and the settle time).  Ctrl-C or
SIGTERM ends the soak early with its summary and the server stopped (exit 1); a second one aborts.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from serve_app.limits import DEFAULT_LIMITS
from tests.support import soak as sl
from tests.support.fuzz import sockets
from tests.support.net import free_port

# Set by the first SIGINT/SIGTERM: the soak ends early, still with its summary and a clean server stop.
EARLY = threading.Event()


class Server:
    """A `python -m serve_app` in a session of its own, so that every Ray process it starts is found and stopped."""

    def __init__(self, repo: pathlib.Path, log: pathlib.Path, extra: list[str]) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "serve_app", "--model-repository", str(repo), "--host", "127.0.0.1",
               "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
               "--metrics-port", str(free_port()), "--instance-cpus", "0.5", *extra]  # fmt: skip
        self.log = log
        with log.open("wb") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def sid(self) -> int:
        return self.proc.pid

    def wait_ready(self, deadline: float) -> None:
        while b"serve_app ready" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline or EARLY.is_set():
                raise SystemExit(f"server did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def stop(self, timeout: float) -> tuple[int | None, float, list[sl.ProcInfo]]:
        """SIGTERM, wait; SIGKILL what is left of the session.  Returns exit code, seconds, leftovers."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            self.kill()
        took = time.monotonic() - t0
        end = time.monotonic() + 10  # Ray's daemons exit just after the CLI
        while (left := sl.session_processes(self.sid)) and time.monotonic() < end:
            time.sleep(0.5)
        if left:
            self.kill()
        return self.proc.returncode, took, left

    def kill(self) -> None:
        for p in sl.session_processes(self.sid):  # only processes of the session this script started
            try:
                os.kill(p.pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait(timeout=30)


class Driver:
    """The client side: worker threads that take tickets (open loop) or just loop (calibration)."""

    def __init__(self, http: str, grpc: str, served: sl.Served, ops: list[sl.Op], args: argparse.Namespace) -> None:
        self.http, self.grpc, self.served, self.ops = http, grpc, served, ops
        self.weights = [op.weight for op in ops]
        self.seed = args.seed
        self.rng = random.Random(args.seed)
        self.lock = threading.Lock()
        self.rec = sl.Recorder()
        self.seqs = sl.SequencePool(args.sequences if served.seq_model else 0, random.Random(args.seed + 1))
        self.mlp_ref = sl.MlpReference()
        self.stop = threading.Event()
        self.ticket = 0
        self._threads: list[threading.Thread] = []
        self._n = 0

    def start(self, threads: int, until: float, rate: float | None = None) -> None:
        """``rate`` None: closed loop until ``until``; else ticket i is due at now + i / rate."""
        t0 = time.monotonic()
        self.ticket = 0
        self._threads = []
        for _ in range(threads):
            self._n += 1
            t = threading.Thread(target=self._work, args=(self._n, until, rate, t0), daemon=True)
            t.start()
            self._threads.append(t)

    def join(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.0, end - time.monotonic()))

    def _work(self, idx: int, until: float, rate: float | None, t0: float) -> None:
        client = sl.Client(self.http, self.grpc, self.served, random.Random(self.seed * 7919 + idx))
        try:
            while not self.stop.is_set():
                with self.lock:
                    i = self.ticket
                    self.ticket += 1
                    op = self.rng.choices(self.ops, self.weights)[0]
                due = None
                if rate is None:
                    if time.monotonic() >= until:
                        return
                else:
                    due = t0 + i / rate
                    if due >= until:
                        return
                    if self.stop.wait(max(0.0, due - time.monotonic())):
                        return
                self.one(client, op, due)
        finally:
            client.close()

    def one(self, client: sl.Client, op: sl.Op, due: float | None) -> None:
        seq = None
        if op.kind == sl.SEQ:
            while seq is None:
                if self.stop.is_set():
                    return
                seq = self.seqs.take(timeout=0.5)
        t = time.monotonic()
        lag = None if due is None else t - due
        try:
            if seq is not None:
                client.seq_step(seq)
            else:
                client.call(op.name, self.mlp_ref)
        except Exception as exc:
            self.rec.record(op, time.monotonic() - t, sl.status_of(exc), lag, str(exc))
            if seq is not None:
                client.abandon(seq)
                self.seqs.give_back(seq, ended=True, broken=True)
            return
        self.rec.record(op, time.monotonic() - t, None, lag)
        if seq is not None:
            self.seqs.give_back(seq, ended=seq.step >= seq.length, broken=False)

    def finish_sequences(self) -> None:
        """END every live sequence with one last checked step, so none is left to the idle timeout."""
        client = sl.Client(self.http, self.grpc, self.served, random.Random(self.seed))
        op = next(o for o in self.ops if o.kind == sl.SEQ)
        try:
            for seq in self.seqs.drain():
                if seq.step == 0:
                    continue
                seq.length = seq.step + 1
                self.one_seq_end(client, op, seq)
        finally:
            client.close()

    def one_seq_end(self, client: sl.Client, op: sl.Op, seq: sl.Sequence) -> None:
        t = time.monotonic()
        try:
            client.seq_step(seq)
            self.rec.record(op, time.monotonic() - t, None, None)
        except Exception as exc:
            self.rec.record(op, time.monotonic() - t, sl.status_of(exc), None, str(exc))


def interval_line(elapsed: float, b: sl.Bucket, secs: float, target: float, rss: dict[str, tuple[int, int]]) -> str:
    lat = " ".join(
        f"{k} {sl.pct(b.lat[k], 50):.1f}/{sl.pct(b.lat[k], 99):.1f}" for k in sl.KINDS if b.ok[k] or b.lat[k]
    )
    rate = (b.n_ok + b.n_err) / secs if secs > 0 else 0.0
    return (
        f"{elapsed:6.0f}s | ok {b.n_ok:,} err {b.n_err} | {rate:,.0f}/s of {target:,.0f}/s | p50/p99 ms {lat} "
        f"| lag p99 {sl.pct(b.lag, 99):.0f} ms | {sl.fmt_rss(rss)}"
    )


def drift(first: float, last: float) -> str:
    if math.isnan(first) or math.isnan(last) or first <= 0:
        return "-"
    return f"{100 * (last - first) / first:+.0f}%"


def summary(
    args: argparse.Namespace,
    drv: Driver,
    calib: sl.Bucket,
    capacity: float,
    rate: float,
    rows: list[tuple[sl.Bucket, float]],
    rss_first: dict[str, tuple[int, int]],
    rss_last: dict[str, tuple[int, int]],
    rss_peak: dict[str, int],
    own_rss: tuple[int, int],
) -> list[str]:
    """The end-of-run report; returns the reasons to fail (errors)."""
    soak = sl.merge([b for b, _ in rows])
    secs = sum(s for _, s in rows)
    first = rows[0][0]
    # a short closing interval (duration not a multiple of the interval) is folded into the one before
    last = sl.merge([b for b, _ in rows[-2:]]) if len(rows) > 2 and rows[-1][1] < args.interval_s / 2 else rows[-1][0]
    print(f"\n== summary: soak {secs:.0f} s at {args.load:.2f} x {capacity:,.0f}/s = {rate:,.0f}/s scheduled, "
          f"achieved {(soak.n_ok + soak.n_err) / secs:,.0f}/s; {args.clients} client threads ==")  # fmt: skip
    print(f"calibration ({args.calibration_s:g} s, {args.calibration_clients} threads back to back): "
          f"{calib.n_ok:,} ok, {calib.n_err} errors")  # fmt: skip
    print(f"soak: {soak.n_ok:,} ok, {soak.n_err} errors; sequences started {drv.seqs.started}, "
          f"completed {drv.seqs.completed}, broken {drv.seqs.broken}; client lag p99 {sl.pct(soak.lag, 99):.0f} ms, "
          f"max {max(soak.lag, default=0) * 1e3:.0f} ms\n")  # fmt: skip
    print("| kind | ok | errors | p50 ms | p99 ms | p99 first interval ms | p99 last interval ms | p99 drift |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in sl.KINDS:
        errs = sum(n for (op, _), n in soak.errors.items() if any(o.name == op and o.kind == k for o in sl.MIX))
        if not soak.ok[k] and not errs:
            continue
        f99, l99 = sl.pct(first.lat[k], 99), sl.pct(last.lat[k], 99)
        print(f"| {sl.KIND_TITLES[k]} | {soak.ok[k]:,} | {errs} | {sl.pct(soak.lat[k], 50):.2f} | "
              f"{sl.pct(soak.lat[k], 99):.2f} | {f99:.2f} | {l99:.2f} | {drift(f99, l99)} |")  # fmt: skip
    errors = calib.errors + soak.errors
    print(
        "\nerrors by op and status: "
        + (", ".join(f"{op} {st}: {n}" for (op, st), n in sorted(errors.items())) or "none")
    )
    for s in (calib.samples + soak.samples)[:5]:
        print(f"  e.g. {s}")
    if rss_first:
        print(
            "\n| process group | processes first → last | RSS first MiB | last MiB | peak MiB | growth MiB | growth |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for g in sorted(set(rss_first) | set(rss_last)):
            n0, k0 = rss_first.get(g, (0, 0))
            n1, k1 = rss_last.get(g, (0, 0))
            pctg = f"{100 * (k1 - k0) / k0:+.1f}%" if k0 else "-"
            print(f"| {g} | {n0} → {n1} | {sl.mib(k0):.1f} | {sl.mib(k1):.1f} | {sl.mib(rss_peak.get(g, 0)):.1f} | "
                  f"{sl.mib(k1 - k0):+.1f} | {pctg} |")  # fmt: skip
        t0, t1 = sum(k for _, k in rss_first.values()), sum(k for _, k in rss_last.values())
        n0, n1 = sum(n for n, _ in rss_first.values()), sum(n for n, _ in rss_last.values())
        print(f"| **all** | {n0} → {n1} | {sl.mib(t0):.1f} | {sl.mib(t1):.1f} | | {sl.mib(t1 - t0):+.1f} | "
              f"{100 * (t1 - t0) / max(t0, 1):+.1f}% |")  # fmt: skip
    else:
        print("\nRSS: no local processes found for the server (remote server, or pass --session)")
    print(f"soak client (this process, not in the table): {sl.mib(own_rss[0]):.1f} → {sl.mib(own_rss[1]):.1f} MiB")
    n_err = calib.n_err + soak.n_err
    return [f"{n_err} request errors"] if n_err else []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=600.0, help="soak length after calibration")
    ap.add_argument("--interval-s", type=float, default=30.0, help="seconds per report line")
    ap.add_argument("--load", type=float, default=0.7, help="fraction of the calibrated capacity to schedule")
    ap.add_argument("--calibration-s", type=float, default=10.0)
    ap.add_argument("--calibration-clients", type=int, default=16, help="closed-loop threads while calibrating")
    ap.add_argument("--clients", type=int, default=32, help="threads taking the open-loop tickets")
    ap.add_argument("--sequences", type=int, default=12, help="concurrent live sequences")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--http", help="HOST:PORT of a running server's HTTP endpoint (with --grpc)")
    ap.add_argument("--grpc", help="HOST:PORT of a running server's gRPC endpoint (with --http)")
    ap.add_argument("--session", type=int, help="with --http: session id whose processes' RSS to report")
    ap.add_argument("--server-arg", action="append", default=[], help="extra `python -m serve_app` option")
    ap.add_argument("--abuse", type=int, default=0, help="then N abuse cases over sockets, memory checked after")
    ap.add_argument("--settle-s", type=float, default=10.0, help="wait after the abuse before the RSS is read")
    ap.add_argument("--keep-log", action="store_true", help="print the server log's tail at the end")
    args = ap.parse_args()
    if bool(args.http) != bool(args.grpc):
        ap.error("--http and --grpc go together")
    if args.duration_s <= 0 or args.interval_s <= 0 or not 0 < args.load <= 2 or args.calibration_s <= 0:
        ap.error("durations must be positive and --load in (0, 2]")

    t_start = time.monotonic()
    deadline = (
        t_start + args.duration_s + args.calibration_s + 120 + (args.abuse * 0.1 + args.settle_s if args.abuse else 0)
    )
    server: list[Server] = []
    done = threading.Event()

    def abort(why: str) -> None:
        print(f"\n{why}: stopping the server and exiting", flush=True)
        if server:
            server[0].stop(timeout=10)
        os._exit(3)

    def watchdog() -> None:
        if not done.wait(max(0.0, deadline - time.monotonic())):
            abort(f"hard deadline ({deadline - t_start:.0f} s) reached")

    def on_signal(signum: int, _frame: object) -> None:
        # handlers are set explicitly: a soak started in the background may inherit SIGINT ignored
        if EARLY.is_set():
            threading.Thread(target=abort, args=(f"second {signal.Signals(signum).name}",), daemon=True).start()
        else:
            EARLY.set()  # no print here: the main thread may be inside print()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    threading.Thread(target=watchdog, daemon=True).start()

    fails = ["the run did not finish"]
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        try:
            if args.http:
                http, grpc = args.http, args.grpc
                sid = args.session or sl.listener_session(int(http.rsplit(":", 1)[1]))
            else:
                repo = pathlib.Path(tmp) / "repo"
                sl.build_repository(repo)
                server.append(Server(repo, pathlib.Path(tmp) / "server.log", args.server_arg))
                http, grpc = f"127.0.0.1:{server[0].http_port}", f"127.0.0.1:{server[0].grpc_port}"
                sid = server[0].sid
                server[0].wait_ready(t_start + 100)  # the rest of the 120 s slack is for the stop
                print(f"server up in {time.monotonic() - t_start:.0f} s (pid {sid})", flush=True)
            fails = run(args, http, grpc, sid, server[0] if server else None, deadline)
        finally:
            if server:
                left = max(5.0, deadline - time.monotonic() - 15)
                code, took, leftovers = server[0].stop(timeout=min(90.0, left))
                print(f"server stopped by SIGTERM: exit code {code} after {took:.1f} s"
                      + (f"; {len(leftovers)} processes left, killed" if leftovers else ""))  # fmt: skip
                if args.keep_log:
                    print(server[0].log.read_text()[-5000:])
                if code != 0 or leftovers:
                    fails.append("unclean server shutdown")
            done.set()
    print(("FAIL: " + "; ".join(fails)) if fails else "PASS: no errors, server ready, clean shutdown", flush=True)
    return 1 if fails else 0


def run(
    args: argparse.Namespace, http: str, grpc: str, sid: int | None, server: Server | None, deadline: float
) -> list[str]:
    """Calibrate, soak, summarise; returns the reasons to fail."""
    if not sl.server_ready(http):
        return [f"server at {http} is not ready"]
    served = sl.discover(http)
    if sl.ADD_SUB not in served.models:
        return [f"the server has no READY add_sub (found {sorted(served.models)})"]
    ops = sl.mix_for(served)
    total_w = sum(op.weight for op in ops)
    print("mix: " + ", ".join(f"{op.name} {100 * op.weight / total_w:.0f}%" for op in ops))
    if served.seq_model:
        print(f"sequences: {args.sequences} live on '{served.seq_model}' ({served.seq_slots or '?'} slots), "
              "5-50 steps each, over gRPC")  # fmt: skip
        if served.seq_slots and args.sequences > served.seq_slots:
            print(f"warning: more sequences than slots: {args.sequences - served.seq_slots} wait in the backlog")
    else:
        print("sequences: none (no accumulator-like sequence model is READY)")

    def rss() -> dict[str, tuple[int, int]]:
        return sl.rss_by_group(sl.session_processes(sid)) if sid else {}

    drv = Driver(http, grpc, served, ops, args)
    # 1. calibration: back to back; the first fifth warms connections, sessions and batchers up
    warm = max(1.0, args.calibration_s / 5)
    t0 = time.monotonic()
    drv.start(args.calibration_clients, until=t0 + warm + args.calibration_s)
    EARLY.wait(warm)
    warmup, _ = drv.rec.rotate()
    EARLY.wait(max(0.0, t0 + warm + args.calibration_s - time.monotonic()))
    measured, secs = drv.rec.rotate()
    if EARLY.is_set():
        drv.stop.set()
    drv.join(timeout=sl.TIMEOUT_S + 5)
    if EARLY.is_set():
        return ["interrupted during calibration"]
    capacity = max(1.0, (measured.n_ok + measured.n_err) / secs)
    calib = sl.merge([warmup, measured, drv.rec.rotate()[0]])  # errors anywhere count
    rate = args.load * capacity
    print(f"calibration: {capacity:,.0f} requests/s with {args.calibration_clients} threads back to back "
          f"({calib.n_err} errors); soaking at {rate:,.0f}/s for {args.duration_s:g} s\n", flush=True)  # fmt: skip

    # 2. soak: open loop, one line per interval
    rss_first = rss()
    rss_peak = {g: kib for g, (_, kib) in rss_first.items()}
    own0 = sl.own_rss_kib()
    rows: list[tuple[sl.Bucket, float]] = []
    t0 = time.monotonic()
    until = min(t0 + args.duration_s, deadline - 45)  # a slow start shortens the soak: the stop needs time
    if until < t0 + args.duration_s:
        print(f"(the server was slow to start: soaking {until - t0:.0f} s to keep within the hard deadline)")
    drv.rec.rotate()
    drv.start(args.clients, until=until, rate=rate)
    rss_last = rss_first
    next_t = t0
    while True:
        next_t = min(next_t + args.interval_s, until)
        while time.monotonic() < next_t:
            if EARLY.wait(min(0.5, max(0.0, next_t - time.monotonic()))):
                break
            if server is not None and server.proc.poll() is not None:
                break
        if time.monotonic() >= until - 0.05:  # let the last tickets' answers land in the last interval
            drv.join(timeout=sl.TIMEOUT_S + 5)
        bucket, secs = drv.rec.rotate()
        rss_last = rss()
        for g, (_, kib) in rss_last.items():
            rss_peak[g] = max(rss_peak.get(g, 0), kib)
        rows.append((bucket, secs))
        print(interval_line(time.monotonic() - t0, bucket, secs, rate, rss_last), flush=True)
        if server is not None and server.proc.poll() is not None:
            print(f"server exited (code {server.proc.returncode}) during the soak")
            drv.stop.set()
            break
        if EARLY.is_set():
            print("signal received: ending the soak early", flush=True)
            drv.stop.set()
            break
        if next_t >= until:
            break
    drv.stop.set()
    drv.join(timeout=sl.TIMEOUT_S + 5)
    if served.seq_model:
        drv.finish_sequences()
    tail, _ = drv.rec.rotate()
    last_bucket, last_s = rows[-1]
    rows[-1] = (sl.merge([last_bucket, tail]), last_s)
    ready = sl.server_ready(http)

    fails = summary(args, drv, calib, capacity, rate, rows, rss_first, rss_last, rss_peak, (own0, sl.own_rss_kib()))
    print(f"server ready at the end: {'yes' if ready else 'NO'}")
    if not ready:
        fails.append("server not ready at the end")
    if args.abuse and ready and not EARLY.is_set():
        fails += abuse_phase(args, http, grpc, rss)
    if EARLY.is_set():
        fails.append(f"interrupted after {sum(s for _, s in rows):.0f} s of {args.duration_s:g} s")
    return fails


def abuse_phase(
    args: argparse.Namespace, http: str, grpc: str, rss: Callable[[], dict[str, tuple[int, int]]]
) -> list[str]:
    """Abuse over sockets after the soak; the reasons to fail (memory: all the server's processes together)."""
    groups = rss()
    before = sum(kib for _, kib in groups.values())
    print(f"\nabuse: {args.abuse} cases over sockets, seed {args.seed}", flush=True)
    report = sockets.abuse_ports(
        int(http.rsplit(":", 1)[1]), int(grpc.rsplit(":", 1)[1]), DEFAULT_LIMITS,
        model=sl.ADD_SUB, cases=args.abuse, seed=args.seed,
    )  # fmt: skip
    peak = sum(kib for _, kib in rss().values())
    EARLY.wait(args.settle_s)
    groups_after = rss()
    after = sum(kib for _, kib in groups_after.values())
    grown = {g: kib - groups.get(g, (0, 0))[1] for g, (_, kib) in groups_after.items()}
    growth = (after - before) / before if before else 0.0
    answers = "  ".join(f"{a}: {n}" for a, n in sorted(report.answers.items(), key=lambda kv: -kv[1]))
    print(f"abuse: {report.cases} cases in {report.elapsed_s:.1f} s, {len(report.problems)} failures, healthy "
          f"{report.healthy}; {answers}; slowest {report.slowest * 1000:.0f} ms")  # fmt: skip
    print(
        f"abuse: server RSS {sl.mib(before):.0f} MiB before, {sl.mib(peak):.0f} right after, "
        f"{sl.mib(after):.0f} after {args.settle_s:g} s ({growth:+.1%}); grown: "
        + ", ".join(f"{g} {sl.mib(k):+.0f}" for g, k in sorted(grown.items(), key=lambda kv: -kv[1]) if k > 1024)
    )
    fails = [f"abuse case {p}" for p in report.problems[:20]]
    if not report.healthy:
        fails.append("server not healthy after the abuse")
    if before and growth > 0.05:
        fails.append(f"server RSS {growth:+.1%} after the abuse (more than 5%)")
    return fails


if __name__ == "__main__":
    sys.exit(main())
