"""One Ray Serve replica = one Triton model instance.

The replica never fails its constructor over the model: a load error is kept
and reported (``status``) so that one bad model does not fail the whole Serve
application; its requests get UNAVAILABLE with the reason.

A sequence model's replica also runs its sequence batcher
(:class:`~serve_app.sequence.instance.SequenceInstance`): steps arrive
over the direct channel, already assigned to a slot by the sequence router,
and the router long-polls the same channel for freed slots.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from serve_app.autoscale import LoadMeter
from serve_app.backends import BackendContext
from serve_app.config.state_backup import state_backup_enabled
from serve_app.errors import Draining, Unavailable, as_serve_error
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.placement import InstanceSpec
from serve_app.protos import model_config_pb2 as mc
from serve_app.runtime import ModelInstance
from serve_app.sequence.instance import SequenceInstance
from serve_app.sequence.messages import PollEvents, RestoreSequence, SequenceStep, StepResult
from serve_app.transport import ChannelServer

# Below Serve's graceful_shutdown_timeout_s (model_apps.GRACEFUL_SHUTDOWN_S), which kills the actor.
GRACEFUL_WAIT_S = 27.0


class ModelReplica:
    def __init__(
        self,
        model_name: str,
        version: int,
        config_bytes: bytes,
        model_file: str,
        kind: str,
        channel_token: bytes = b"",
        spec: InstanceSpec | None = None,
    ) -> None:
        # Devices first, before anything can initialise CUDA in this process.
        spec = spec or InstanceSpec(model_name)
        if kind == "KIND_CPU":
            # Ray no longer clears CUDA_VISIBLE_DEVICES for replicas without GPUs.
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        elif kind == "KIND_GPU" and spec.device is not None:
            # Placed by the per-GPU resource '<prefix><device>': Ray assigned no GPU, the index is ours to set.
            os.environ["CUDA_VISIBLE_DEVICES"] = str(spec.device)
        gpu_ids: tuple[int, ...] = ()
        if kind == "KIND_GPU":
            visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
            gpu_ids = tuple(range(len(visible))) or (0,)
        self._spec = spec
        self._kind = kind
        self._gpu_ids = gpu_ids
        self.instance_name = _instance_name(spec, kind)
        self.name = model_name
        self.version = version
        self.load_error: str = ""
        self.instance: ModelInstance | None = None
        config = mc.ModelConfig.FromString(config_bytes)
        ctx = BackendContext(
            model_name=model_name,
            version=version,
            config=config,
            model_file=Path(model_file),
            device_kind=kind,
            gpu_ids=gpu_ids,
            instance_group=spec.group_index,
        )
        # One execution at a time per instance, off the replica's event loop.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{model_name}-exec")
        self.instance_id = uuid.uuid4().hex
        self._meter = LoadMeter(window_s=1.0)  # what autoscaling reads (record_autoscaling_stats)
        self._calls = 0  # batch calls in progress
        self._stopping = False  # Serve is stopping this replica: take no new batches
        self._unloading = False  # the model is unloaded: don't wait for live sequences
        self.sequence: SequenceInstance | None = None
        try:
            instance = ModelInstance(ctx)
            # Triton warms every instance up before it is ready, on the thread that runs its executions;
            # a failing sample fails the load (the model is UNAVAILABLE with that reason).
            try:
                warmup = self._executor.submit(instance.warm_up).result()
            except BaseException:
                instance.close()
                raise
            self.instance = instance
            self._warmup_figures = warmup.figures()
            if warmup.samples or warmup.skipped:
                import logging

                logging.getLogger("ray.serve").info(warmup.describe(model_name, version))
            if config.HasField("sequence_batching"):
                self.sequence = SequenceInstance(
                    config,
                    Path(model_file).parent.parent,
                    self._run_one,
                    instance_id=self.instance_id,
                    backup=state_backup_enabled(config),
                )
        except Exception as exc:
            self.instance = None
            self.load_error = as_serve_error(exc).message
        self._token = channel_token
        self._channel: ChannelServer | None = None
        self._address: tuple[str, int] | None = None

    async def execute(self, executions: list[Execution]) -> list[ExecutionResult]:
        """Run the executions one call carries, in order, on this instance."""
        if self.instance is None:
            err = Unavailable(f"model '{self.name}' version {self.version} failed to load: {self.load_error}")
            return [ExecutionResult(error=err) for _ in executions]
        if self._stopping:
            raise Draining(f"model '{self.name}' version {self.version}: this instance is stopping")
        loop = asyncio.get_running_loop()
        self._calls += 1
        try:
            return await loop.run_in_executor(self._executor, self._run_all, executions, time.perf_counter_ns())
        finally:
            self._calls -= 1

    def _run_all(self, executions: list[Execution], arrived_ns: int) -> list[ExecutionResult]:
        assert self.instance is not None
        for e in executions:
            self._meter.queued(e.queue_ns / 1000)
        self._meter.begin()
        try:
            return self.instance.run_all(executions, arrived_ns)
        finally:
            self._meter.end()

    def _run_step(self, execution: Execution) -> ExecutionResult:
        assert self.instance is not None
        self._meter.begin()
        try:
            return self.instance.run(execution)
        finally:
            self._meter.end()

    async def _run_one(self, execution: Execution) -> ExecutionResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run_step, execution)

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """This instance's load for the model's autoscaling policy (Serve can't see channel traffic)."""
        if self.sequence is not None:
            self._meter.set_slots(self.sequence.live_sequences(), self.sequence.slots)
        return self._meter.metrics()

    async def prepare_unload(self) -> None:
        """The model is being unloaded: stop at once when asked, live sequences or not."""
        self._unloading = True

    async def __del__(self) -> None:
        """Stopping (scaled down, reloaded or unloaded): finish the batches in progress and, when only
        scaled down, let live sequences end; new batches are refused with Draining, which gateways
        send to another instance."""
        self._stopping = True
        deadline = time.monotonic() + GRACEFUL_WAIT_S
        if self.sequence is not None:
            self.sequence.drain()
        while self._calls and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.sequence is not None and not self._unloading:
            while self.sequence.live_sequences() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        if self._channel is not None:
            self._channel.close()

    async def _on_channel(self, message: object) -> object:
        """What the direct channel carries: batches, sequence steps, and the router's polls."""
        if isinstance(message, list):
            return await self.execute(message)
        if isinstance(message, SequenceStep):
            if self.sequence is None:
                err = Unavailable(f"model '{self.name}' version {self.version} failed to load: {self.load_error}")
                return StepResult(error=err)
            return await self.sequence.step(message)
        if isinstance(message, PollEvents):
            if self.sequence is None:
                raise Unavailable(f"model '{self.name}' version {self.version} has no sequence batcher here")
            return await self.sequence.poll(message)
        if isinstance(message, RestoreSequence):
            return self.sequence is not None and not self._stopping and self.sequence.restore(message)
        raise TypeError(f"unexpected channel message {type(message).__name__}")

    async def channel_address(self) -> tuple[str, int] | None:
        """Where the gateway can reach ``execute`` directly (opened on first ask); None without a token."""
        if not self._token:
            return None
        if self._address is None:
            import ray

            self._channel = ChannelServer(self._on_channel, self._token)
            self._address = await self._channel.start(ray.util.get_node_ip_address())
        return self._address

    async def sequence_address(self) -> tuple[str, str, int] | None:
        """(instance id, host, port) of a loaded sequence instance, for the sequence router."""
        if self.sequence is None:
            return None
        address = await self.channel_address()
        return None if address is None else (self.instance_id, address[0], address[1])

    async def warmup_figures(self) -> list[tuple[int, int, int, int]]:
        """What this instance's warmup executed (Triton counts warmup in the model's statistics)."""
        return getattr(self, "_warmup_figures", [])

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
