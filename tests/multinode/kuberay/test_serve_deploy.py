"""The RayService's serveConfigV2, deployed through the head's dashboard as KubeRay deploys it: a gateway on
each gateway pod answering stock clients on Triton's ports, model instances on the pods that have what they
ask for, and Serve's status RUNNING as KubeRay reads it."""

from __future__ import annotations

import socket

import numpy as np

from tests.multinode import clients
from tests.multinode.conftest import HTTP_PORT, wait_until
from tests.multinode.kuberay.conftest import KubeRayCluster, dumps

TIMEOUT_S = 300.0


def listening(address: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(5)
        return s.connect_ex((address, port)) == 0


def test_serve_config_v2_deployed_through_the_dashboard_serves_on_every_gateway_pod(kuberay: KubeRayCluster) -> None:
    def running() -> bool:
        apps = kuberay.applications()
        return bool(apps.get("serve_app", {}).get("status") == "RUNNING")

    wait_until(running, TIMEOUT_S, "serve_app RUNNING in `serve status`", poll_s=3.0)
    for node in kuberay.nodes_of("gateway"):
        for client in (clients.http(node.address), clients.grpc(node.address)):
            wait_until(lambda c=client: c.is_server_ready(), TIMEOUT_S, f"{node.name}'s gateway ready")
            clients.add_sub(client)
            module = clients._module(client)
            inp = module.InferInput("IN", [1], "INT32")
            inp.set_data_from_numpy(np.zeros(1, dtype=np.int32))
            device = client.infer("on_gpu", [inp]).as_numpy("DEVICE").reshape(-1)[0]
            assert device == b"GPU:0", device
    for node in (kuberay.head, *kuberay.nodes_of("gpu")):  # no gateway where the manifest puts none
        assert not listening(node.address, HTTP_PORT), f"a gateway on {node.name} ({kuberay.groups[node.name]})"
    status = kuberay.applications()["serve_app"]
    assert status["status"] == "RUNNING", dumps(status)
