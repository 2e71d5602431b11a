"""Every node serves: one gateway on each node's own address, every model through every gateway (stock
clients over HTTP and gRPC), and instance groups placed on the nodes their kind and ``gpus`` name."""

from __future__ import annotations

import collections

from tests.multinode import clients, models
from tests.multinode.conftest import MultiNode, http_ready, wait_until


def replicas(actors: dict[str, list[str]], deployment: str) -> dict[str, int]:
    """Serve replicas of ``deployment`` on each node address (actor names are ``SERVE_REPLICA::app#dep#id``)."""
    return {a: sum(1 for n in names if f"#{deployment}#" in n) for a, names in actors.items()}


def test_one_gateway_on_every_node(multinode: MultiNode) -> None:
    for node in multinode.nodes:
        wait_until(lambda a=node.address: http_ready(a), 120, f"the gateway on {node.name} ({node.address}) ready")
    placed = replicas(multinode.actors_by_node(), "gateway")
    assert placed == {n.address: 1 for n in multinode.nodes}, placed


def test_every_model_through_every_gateway(multinode: MultiNode) -> None:
    for node in multinode.nodes:
        for client in (clients.http(node.address), clients.grpc(node.address)):
            assert client.is_server_live() and client.is_server_ready()
            for name in models.LOADED:
                assert client.is_model_ready(name), (node.name, name)
            clients.add_sub(client)
            assert clients.where(client, "where_cpu") in {n.address for n in multinode.nodes}


def held(instances: list[dict[str, object]]) -> dict[str, collections.Counter[tuple[object, ...]]]:
    """node address -> how many (model, kind, CUDA_VISIBLE_DEVICES, loaded) instances it holds."""
    out: dict[str, collections.Counter[tuple[object, ...]]] = collections.defaultdict(collections.Counter)
    for i in instances:
        out[str(i["node_ip"])][(i["model"], i["kind"], i["cuda_visible_devices"], i["loaded"])] += 1
    return dict(out)


def test_instance_groups_placed_exactly_across_nodes(multinode: MultiNode) -> None:
    """Shared KIND_CPU groups: ``count`` instances in every gateway (one per node).  Python models run in
    Serve replicas of their own: KIND_GPU ``gpus: [1]`` one on each node that has GPU 1 (not the head,
    which has none), KIND_CPU ``count: 1`` one in the cluster."""
    everywhere = collections.Counter({("add_sub", "KIND_CPU", True): 2, ("seq_accum", "KIND_CPU", True): 1,
                                      ("seq_oldest", "KIND_CPU", True): 2})  # fmt: skip
    held: dict[str, collections.Counter[tuple[object, ...]]] = collections.defaultdict(collections.Counter)
    for i in multinode.placement("gateway", "serve_app"):
        held[str(i["node_ip"])][(i["model"], i["kind"], i["loaded"])] += 1
        assert i["cuda_visible_devices"] == "", i  # a gateway sees no GPU, though its node has some
    assert dict(held) == {n.address: everywhere for n in multinode.nodes}, dict(held)
    actors = multinode.actors_by_node()
    gpu_nodes = {n.address for n in multinode.nodes[1:]}
    assert {a: c for a, c in replicas(actors, "where_gpu.v1.g0.gpu1").items() if c} == dict.fromkeys(gpu_nodes, 1)
    assert sum(replicas(actors, "where_cpu.v1.g0").values()) == 1, actors
    for node in multinode.nodes:
        client = clients.grpc(node.address)
        seen = collections.Counter(clients.where(client, "where_gpu") for _ in range(6))
        assert set(seen) <= gpu_nodes, seen


def test_bls_from_a_python_model_to_another_node(multinode: MultiNode) -> None:
    """py_bls has a replica on every GPU node, py_add_sub one in the cluster: some py_bls replicas run
    their BLS call on another node's instance; every call through every gateway answers right."""
    actors = multinode.actors_by_node()
    callers = {a for a, c in replicas(actors, "py_bls.v1.g0.gpu0").items() if c}
    callee = {a for a, c in replicas(actors, "py_add_sub.v1.g0").items() if c}
    assert len(callers) == len(multinode.nodes) - 1 and len(callee) == 1, actors
    assert callers - callee, (callers, callee)
    for node in multinode.nodes:
        for client in (clients.http(node.address), clients.grpc(node.address)):
            for _ in range(3):
                clients.bls(client)
