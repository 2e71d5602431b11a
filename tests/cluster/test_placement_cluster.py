"""instance_group -> Serve replicas on a simulated cluster: where each replica landed, and with which GPU.

One application built by ``build_application`` over a small repository with varied
instance groups is deployed on the cluster of ``conftest.py`` (head without GPUs,
node-b and node-c with GPUs 0-3 declared as ``gpu_idx_<i>``); every replica answers
``placement()`` (node, Triton instance name, CUDA_VISIBLE_DEVICES, Ray's GPU ids).
The ONNX Runtime here has no CUDA provider, so GPU instances report a load error;
placement is all these tests look at (and the failures of invalid groups).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import time
import urllib.request
from typing import Any

import pytest

from scripts import example_models
from serve_app.placement import ClusterGpus, instance_spec, plan_replicas
from serve_app.settings import ServerSettings
from tests.cluster.conftest import GPU_NODES, GPU_RESOURCE_PREFIX, GPUS_PER_NODE, SimCluster
from tests.support.net import free_port

APP = "placement"
ALL_GPUS = ",".join(str(i) for i in range(GPUS_PER_NODE))

# model -> instance_group text
MODELS = {
    # count 2 on GPU 1 of each node (sharing it), and a KIND_AUTO group on GPU 2 of each node
    "pinned": 'instance_group [ { name: "pair" kind: KIND_GPU count: 2 gpus: [ 1 ] },'
    " { kind: KIND_AUTO count: 1 gpus: [ 2 ] } ]",
    # no instance_group: Triton's default, one instance on every GPU
    "everywhere": "",
    "cpu_only": "instance_group [ { kind: KIND_CPU count: 2 } ]",
    "backend_picks": "instance_group [ { kind: KIND_MODEL count: 1 } ]",
    # invalid groups: each fails its own model's load
    "bad_cpu_gpus": "instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]",
    "bad_gpu_id": "instance_group [ { kind: KIND_GPU gpus: [ 1, 7 ] } ]",
    "bad_count": "instance_group [ { kind: KIND_CPU count: -1 } ]",
}
FAILURES = {
    "bad_cpu_gpus": "kind KIND_CPU must not list 'gpus'",
    "bad_gpu_id": "specifies invalid or unsupported gpu id 7",
    "bad_count": "count",
}


def settings_for(repo: pathlib.Path, app: str) -> ServerSettings:
    return ServerSettings(
        model_repository=str(repo),
        host="127.0.0.1",
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        instance_cpus=0.1,
        shared_hosts=False,  # each instance a replica: placement() reports each one (hosts: test_host_pools.py)
        app_name=app,
        gpu_resource_prefix=GPU_RESOURCE_PREFIX,
        keep_failed_instances=True,  # GPU instances fail to load here (no CUDA): placement is what we look at
    )


def write_repo(root: pathlib.Path, models: dict[str, str]) -> pathlib.Path:
    for name, groups in models.items():
        example_models.add_sub(root, name=name, dims=4, extra_config=groups + "\n" if groups else "")
    return root


def model_app(app: str, deployment: str) -> str:
    """The Serve application the server ``app`` runs ``deployment`` in (one per deployment), or ``app``."""
    from ray import serve

    prefix = f"{app}--{deployment}--"
    names = [n for n in serve.status().applications if n.startswith(prefix)]
    return names[0] if names else app


def plan_report(repo: pathlib.Path, settings: ServerSettings, gpus: ClusterGpus) -> list[str]:
    """What the model manager logs when it plans the repository's models on ``gpus``."""
    from serve_app.errors import ServeError
    from serve_app.placement import plan_placement
    from serve_app.repository import ModelRepository

    report, sources = [], {}
    for name, source in ModelRepository(repo).load_all().items():
        if isinstance(source, ServeError):
            report.append(f"model '{name}': failed to load: {source.message}")
        else:
            sources[name] = source
    plan = plan_placement(sources, dict.fromkeys(sources, 0), settings, gpus, {})
    return report + plan.messages + [f"model '{n}': failed to load: {r}" for n, r in plan.failed.items()]


def placements(app: str, deployment: str, replicas: int, cluster: SimCluster) -> list[dict[str, Any]]:
    """Every replica's ``placement()``, with its node's name (waits until the handle sees them all)."""
    from ray import serve

    handle = serve.get_deployment_handle(deployment, model_app(app, deployment))
    deadline = time.monotonic() + 60
    while True:
        found = handle.broadcast("placement").results(timeout_s=30)
        if len(found) >= replicas or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(found) == replicas, (deployment, found)
    return [dict(p, node=cluster.node_names[p["node_id"]]) for p in found]


def per_node(found: list[dict[str, Any]]) -> dict[str, list[str]]:
    """node -> sorted instance names there."""
    out = collections.defaultdict(list)
    for p in found:
        out[p["node"]].append(p["instance_name"])
    return {n: sorted(v) for n, v in sorted(out.items())}


@dataclasses.dataclass
class Deployed:
    settings: ServerSettings
    report: list[str]
    cluster: SimCluster


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_repo(tmp_path_factory.mktemp("placement_repo"), MODELS)


@pytest.fixture(scope="module")
def deployed(gpu_cluster: SimCluster, repo: pathlib.Path) -> Deployed:
    from ray import serve

    from serve_app.rayserve.app_builder import build_application
    from serve_app.rayserve.cluster import cluster_gpus

    settings = settings_for(repo, APP)
    app = build_application(settings)
    serve.run(app, name=APP, route_prefix=None)
    report = plan_report(repo, settings, cluster_gpus(GPU_RESOURCE_PREFIX))
    return Deployed(settings, report, gpu_cluster)


# --- placement of each kind -------------------------------------------------------------------


def test_count_per_listed_gpu_on_every_node_with_that_gpu(deployed: Deployed) -> None:
    found = placements(APP, "pinned.v1.g0.gpu1", 4, deployed.cluster)
    # 2 instances on GPU 1 of each node, named like Triton's: <group name>_<n>, n in 0..count-1
    assert per_node(found) == {n: ["pair_0", "pair_1"] for n in GPU_NODES}
    for p in found:
        assert (p["kind"], p["group"], p["device"]) == ("KIND_GPU", "pair", 1)
        assert p["cuda_visible_devices"] == "1"  # set by the replica itself
        assert p["gpu_ids"] == [0]  # the backend's ordinal among the visible devices
        assert p["ray_gpu_ids"] == []  # Ray's GPU resource is not what placed it


def test_auto_group_listing_an_existing_gpu_is_a_gpu_group(deployed: Deployed) -> None:
    found = placements(APP, "pinned.v1.g1.gpu2", 2, deployed.cluster)
    assert per_node(found) == {n: ["pinned_1_0"] for n in GPU_NODES}  # unnamed group 1: <model>_1
    assert {(p["kind"], p["device"], p["cuda_visible_devices"]) for p in found} == {("KIND_GPU", 2, "2")}


def test_default_group_is_one_instance_on_every_gpu(deployed: Deployed) -> None:
    for gpu in range(GPUS_PER_NODE):
        found = placements(APP, f"everywhere.v1.g0.gpu{gpu}", len(GPU_NODES), deployed.cluster)
        assert per_node(found) == {n: ["everywhere_0"] for n in GPU_NODES}  # the default group: named after the model
        assert {(p["kind"], p["device"], p["cuda_visible_devices"]) for p in found} == {("KIND_GPU", gpu, str(gpu))}


def test_cpu_instances_on_gpu_nodes_see_no_gpu(deployed: Deployed) -> None:
    found = placements(APP, "cpu_only.v1.g0", 2, deployed.cluster)
    assert sorted(p["instance_name"] for p in found) == ["cpu_only_0_0", "cpu_only_0_1"]
    for p in found:
        assert p["node"] in GPU_NODES  # the head has no CPUs for replicas
        assert (p["kind"], p["device"], p["cuda_visible_devices"], p["ray_gpu_ids"]) == ("KIND_CPU", None, "", [])
        assert p["loaded"]


def test_model_kind_keeps_the_devices_the_node_shows(deployed: Deployed) -> None:
    (p,) = placements(APP, "backend_picks.v1.g0", 1, deployed.cluster)
    assert (p["kind"], p["instance_name"], p["device"]) == ("KIND_MODEL", "backend_picks_0_0", None)
    assert p["cuda_visible_devices"] == ALL_GPUS  # the backend picks its devices
    assert p["ray_gpu_ids"] == []


def test_each_gpu_is_split_among_its_instances_and_fully_reserved(deployed: Deployed) -> None:
    import ray

    # GPU 1 of each node: pair x2 + everywhere (1/3 each); GPU 2: pinned_1 + everywhere (1/2); GPUs 0, 3: 1.
    assert "deploying (4x KIND_GPU on GPU 1 (2 per node), 2x KIND_GPU on GPU 2 (1 per node))" in " ".join(
        deployed.report
    )
    available = ray.available_resources()
    for gpu in range(GPUS_PER_NODE):
        assert available.get(f"{GPU_RESOURCE_PREFIX}{gpu}", 0) < 0.001, (gpu, available)
    assert available.get("GPU") == len(GPU_NODES) * GPUS_PER_NODE  # pinned replicas don't take Ray's GPUs


# --- invalid groups -----------------------------------------------------------------------------


def test_invalid_groups_fail_their_model_only(deployed: Deployed) -> None:
    failed = {line.split("'")[1]: line for line in deployed.report if "failed to load" in line}
    assert set(failed) == set(FAILURES)
    for model, reason in FAILURES.items():
        assert reason in failed[model], failed[model]
    s = deployed.settings
    request = urllib.request.Request(f"http://127.0.0.1:{s.http_port}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as r:
        index = {m["name"]: m for m in json.loads(r.read())}
    assert set(index) == set(MODELS)
    for model, reason in FAILURES.items():
        assert index[model]["state"] == "UNAVAILABLE" and reason in index[model]["reason"], index[model]
    assert index["cpu_only"]["state"] == "READY"


def test_gpu_lists_without_per_gpu_resources_fail_with_how_to_declare_them(repo: pathlib.Path) -> None:
    """The same repository on a cluster whose GPUs have no gpu_idx_<i> resources (no deployment needed)."""
    text = "\n".join(plan_report(repo, settings_for(repo, "unused"), ClusterGpus(total=8)))
    assert "model 'pinned': failed to load: " in text
    assert "declare no per-GPU resources ('gpu_idx_<index>')" in text
    assert "model 'everywhere' version 1: deploying (8x KIND_GPU (1 GPU each))" in text  # Ray picks the GPUs


# --- KIND_AUTO without GPUs, and GPUs picked by Ray -------------------------------------------


def test_auto_resolving_to_cpu_hides_the_nodes_gpus(gpu_cluster: SimCluster, tmp_path: pathlib.Path) -> None:
    """A cluster that Ray says has no GPUs (``gpus=ClusterGpus(0)``): KIND_AUTO becomes KIND_CPU, and the
    replica, on a node whose processes do see GPUs, hides them."""
    from ray import serve

    from serve_app.rayserve.app_builder import build_application

    repo = write_repo(tmp_path, {"auto": "instance_group [ { kind: KIND_AUTO count: 1 } ]"})
    app = build_application(settings_for(repo, "no_gpus"), gpus=ClusterGpus(0))
    serve.run(app, name="no_gpus", route_prefix=None)
    try:
        (p,) = placements("no_gpus", "auto.v1.g0", 1, gpu_cluster)
        assert p["node"] in GPU_NODES
        assert (p["kind"], p["instance_name"], p["cuda_visible_devices"], p["ray_gpu_ids"]) == (
            "KIND_CPU",
            "auto_0_0",
            "",
            [],
        )
    finally:
        serve.delete("no_gpus")


def test_without_pinning_ray_picks_the_gpu_and_the_replica_reports_it(
    gpu_cluster: SimCluster, tmp_path: pathlib.Path
) -> None:
    """The placement used when the nodes declare no per-GPU resources: ``num_gpus``, and Ray picks."""
    from ray import serve

    from serve_app.rayserve.app_builder import replica_options
    from serve_app.rayserve.model_replica import ModelReplica
    from serve_app.repository import ModelRepository

    example_models.add_sub(tmp_path, name="loose", dims=4)
    source = ModelRepository(tmp_path).load("loose")
    config, model_file = source.config, source.versions[1]
    (group,) = plan_replicas(config, ClusterGpus(total=1), cpus_per_instance=0.1)  # one instance, a whole GPU
    settings = settings_for(tmp_path, "ray_picks")
    app = (
        serve.deployment(ModelReplica)
        .options(name="loose", **replica_options(group, settings))
        .bind("loose", 1, config.SerializeToString(), str(model_file), group.kind, b"", instance_spec(group))
    )
    serve.run(app, name="ray_picks", route_prefix=None)
    try:
        (p,) = placements("ray_picks", "loose", 1, gpu_cluster)
        assert p["node"] in GPU_NODES
        (gpu,) = p["ray_gpu_ids"]
        assert gpu in range(GPUS_PER_NODE)
        assert (p["device"], p["cuda_visible_devices"], p["gpu_ids"]) == (gpu, str(gpu), [0])
        assert p["instance_name"] == "loose_0"
    finally:
        serve.delete("ray_picks")
