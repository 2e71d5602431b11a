"""A simulated multi-node Ray cluster without GPUs, for placement tests.

``ray.cluster_utils.Cluster`` starts every node as local processes: a head without
GPUs or CPUs (so every model replica lands on a GPU node), and two "GPU" nodes,
each with 4 fake GPUs (Ray's ``GPU`` resource), one custom resource per GPU index
(``gpu_idx_0..3``, as an operator declares them) and a marker resource naming the
node.  The nodes' processes see ``CUDA_VISIBLE_DEVICES=0,1,2,3``, as on a real
GPU node, so a replica that must see no GPU has something to hide.

Ray writes the cluster's address under ``$RAY_TMPDIR/ray``, where any other
``ray.init()`` on this machine would find it: RAY_TMPDIR points at a private
temporary directory (short, for Ray's socket paths) while the cluster lives.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

GPU_NODES = ("node-b", "node-c")
GPUS_PER_NODE = 4
NODE_CPUS = 8  # logical CPUs of each GPU node (this machine has 2 cores; replicas ask for 0.1)
GPU_RESOURCE_PREFIX = "gpu_idx_"


@dataclass(frozen=True)
class SimCluster:
    address: str
    node_names: dict[str, str]  # Ray node id -> "head" | "node-b" | "node-c"


def _marker(name: str) -> str:
    return "host_" + name.replace("-", "_")


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[SimCluster]:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "CUDA_VISIBLE_DEVICES")}
    tmp = tempfile.mkdtemp(prefix="rc_", dir="/tmp")
    os.environ["RAY_TMPDIR"] = tmp
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    cluster = None
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "num_gpus": 0,
                "resources": {_marker("head"): 1},
                "labels": {"triton-host": "head"},
                "include_dashboard": False,
            },
        )
        # The GPU nodes' processes inherit this, as on a node whose GPUs are all visible.
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(GPUS_PER_NODE))
        for name in GPU_NODES:
            per_gpu = {f"{GPU_RESOURCE_PREFIX}{i}": 1 for i in range(GPUS_PER_NODE)}
            cluster.add_node(
                num_cpus=NODE_CPUS,
                num_gpus=GPUS_PER_NODE,
                resources={**per_gpu, _marker(name): 1},
                labels={"triton-host": name},
            )
        os.environ.pop("CUDA_VISIBLE_DEVICES")
        ray.init(address=cluster.address, namespace="serve")
        names = {}
        for node in ray.nodes():
            for name in ("head", *GPU_NODES):
                if _marker(name) in node.get("Resources", {}):
                    names[node["NodeID"]] = name
        assert sorted(names.values()) == ["head", *GPU_NODES], ray.nodes()
        serve.start(proxy_location="Disabled")
        yield SimCluster(cluster.address, names)
    finally:
        try:
            if ray.is_initialized():
                serve.shutdown()
                ray.shutdown()
        finally:
            if cluster is not None:
                cluster.shutdown()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            shutil.rmtree(tmp, ignore_errors=True)
