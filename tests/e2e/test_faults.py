"""Faults under load on a server of its own (explicit model control, every model loaded): a model replica
killed, a hung instance, the gateway killed, a reload that fails.  The figures come from
scripts/fault_injection.py, which scripts/faults prints."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import example_models
import fault_injection as fi
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Server, start_server, stop_server

MODEL = "fault_add"  # add_sub with two instances
DEPLOYMENT = f"{MODEL}.v1.g0"
SERVER_ERRORS = {"500", "StatusCode.INTERNAL", "StatusCode.UNKNOWN"}


@pytest.fixture(scope="module")
def fault_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("fault_repo")
    example_models.add_sub(repo, name=MODEL, extra_config="instance_group [ { kind: KIND_CPU count: 2 } ]\n")
    extra = ["--model-control-mode", "explicit", "--load-model", "*", "--instance-timeout-s", "3"]
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


def test_hung_instance_times_out_and_the_other_serves(fault_server: Server) -> None:
    session = fault_server.proc.pid
    victim = fi.replica_pids(session, DEPLOYMENT)[0]
    resumed = []

    def stop_then_resume() -> None:
        fi.kill(victim, signal.SIGSTOP)
        time.sleep(5.0)
        fi.kill(victim, signal.SIGCONT)
        resumed.append(time.monotonic())

    import threading

    try:
        out = fi.under_load(
            "model replica SIGSTOP 5 s (instance timeout 3 s)",
            lambda: load(fault_server),
            lambda: threading.Thread(target=stop_then_resume, daemon=True).start(),
            before_s=1.0,
            settle_s=6.0,
        )
    finally:
        fi.kill(victim, signal.SIGCONT)
    print("\n" + fi.HEADER + "\n" + out.row())
    assert not set(out.failed) & SERVER_ERRORS, out.errors
    assert out.ok > 20  # the other instance kept serving
    # A request stuck on the stopped instance failed after the 3 s timeout, not later.
    assert out.slowest_failure_s < 4.5, out
    assert all("did not answer within 3s" in e for e in out.errors), out.errors


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
    assert {m["name"] for m in client.get_model_repository_index()} == {MODEL}


def test_a_failed_reload_keeps_the_old_version_serving(fault_server: Server) -> None:
    client = httpclient.InferenceServerClient(fault_server.http_url)
    bad = {"name": MODEL, "backend": "onnxruntime", "max_batch_size": -4}
    with pytest.raises(InferenceServerException, match="max_batch_size"):
        client.load_model(MODEL, config=json.dumps(bad))
    assert client.is_model_ready(MODEL)
    load(fault_server)()
    assert client.get_model_config(MODEL)["max_batch_size"] == 8
