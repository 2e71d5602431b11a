"""A dedicated replica: one Ray Serve replica = one Triton model instance, in a process of its own.

Models that Serve autoscales, or that ask for a process of their own, run
here; the others share hosts (``host_replica.py``).  The replica never fails
its constructor over the model: a load error is kept and reported
(``status``) so that one bad model does not fail the whole Serve
application; its requests get UNAVAILABLE with the reason.  Its one
instance is a :class:`~serve_app.hosting.HostedInstance`, so batches, sequence
steps and the router's polls reach it over the direct channel exactly as they
reach an instance in a shared host.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid

from serve_app.hosting import HostedInstance, InstanceHost, InstanceLoad
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.keys import ModelKey
from serve_app.observability import python_logging
from serve_app.placement import InstanceSpec
from serve_app.rayserve.gateway_link import GatewayLink
from serve_app.rayserve.shutdown import StopsOnShutdown
from serve_app.runtime import ModelInstance
from serve_app.transport import ChannelServer

# Below Serve's graceful_shutdown_timeout_s (model_apps.GRACEFUL_SHUTDOWN_S), which kills the actor.
GRACEFUL_WAIT_S = 27.0


class ModelReplica(StopsOnShutdown):
    def __init__(
        self,
        model_name: str,
        version: int,
        config_bytes: bytes,
        model_file: str,
        kind: str,
        channel_token: bytes = b"",
        spec: InstanceSpec | None = None,
        generation: int = 0,
        server_app: str = "",
    ) -> None:
        """``server_app``: the server's Serve application, whose gateways answer a Python model's BLS calls."""
        # Devices first, before anything can initialise CUDA in this process.
        spec = spec or InstanceSpec(model_name)
        python_logging.install_from_env()  # the model's log (pb_utils.Logger) as the server's settings say
        gpu_ids = set_visible_devices(kind, spec.device)
        self._spec = spec
        self._kind = kind
        self._gpu_ids = gpu_ids
        self.instance_name = _instance_name(spec, kind)
        self.name = model_name
        self.version = version
        load = InstanceLoad(ModelKey(model_name, version, generation), config_bytes, model_file, kind, spec)
        self._link = GatewayLink(server_app, channel_token) if server_app else None
        self.one = HostedInstance(load, uuid.uuid4().hex, self.instance_name, gpu_ids, self._link)
        self.instance_id = self.one.id
        self.one.start_blocking()
        self.host = InstanceHost(self.instance_id, gpu_ids)
        self.host.adopt(self.one)
        self._token = channel_token
        self._channel: ChannelServer | None = None
        self._address: tuple[str, int] | None = None
        self._lane: str | None = None  # learned on the first ask for targets

    @property
    def instance(self) -> ModelInstance | None:
        return self.one.instance

    @property
    def load_error(self) -> str:
        return self.one.load_error

    def _bind(self) -> None:
        """The replica's event loop, where the model's BLS calls run (learned on its first call)."""
        if self._link is not None:
            self._link.bind(asyncio.get_running_loop())

    async def execute(self, executions: list[Execution]) -> list[ExecutionResult]:
        """Run the executions one call carries, in order, on this instance (the Serve-handle path)."""
        self._bind()
        return await self.one.execute(executions)

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """This instance's load for the model's autoscaling policy (Serve can't see channel traffic)."""
        return self.one.metrics()

    async def prepare_unload(self) -> None:
        """The model is being unloaded: stop at once when asked, live sequences or not."""
        self.one.unloading = True

    async def stop_once(self) -> None:
        """Stopping (scaled down, reloaded or unloaded): finish the batches in progress and, when only
        scaled down, let live sequences end; new batches are refused with Draining, which gateways
        send to another instance.  Then the instance closes (a Python model's ``finalize``), off the loop."""
        await self.one.stop(time.monotonic() + GRACEFUL_WAIT_S)
        if self._channel is not None:
            self._channel.close()
        await asyncio.to_thread(self.one.close)

    async def channel_address(self) -> tuple[str, int] | None:
        """Where the gateway can reach ``execute`` directly (opened on first ask); None without a token."""
        if not self._token:
            return None
        self._bind()
        if self._address is None:
            import ray

            self._channel = ChannelServer(self.host.on_channel, self._token)
            self._address = await self._channel.start(ray.util.get_node_ip_address())
        return self._address

    async def targets(
        self, label: str = "", generation: int = -1, sequences: bool = False
    ) -> list[tuple[str, str, int, str]]:
        """(instance id, host, port, lane) of this replica's instance, for gateways (and, with ``sequences``, for
        the sequence router: only a loaded sequence instance).  ``lane``: "<node id>:<Unix socket path>" where
        gateways on this node can send batches straight to the instance's thread ("" when it has none)."""
        address = await self.channel_address()
        if address is None or (sequences and self.one.sequence is None):
            return []
        if self._lane is None:
            import ray

            path = self.one.open_lane(self._token)
            self._lane = f"{ray.get_runtime_context().get_node_id()}:{path}" if path else ""
        return [(self.instance_id, address[0], address[1], self._lane)]

    async def warmup_figures(self, label: str = "", generation: int = -1) -> list[tuple[int, int, int, int]]:
        """What this instance's warmup executed (Triton counts warmup in the model's statistics)."""
        return self.one.warmup_figures

    async def placement(self) -> dict[str, object]:
        """Where this instance runs: its node, Triton instance name and devices (for operators and tests)."""
        import ray

        ctx = ray.get_runtime_context()
        # GPU ids Ray assigned (strings when Ray read them from CUDA_VISIBLE_DEVICES); ints where numeric.
        ray_gpu_ids = [int(g) if str(g).isdigit() else g for g in ray.get_gpu_ids()]
        device = self._spec.device
        if device is None and self._kind == "KIND_GPU" and ray_gpu_ids:
            device = ray_gpu_ids[0]  # the GPU Ray picked
        return {
            "model": self.name,
            "version": self.version,
            "group": self._spec.group_name,
            "instance_name": self.instance_name,
            "kind": self._kind,
            "device": device,
            "gpu_ids": list(self._gpu_ids),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ray_gpu_ids": ray_gpu_ids,
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "loaded": self.instance is not None,
        }

    async def status(self) -> tuple[bool, str]:
        return self.instance is not None, self.load_error


def set_visible_devices(kind: str, device: int | None) -> tuple[int, ...]:
    """Set ``CUDA_VISIBLE_DEVICES`` for a process whose instances are of ``kind`` (pinned to ``device``),
    before anything initialises CUDA; returns the device ordinals the process then sees."""
    if kind == "KIND_CPU":
        # Ray no longer clears CUDA_VISIBLE_DEVICES for replicas without GPUs.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif kind == "KIND_GPU" and device is not None:
        # Placed by the per-GPU resource '<prefix><device>': Ray assigned no GPU, the index is ours to set.
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    if kind != "KIND_GPU":
        return ()
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    return tuple(range(len(visible))) or (0,)


def _instance_name(spec: InstanceSpec, kind: str) -> str:
    """Triton's ``<group name>_<n>``: ``n`` is this replica's Serve rank in its deployment, or, for a
    deployment pinned to one GPU index, its rank on its node (so ``0..count-1`` on each GPU, as in Triton)."""
    rank = _replica_rank()
    if rank is None:
        return spec.instance_name(0)
    global_rank, local_rank = rank
    return spec.instance_name(local_rank if kind == "KIND_GPU" and spec.device is not None else global_rank)


def _replica_rank() -> tuple[int, int] | None:
    """(rank, rank on this node) of the Serve replica running this code; None outside Serve."""
    if "ray" not in sys.modules:
        return None
    try:
        from ray import serve

        rank = serve.get_replica_context().rank
        return int(rank.rank), int(rank.local_rank)
    except Exception:
        return None
