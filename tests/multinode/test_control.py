"""Model control through one node's gateway is seen by every gateway."""

from __future__ import annotations

from tests.multinode import clients
from tests.multinode.conftest import MultiNode, wait_until

TIMEOUT_S = 120.0


def test_load_and_unload_through_one_gateway_seen_by_all(multinode: MultiNode) -> None:
    first, second = multinode.nodes[1], multinode.nodes[2]
    clients.http(first.address).load_model("late")
    for node in multinode.nodes:
        client = clients.grpc(node.address)
        wait_until(lambda c=client: c.is_model_ready("late"), TIMEOUT_S, f"'late' ready on {node.name}'s gateway")
        clients.add_sub(client, "late")
    clients.grpc(second.address).unload_model("late")
    for node in multinode.nodes:
        client = clients.http(node.address)
        wait_until(
            lambda c=client: not c.is_model_ready("late"), TIMEOUT_S, f"'late' unloaded on {node.name}'s gateway"
        )
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["late"].get("state") == "UNAVAILABLE", index["late"]
