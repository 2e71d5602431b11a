"""Load on demand across the cluster: each node has a budget of its own, a model loads on one node with
room, and every gateway's requests reach it there.

The server runs with ``--load-on-demand`` and a budget of ``models.BUDGET`` per node, which leaves every
node ``models.ON_DEMAND_SLOTS`` models loaded on demand beside the ones loaded at start.  The lazy models
are Python models (a process of their own each, answering their node's address) and ONNX models (in the
gateways' processes).
"""

from __future__ import annotations

import collections
import urllib.request

from tests.multinode import clients, models
from tests.multinode.conftest import METRICS_PORT, MultiNode, Node, http_ready, wait_until

SETTLE_S = 120.0


def gateways(cluster: MultiNode) -> list[Node]:
    return [n for n in cluster.nodes if http_ready(n.address)]


def lazy_by_node(cluster: MultiNode, answered: dict[str, str]) -> dict[str, set[str]]:
    """Node address -> the lazy models it holds: ONNX ones from the gateways' placement, Python ones from
    where they answered."""
    held: dict[str, set[str]] = collections.defaultdict(set)
    for i in cluster.placement("gateway", "serve_app"):
        if str(i["model"]).startswith("lazy_"):
            held[str(i["node_ip"])].add(str(i["model"]))
    for model, address in answered.items():
        held[address].add(model)
    return dict(held)


def ask(node: Node, model: str) -> str:
    """One request for ``model`` through ``node``'s gateway; the node that answered (Python models say)."""
    client = clients.grpc(node.address)
    if model.startswith("lazy_py_"):
        return clients.where(client, model)
    clients.add_sub(client, model)
    return ""


def test_more_models_than_a_node_holds_load_across_the_cluster(multinode: MultiNode) -> None:
    wait_until(lambda: len(gateways(multinode)) == len(multinode.nodes), SETTLE_S, "a gateway on every node")
    nodes = multinode.nodes
    slots = models.ON_DEMAND_SLOTS
    first = [m for pair in zip(models.LAZY_PY[:3], models.LAZY_ADD[:3], strict=True) for m in pair]
    assert len(first) > slots and len(first) <= slots * len(nodes)
    answered: dict[str, str] = {}
    for i, model in enumerate(first):  # cold, through different gateways
        where = ask(nodes[i % len(nodes)], model)
        if where:
            answered[model] = where
    held = lazy_by_node(multinode, answered)
    print(f"\n[on demand] lazy models by node after {len(first)} cold requests: {held}")
    assert sorted(m for ms in held.values() for m in ms) == sorted(first), held
    assert all(len(ms) <= slots for ms in held.values()), held  # each node keeps its budget
    assert len(held) >= -(-len(first) // slots), held  # so they spread over the nodes
    for node in nodes:  # every gateway reaches each model where it is loaded
        for model in first:
            where = ask(node, model)
            assert where == answered.get(model, ""), (node.name, model, where, answered)

    # More than the whole cluster holds: the least recently used make room, and every request answers.
    rest = [m for pair in zip(models.LAZY_PY[3:], models.LAZY_ADD[3:], strict=True) for m in pair]
    every = first + rest
    assert len(every) > slots * len(nodes)
    for i, model in enumerate(rest + first):
        where = ask(nodes[i % len(nodes)], model)
        if where:
            answered[model] = where
    index = {m["name"]: m for m in clients.http(nodes[0].address).get_model_repository_index()}
    ready = [m for m in every if index[m].get("state") == "READY"]
    assert len(ready) <= slots * len(nodes), index
    held = lazy_by_node(multinode, {m: answered[m] for m in ready if m in answered})
    print(f"[on demand] after {len(rest + first)} more: {held}, {evictions(nodes[0]):g} evictions")
    assert all(len(ms) <= slots for ms in held.values()), held
    assert evictions(nodes[0]) >= len(every) - slots * len(nodes)


def evictions(node: Node) -> float:
    """The evictions the server counted (its metrics, through ``node``)."""
    with urllib.request.urlopen(f"http://{node.address}:{METRICS_PORT}/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("nv_model_on_demand_evictions")
    )
