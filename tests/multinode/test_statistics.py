"""Statistics asked of any one gateway add up every node's gateway (each batches its own requests)."""

from __future__ import annotations

from typing import Any

from tests.multinode import clients
from tests.multinode.conftest import MultiNode

PER_GATEWAY = 5


def successes(stats: dict[str, Any]) -> int:
    (model,) = [m for m in stats["model_stats"] if m["name"] == "add_sub"]
    return int(model["inference_stats"]["success"]["count"])


def test_statistics_are_summed_over_the_nodes(multinode: MultiNode) -> None:
    nodes = multinode.nodes
    before = [successes(clients.http(n.address).get_inference_statistics("add_sub")) for n in nodes]
    assert len(set(before)) == 1, f"the gateways disagree before: {before}"
    for k, node in enumerate(nodes):
        client = clients.http(node.address) if k % 2 else clients.grpc(node.address)
        for _ in range(PER_GATEWAY):
            clients.add_sub(client)
    after = [successes(clients.http(n.address).get_inference_statistics("add_sub")) for n in nodes]
    assert after == [before[0] + PER_GATEWAY * len(nodes)] * len(nodes), (before, after)
