"""Faults under load on a server of its own (explicit model control, every model loaded): a model replica
killed, a hung instance, the gateway killed, a reload that fails.  The figures come from
scripts/fault_injection.py, which scripts/faults prints."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from scripts import example_models
from tests.e2e.conftest import Server, start_server, stop_server
from tests.e2e.models import slow_identity
from tests.support import faults as fi, soak as soak_lib

# The fault tests kill one instance's process: each instance of these models gets its own.
DEDICATED = 'parameters { key: "dedicated_process" value: { string_value: "true" } }\n'
MODEL = "fault_add"  # add_sub with two instances
DEPLOYMENT = f"{MODEL}.v1.g0"
SLOW = "overload_slow"  # tens of ms per execution, whatever the batch
QUEUE = 8  # the server's --max-queue-size
SERVER_ERRORS = {"500", "StatusCode.INTERNAL", "StatusCode.UNKNOWN"}


@pytest.fixture(scope="module")
def fault_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("fault_repo")
    example_models.add_sub(
        repo, name=MODEL, extra_config="instance_group [ { kind: KIND_CPU count: 2 } ]\n" + DEDICATED
    )
    slow_identity(repo, SLOW, "dynamic_batching { }\n", matmuls=8)
    extra = ["--model-control-mode", "explicit", "--load-model", "*", "--instance-timeout-s", "3",
             "--max-queue-size", str(QUEUE)]  # fmt: skip
    server, _ = start_server(tmp_path_factory, repo, extra, "faults")
    yield server
    stop_server(server)


def load(server: Server) -> fi.Callable[[], None]:
    return fi.add_sub_infer(server.http_url, MODEL)


def test_killed_model_replica_fails_only_its_requests_and_comes_back(fault_server: Server) -> None:
    session = fault_server.proc.pid
    before = fi.replica_pids(session, DEPLOYMENT)
    assert len(before) == 2
    victim = before[0]
    out = fi.under_load(
        "model replica SIGKILL",
        lambda: load(fault_server),
        lambda: fi.kill(victim),
        replaced=lambda: (
            len(fi.replica_pids(session, DEPLOYMENT)) == 2 and victim not in fi.replica_pids(session, DEPLOYMENT)
        ),
    )
    print("\n" + fi.HEADER + "\n" + out.row())
    assert out.replaced_s is not None, "Serve did not replace the killed replica"
    assert out.recovery_s is not None
    assert not set(out.failed) & SERVER_ERRORS, out.errors
    assert set(out.failed) <= {"503"}, out.errors  # UNAVAILABLE-class, fast
    assert out.slowest_failure_s < 5.0
    assert sum(out.failed.values()) <= 6  # only requests in flight on the dead instance
    assert httpclient.InferenceServerClient(fault_server.http_url).is_model_ready(MODEL)


def failures(server: Server) -> int:
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(MODEL)
    return int(stats["model_stats"][0]["inference_stats"]["fail"]["count"])


def test_hung_instance_times_out_and_the_other_serves(fault_server: Server) -> None:
    """The instance stays stopped until a request on it has failed: the 3 s timeout, not its return, ended it."""
    session = fault_server.proc.pid
    victim = fi.replica_pids(session, DEPLOYMENT)[0]
    before = failures(fault_server)
    failed_while_stopped: list[bool] = []

    def stop_until_a_failure() -> None:
        fi.kill(victim, signal.SIGSTOP)
        deadline = time.monotonic() + 60
        try:
            while failures(fault_server) == before and time.monotonic() < deadline:
                time.sleep(0.1)
            failed_while_stopped.append(failures(fault_server) > before)
        finally:
            fi.kill(victim, signal.SIGCONT)

    import threading

    stopper = threading.Thread(target=stop_until_a_failure, daemon=True)
    try:
        out = fi.under_load(
            "model replica SIGSTOP until a request on it fails (instance timeout 3 s; 'replaced': that failure)",
            lambda: load(fault_server),
            stopper.start,
            before_s=1.0,
            replaced=lambda: bool(failed_while_stopped),
        )
        stopper.join(timeout=90)
    finally:
        fi.kill(victim, signal.SIGCONT)
    print("\n" + fi.HEADER + "\n" + out.row())
    assert failed_while_stopped == [True], "no request failed while the instance was stopped"
    assert not set(out.failed) & SERVER_ERRORS, out.errors
    assert out.ok > 20  # the other instance kept serving
    assert out.failed and all("did not answer within 3s" in e for e in out.errors), out.errors


def test_killed_gateway_comes_back(fault_server: Server) -> None:
    session = fault_server.proc.pid
    (gateway,) = fi.replica_pids(session, "gateway")
    out = fi.under_load(
        "gateway SIGKILL",
        lambda: load(fault_server),
        lambda: fi.kill(gateway),
        replaced=lambda: bool(set(fi.replica_pids(session, "gateway")) - {gateway}),
    )
    print("\n" + fi.HEADER + "\n" + out.row())
    assert out.replaced_s is not None and out.recovery_s is not None
    assert not set(out.failed) & SERVER_ERRORS, out.errors
    client = httpclient.InferenceServerClient(fault_server.http_url)
    assert client.is_server_ready() and client.is_model_ready(MODEL)
    assert {m["name"] for m in client.get_model_repository_index()} == {MODEL, SLOW}


def test_a_failed_reload_keeps_the_old_version_serving(fault_server: Server) -> None:
    client = httpclient.InferenceServerClient(fault_server.http_url)
    bad = {"name": MODEL, "backend": "onnxruntime", "max_batch_size": -4}
    with pytest.raises(InferenceServerException, match="max_batch_size"):
        client.load_model(MODEL, config=json.dumps(bad))
    assert client.is_model_ready(MODEL)
    load(fault_server)()
    assert client.get_model_config(MODEL)["max_batch_size"] == 8


def test_overload_sheds_with_503_and_recovers(fault_server: Server) -> None:
    """64 clients against one slow instance with --max-queue-size 8: the excess gets 503 at once, those admitted
    wait at most a queue's worth of executions, and the server is idle and serving right after."""
    import threading

    import numpy as np

    stop = threading.Event()
    lock = threading.Lock()
    ok_latency: list[float] = []
    shed: list[float] = []
    other: list[str] = []

    def client() -> None:
        c = httpclient.InferenceServerClient(fault_server.http_url, network_timeout=60)
        inp = httpclient.InferInput("IN", [1, 1], "FP32")
        inp.set_data_from_numpy(np.ones((1, 1), np.float32))
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                c.infer(SLOW, [inp])
                with lock:
                    ok_latency.append(time.monotonic() - t0)
            except InferenceServerException as exc:
                with lock:
                    if exc.status() == "503" and "Exceeds maximum queue size" in str(exc):
                        shed.append(time.monotonic() - t0)
                    else:
                        other.append(str(exc))

    def rss() -> dict[str, tuple[int, int]]:
        return soak_lib.rss_by_group(soak_lib.session_processes(fault_server.proc.pid))

    before = rss()
    peak = before
    threads = [threading.Thread(target=client, daemon=True) for _ in range(64)]
    for t in threads:
        t.start()
    for _ in range(8):
        time.sleep(1.0)
        now = rss()
        if sum(k for _, k in now.values()) > sum(k for _, k in peak.values()):
            peak = now
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert other == [], other[:5]
    assert shed and ok_latency, (len(shed), len(ok_latency))
    ok_latency.sort()
    p99 = ok_latency[int(len(ok_latency) * 0.99) - 1]
    print(
        f"\noverload, 64 clients, queue {QUEUE}: {len(ok_latency)} served (p50 {ok_latency[len(ok_latency) // 2]:.3f}s,"
        f" p99 {p99:.3f}s), {len(shed)} shed with 503 (slowest {max(shed):.3f}s)"
    )
    # Memory stays bounded: the queue is capped, so the server's processes grow by little under the flood.
    grown = {g: (peak.get(g, (0, 0))[1] - k) // 1024 for g, (_, k) in before.items()}
    total = (sum(k for _, k in peak.values()) - sum(k for _, k in before.values())) // 1024
    print(f"overload memory: before {soak_lib.fmt_rss(before)}; peak {soak_lib.fmt_rss(peak)}; grew {total} MiB "
          f"({', '.join(f'{soak_lib.short(g)} {m:+d}' for g, m in grown.items() if m)})")  # fmt: skip
    assert total < 1024, f"the server grew {total} MiB under overload"
    # Recovered: nothing left queued, and a request is served at once.
    client = httpclient.InferenceServerClient(fault_server.http_url)
    t0 = time.monotonic()
    inp = httpclient.InferInput("IN", [1, 1], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1), np.float32))
    client.infer(SLOW, [inp])
    assert client.get_inference_statistics(SLOW)["model_stats"][0]["inference_stats"]["fail"]["count"] >= len(shed)
    assert time.monotonic() - t0 < 10
