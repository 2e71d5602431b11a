"""The RayService of deploy/k8s deployed as KubeRay deploys it, on nodes with addresses of their own.

KubeRay starts each pod's Ray node with ``ray start`` and the group's ``rayStartParams`` as flags,
then, once the head is ready, sends ``serveConfigV2`` to the head's dashboard (Serve's REST API, what
``serve deploy`` uses).  This fixture does the same from the manifest itself: a head (its
``rayStartParams``: no CPUs, the dashboard), two pods of the ``gateway`` group and one of the ``gpu``
group (a fake GPU), each a network namespace on a bridge (``../netns.py``); then ``serve deploy`` of
the manifest's ``serveConfigV2`` to the head's dashboard, with two settings an operator sets for
this cluster: the model repository's path and one gateway replica per gateway pod.  The nodes
share ``../conftest.py``'s token authentication and teardown by PID.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from scripts import example_models
from tests.multinode.conftest import RAY_PORT, REPO_ROOT, START_TIMEOUT_S, cluster_env, wait_until
from tests.multinode.netns import Network, Node, unavailable_reason

MANIFEST = REPO_ROOT / "deploy" / "k8s" / "rayservice.yaml"
DASHBOARD_PORT = 8265
GROUPS = ("head", "gateway", "gateway", "gpu")  # one node each, in this order
GPU_NODE_CPUS = 4  # a pod's CPU limit, which Ray would read from the container (here, none)

GPU_MODEL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = args["model_instance_kind"] + ":" + args["model_instance_device_id"]

    def execute(self, requests):
        out = np.array([self.device.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("DEVICE", out)]) for _ in requests]
"""


def rayservice() -> dict[str, Any]:
    return dict(yaml.safe_load(MANIFEST.read_text()))


def start_params(group: str) -> dict[str, str]:
    """A group's ``rayStartParams`` as KubeRay passes them to ``ray start``: each value as bash reads it."""
    spec = rayservice()["spec"]["rayClusterConfig"]
    if group == "head":
        params = spec["headGroupSpec"]["rayStartParams"]
    else:
        (worker,) = [g for g in spec["workerGroupSpecs"] if g["groupName"] == group]
        params = worker["rayStartParams"]
    return {key: " ".join(shlex.split(value)) for key, value in params.items()}


def serve_config(repo: pathlib.Path, gateways: int) -> dict[str, Any]:
    config = dict(yaml.safe_load(rayservice()["spec"]["serveConfigV2"]))
    (app,) = config["applications"]
    app["args"].update(model_repository=str(repo), gateway_replicas=gateways)
    return config


def build_repository(repo: pathlib.Path) -> None:
    example_models.add_sub(repo, extra_config="instance_group [ { kind: KIND_CPU count: 1 } ]\n")
    d = repo / "on_gpu"
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(GPU_MODEL_PY.lstrip())
    (d / "config.pbtxt").write_text(
        'name: "on_gpu"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "DEVICE" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
    )


@dataclass
class KubeRayCluster:
    net: Network
    tmp: pathlib.Path
    env: dict[str, str]
    groups: dict[str, str]  # node name -> group

    @property
    def head(self) -> Node:
        return self.net.nodes[0]

    def nodes_of(self, group: str) -> list[Node]:
        return [n for n in self.net.nodes if self.groups[n.name] == group]

    @property
    def dashboard(self) -> str:
        return f"http://{self.head.address}:{DASHBOARD_PORT}"

    def log(self, node: Node) -> pathlib.Path:
        return self.tmp / f"{node.name}.log"

    def start_node(self, node: Node, group: str) -> None:
        env = dict(self.env, RAY_TMPDIR=str(self.tmp / node.name))
        os.makedirs(env["RAY_TMPDIR"], exist_ok=True)
        params = start_params(group)
        if group == "gpu":
            params.setdefault("num-cpus", str(GPU_NODE_CPUS))
            env["CUDA_VISIBLE_DEVICES"] = "0"
        flags = [f"--{key}={value}" for key, value in params.items()]
        common = ["--node-ip-address", node.address, "--disable-usage-stats", "--block"]
        common += ["--object-store-memory", str(128 * 1024 * 1024)]
        if group == "head":
            head = ["--head", f"--port={RAY_PORT}", f"--dashboard-port={DASHBOARD_PORT}"]
            cmd = ["ray", "start", *head, *flags, *common]
        else:
            cmd = ["ray", "start", f"--address={self.head.address}:{RAY_PORT}", *flags, *common]
        proc = self.net.popen(node, cmd, str(self.log(node)), env)

        def joined() -> bool:
            if proc.poll() is not None:
                log = self.log(node).read_text()[-3000:]
                pytest.fail(f"`ray start` on {node.name} exited ({proc.returncode}):\n{log}")
            return self.alive() >= len([n for n in self.net.nodes if n.procs])

        wait_until(joined, START_TIMEOUT_S, f"{node.name} ({group}) joined", poll_s=2.0)

    def alive(self) -> int:
        """Alive nodes, as the head's dashboard reports them (the dashboard being up is part of it)."""
        out = self.net.run(
            self.head,
            [sys.executable, "-c", f"import ray;ray.init(address='{self.head.address}:{RAY_PORT}',"
             "logging_level='ERROR');print(sum(n['Alive'] for n in ray.nodes()))"],
            dict(self.env, RAY_TMPDIR=str(self.tmp / self.head.name)),
            120,
        )  # fmt: skip
        # The count is the last line of digits: Ray may print warnings of its own to the same output.
        counts = [line.strip() for line in out.splitlines() if line.strip().isdigit()]
        return int(counts[-1]) if counts else 0

    def serve_deploy(self, config: dict[str, Any]) -> None:
        """``serve deploy`` of a Serve config file to the head's dashboard, from outside the cluster."""
        path = self.tmp / "serve_config.yaml"
        path.write_text(yaml.safe_dump(config))
        done = subprocess.run(
            ["serve", "deploy", str(path), "--address", self.dashboard],
            capture_output=True, text=True, env=self.env, timeout=120,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.fail(f"serve deploy failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")

    def applications(self) -> dict[str, Any]:
        """Serve's REST view of the applications (what KubeRay polls for the RayService's status)."""
        done = subprocess.run(
            ["serve", "status", "--address", self.dashboard], capture_output=True, text=True, env=self.env, timeout=60
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        return dict(yaml.safe_load(done.stdout).get("applications") or {})


@pytest.fixture(scope="package")
def kuberay() -> Iterator[KubeRayCluster]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"multi-node tests need network namespaces: {reason}")
    if shutil.which("ray") is None or shutil.which("serve") is None:
        pytest.skip("the KubeRay deploy test needs Ray's `ray` and `serve` commands on PATH")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="kr_", dir="/tmp"))
    env = cluster_env(tmp)
    try:
        net = Network(len(GROUPS))
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.fail(f"building the nodes' network failed: {exc}")
    cluster = KubeRayCluster(net, tmp, env, {n.name: g for n, g in zip(net.nodes, GROUPS, strict=True)})
    try:
        build_repository(tmp / "models")
        for node in net.nodes:
            cluster.start_node(node, cluster.groups[node.name])
        cluster.serve_deploy(serve_config(tmp / "models", len(cluster.nodes_of("gateway"))))
        yield cluster
    finally:
        net.close()
        if not os.environ.get("MULTINODE_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)


def dumps(value: object) -> str:
    return json.dumps(value, indent=1, default=str)[:4000]
