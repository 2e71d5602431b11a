"""A real four-node Ray cluster on this machine, each node at an address of its own, and serve_app on it.

The nodes are network namespaces on a bridge (``netns.py``).  ``n1`` runs the Ray
head and the server's driver (``python -m serve_app --address ...``, as a user
runs it on a head node); ``n2`` to ``n4`` are workers with two fake GPUs each
(Ray's ``GPU`` resource and ``gpu_idx_<i>``, as an operator declares them).  The
server loads the ``models.LOADED`` models at start and others on demand, under a
per-node budget (``SERVER_ARGS``); ``cluster_of`` and ``start_server`` also serve
``scripts/bench_on_demand.py --nodes``.
``ray start --head`` turns on Ray's token authentication, so every node and the
driver get ``RAY_AUTH_MODE=token`` and one token file of ours.  Each node keeps
its Ray files in a directory of its own (``RAY_TMPDIR``): the namespaces share
the filesystem (and the hostname); ``MULTINODE_SHARED_TMPDIR=1`` gives them one
temporary directory instead, as containers sharing a host's /tmp have.
Teardown kills every process inside the namespaces by PID (``ip netns pids``)
and removes the namespaces, the veths and the bridge, also when a test or the
start failed (``MULTINODE_KEEP=1`` keeps the logs under /tmp/mn_*).  Where
namespaces cannot be made (not root, no ``ip``, no permission, no bridge) every
test here is skipped, saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from tests.multinode import models
from tests.multinode.netns import Network, Node, unavailable_reason

# The model manager and the sequence router land on any node; with three workers at least one holds
# neither, so the fault tests always have a worker to kill whose loss the server is built to survive.
NODES = 4
RAY_PORT = 6379
_RESULT = "RESULT:"  # the line of a Ray script's output that carries its answer
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
NODE_CPUS = 4  # logical CPUs per node (the machine has 2 cores; everything here reserves a small share)
GPUS_PER_WORKER = 2
START_TIMEOUT_S = 300.0
# The variant whose nodes share one temporary directory (Ray's and serve_app's files), as containers that
# share a host's /tmp do; per-node state must then be told apart by the Ray node, not by the path.
SHARED_TMPDIR = os.environ.get("MULTINODE_SHARED_TMPDIR") == "1"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def wait_until(check: Callable[[], object], timeout_s: float, what: str, poll_s: float = 0.5) -> object:
    """``check()``'s first truthy answer; fails the test saying what did not happen (and the last error)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            answer = check()
            if answer:
                return answer
            last = answer
        except Exception as exc:
            last = exc
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g}s (last: {last!r})")
        time.sleep(poll_s)


def http_ready(address: str, timeout_s: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}:{HTTP_PORT}/v2/health/ready", timeout=timeout_s) as r:
            return bool(r.status == 200)
    except Exception:
        return False


@dataclass
class MultiNode:
    net: Network
    tmp: pathlib.Path
    env: dict[str, str]
    repo: pathlib.Path
    driver_log: pathlib.Path

    @property
    def nodes(self) -> list[Node]:
        return self.net.nodes

    @property
    def head(self) -> Node:
        return self.net.nodes[0]

    def node_log(self, node: Node) -> pathlib.Path:
        return self.tmp / f"{node.name}.log"

    def node_tmp(self, node: Node) -> pathlib.Path:
        """A node's temporary directory: its own, as on a machine of its own; with ``MULTINODE_SHARED_TMPDIR=1``
        one for all, as containers sharing a host's /tmp (and hostname) have it."""
        return self.tmp / "shared" if SHARED_TMPDIR else self.tmp / node.name

    def start_ray(self, node: Node) -> None:
        """``ray start --block`` inside ``node``: the head on n1, a worker elsewhere."""
        env = dict(self.env, RAY_TMPDIR=str(self.node_tmp(node)), TMPDIR=str(self.node_tmp(node)))
        os.makedirs(env["RAY_TMPDIR"], exist_ok=True)
        common = [
            "--node-ip-address", node.address, "--num-cpus", str(NODE_CPUS), "--disable-usage-stats",
            "--object-store-memory", str(128 * 1024 * 1024), "--block",
        ]  # fmt: skip
        if node is self.head:
            cmd = ["ray", "start", "--head", "--port", str(RAY_PORT), "--include-dashboard", "false", *common]
        else:
            gpus = {f"gpu_idx_{i}": 1 for i in range(GPUS_PER_WORKER)}
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(GPUS_PER_WORKER))
            cmd = [
                "ray", "start", "--address", f"{self.head.address}:{RAY_PORT}", "--num-gpus", str(GPUS_PER_WORKER),
                "--resources", json.dumps(gpus), *common,
            ]  # fmt: skip
        self.net.popen(node, cmd, str(self.node_log(node)), env)

    def ray_script(self, code: str, timeout_s: float = 120.0) -> str:
        """Run Python ``code`` as a Ray driver on the head node (``ray`` connected); its stdout."""
        prelude = f"import ray, json\nray.init(address='{self.head.address}:{RAY_PORT}', logging_level='ERROR')\n"
        env = dict(self.env, RAY_TMPDIR=str(self.node_tmp(self.head)))
        return self.net.run(self.head, [sys.executable, "-c", prelude + code], env, timeout_s)

    def ray_result(self, code: str, value: str) -> Any:
        """Run ``code`` as :meth:`ray_script` does, then the JSON of the expression ``value`` it leaves.  Found by a
        marker: Ray may print warnings of its own to the same output (a busy machine's "lagging heartbeats")."""
        out = self.ray_script(f"{code}\nprint({_RESULT!r} + json.dumps({value}))\n")
        lines = [line for line in out.splitlines() if line.startswith(_RESULT)]
        assert lines, f"the script printed no result: {out!r}"
        return json.loads(lines[-1][len(_RESULT) :])

    def alive_nodes(self) -> dict[str, bool]:
        """Ray's view: node address -> alive."""
        nodes = self.ray_result("", "{n['NodeManagerAddress']: n['Alive'] for n in ray.nodes()}")
        seen: dict[str, bool] = {}
        for address, alive in nodes.items():
            seen[address] = seen.get(address, False) or bool(alive)
        return seen

    def actors_by_node(self) -> dict[str, list[str]]:
        """Alive actors' class names on each node address (Serve replicas are named after the deployment)."""
        code = (  # the GCS's actor table (Ray's state API needs the dashboard, which these nodes do not run)
            "from ray._private.state import actors\n"
            "out = {}\n"
            "for a in actors().values():\n"
            "    if a['State'] == 'ALIVE':\n"
            "        out.setdefault(a['Address']['IPAddress'], []).append(a['Name'] or a['ActorClassName'])\n"
        )
        return dict(self.ray_result(code, "out"))

    def placement(self, deployment: str, app: str) -> list[dict[str, object]]:
        """Every instance the replicas of a host deployment hold: model, kind, node_ip, ... (``placement()``)."""
        code = (
            "from ray import serve\n"
            f"handle = serve.get_deployment_handle('{deployment}', '{app}')\n"
            "parts = handle.broadcast('placement').results(timeout_s=60)\n"
        )
        return list(self.ray_result(code, "[i for part in parts for i in part]"))


def start_server(cluster: MultiNode, server_args: Sequence[str]) -> None:
    """Ray on every node, then ``python -m serve_app`` on the head with a gateway per node and
    ``server_args``; returns once it is ready."""
    # One node at a time: the nodes share the head's session directory (Ray keeps it cluster-wide), and two
    # raylets starting together on one machine may race for its files.
    for node in cluster.nodes:
        cluster.start_ray(node)
        wait_until(
            lambda a=node.address: cluster.alive_nodes().get(a),
            START_TIMEOUT_S,
            f"Ray node {node.name} at {node.address} alive (log {cluster.node_log(node)})",
            poll_s=2.0,
        )
    cmd = [
        sys.executable, "-m", "serve_app", "--address", f"{cluster.head.address}:{RAY_PORT}",
        "--model-repository", str(cluster.repo), "--gateway-replicas", str(len(cluster.nodes)), *server_args,
    ]  # fmt: skip
    env = dict(cluster.env, RAY_TMPDIR=str(cluster.node_tmp(cluster.head)))
    driver = cluster.net.popen(cluster.head, cmd, str(cluster.driver_log), env)

    def ready() -> bool:
        if driver.poll() is not None:
            pytest.fail(f"the server exited ({driver.returncode}):\n{cluster.driver_log.read_text()[-5000:]}")
        return b"serve_app ready" in cluster.driver_log.read_bytes()

    wait_until(ready, START_TIMEOUT_S, f"serve_app ready (log {cluster.driver_log})", poll_s=1.0)


def cluster_env(tmp: pathlib.Path) -> dict[str, str]:
    """The environment of every node's Ray and of the drivers: one auth token (in ``tmp``), this checkout
    first on the path, and nothing of a Ray cluster this process may know of."""
    token = tmp / "token"
    token.write_text(secrets.token_hex(32))
    env = dict(os.environ)
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
        PYTHONUNBUFFERED="1",
        RAY_DEDUP_LOGS="0",
    )
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "CUDA_VISIBLE_DEVICES"):
        env.pop(key, None)
    return env


@contextlib.contextmanager
def cluster_of(nodes: int) -> Iterator[MultiNode]:
    """``nodes`` nodes with no Ray yet (:func:`start_server` starts it); everything goes at the end."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="mn_", dir="/tmp"))  # short: Ray's socket paths
    env = cluster_env(tmp)
    try:
        net = Network(nodes)
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        yield MultiNode(net, tmp, env, tmp / "models", tmp / "server.log")
    finally:
        net.close()
        if not os.environ.get("MULTINODE_KEEP"):  # set it to keep the nodes' and the server's logs
            shutil.rmtree(tmp, ignore_errors=True)


SERVER_ARGS = (
    "--model-control-mode", "explicit", *[a for m in models.LOADED for a in ("--load-model", m)],
    "--allow-client-shm", "--load-on-demand", "--max-loaded-models-per-node", str(models.BUDGET),
    "--on-demand-min-resident-s", "0",
)  # fmt: skip


@pytest.fixture(scope="package")  # gone before the rest of the suite runs
def multinode() -> Iterator[MultiNode]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"multi-node tests need network namespaces: {reason}")
    if shutil.which("ray") is None:
        pytest.skip("multi-node tests need Ray's `ray` command on PATH")
    with contextlib.ExitStack() as stack:  # the nodes go however the start or the tests end
        try:
            cluster = stack.enter_context(cluster_of(NODES))
        except Exception as exc:
            pytest.fail(f"building the nodes' network failed: {exc}")
        models.build(cluster.repo, cluster.head.address)
        start_server(cluster, SERVER_ARGS)
        yield cluster
