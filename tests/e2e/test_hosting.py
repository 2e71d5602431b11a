"""Shared hosts on a server of their own: CPU instances in a host process (not the gateway), a host killed and
replaced with its content, and an instance Ray can't place failing its load with a reason (the rest serve)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from scripts import example_models
from tests.e2e.conftest import Server, start_server, stop_server
from tests.e2e.sequence_models import accumulator
from tests.support import faults as fi

SEQ = "host_seq"  # an accumulator with state backup, two instances in the host
BIG = "big_dedicated"  # a process per instance, each asking for more CPUs than the cluster has
DEDICATED = 'parameters { key: "dedicated_process" value: { string_value: "true" } }\n'


@pytest.fixture(scope="module")
def host_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("hosting_repo")
    example_models.add_sub(repo)
    accumulator(repo, SEQ, max_batch_size=2, instances=2, idle_us=60_000_000)
    extra = ["--no-cpu-instances-in-gateway", "--placement-timeout-s", "5"]
    server, _ = start_server(tmp_path_factory, repo, extra, "hosting")
    yield server
    stop_server(server)


def step(client: grpcclient.InferenceServerClient, corr: int, value: int, **flags: bool) -> int:
    inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer(SEQ, [inp], sequence_id=corr, client_timeout=30, **flags)
    return int(result.as_numpy("OUTPUT").ravel()[0])


def test_models_share_one_host_process_that_serve_replaces_with_its_content(host_server: Server) -> None:
    session = host_server.proc.pid
    (host,) = fi.replica_pids(session, "host-cpu")
    client = grpcclient.InferenceServerClient(host_server.grpc_url)
    assert step(client, 41, 5, sequence_start=True) == 5
    assert step(client, 42, 7, sequence_start=True) == 7
    fi.kill(host)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        pids = fi.replica_pids(session, "host-cpu")
        if pids and host not in pids and client.is_model_ready("add_sub"):
            try:
                fi.add_sub_infer(host_server.http_url, "add_sub")()
                break
            except Exception:
                pass
        time.sleep(0.5)
    else:
        raise AssertionError("the host was not replaced, or add_sub never answered again")
    # Both sequences were backed up: they go on, in the replacement host, from their last answered step.
    assert step(client, 41, 1) == 6
    assert step(client, 42, 3, sequence_end=True) == 10
    assert step(client, 41, 4, sequence_end=True) == 10


def test_an_instance_ray_cannot_place_fails_its_load_with_what_it_asked(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    repo = tmp_path_factory.mktemp("unplaced_repo")
    example_models.add_sub(repo)
    example_models.add_sub(repo, name=BIG, extra_config=DEDICATED)
    extra = ["--instance-cpus", "64", "--placement-timeout-s", "5"]  # 16 logical CPUs in the Ray it starts
    t0 = time.monotonic()
    server, _ = start_server(tmp_path_factory, repo, extra, "unplaced")
    try:
        assert time.monotonic() - t0 < 120  # Serve reports unplaced replicas after 30 s; then it fails at once
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_server_ready() and client.is_model_ready("add_sub")
        (entry,) = [m for m in client.get_model_repository_index() if m["name"] == BIG]
        assert entry["state"] == "UNAVAILABLE"
        assert "Ray could not place its instances: each asks for" in entry["reason"]
        assert "64" in entry["reason"]
    finally:
        stop_server(server)
