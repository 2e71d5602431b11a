"""One Ray Serve replica = one Triton model instance.

The replica never fails its constructor over the model: a load error is kept
and reported (``status``) so that one bad model does not fail the whole Serve
application; its requests get UNAVAILABLE with the reason.

A sequence model's replica also runs its sequence batcher
(:class:`~serve_app.runtime.sequence_instance.SequenceInstance`): steps arrive
over the direct channel, already assigned to a slot by the sequence router,
and the router long-polls the same channel for freed slots.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from serve_app.backends import BackendContext
from serve_app.errors import Unavailable, as_serve_error
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.inference.sequence import PollEvents, SequenceStep, StepResult
from serve_app.protos import model_config_pb2 as mc
from serve_app.runtime import ModelInstance
from serve_app.runtime.sequence_instance import SequenceInstance
from serve_app.transport import ChannelServer


class ModelReplica:
    def __init__(
        self, model_name: str, version: int, config_bytes: bytes, model_file: str, kind: str, channel_token: bytes = b""
    ) -> None:
        if kind == "KIND_CPU":
            # Ray no longer clears CUDA_VISIBLE_DEVICES for replicas without GPUs.
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        gpu_ids: tuple[int, ...] = ()
        if kind == "KIND_GPU":
            visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
            gpu_ids = tuple(range(len(visible))) or (0,)
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
        )
        # One execution at a time per instance, off the replica's event loop.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{model_name}-exec")
        self.instance_id = uuid.uuid4().hex
        self.sequence: SequenceInstance | None = None
        try:
            self.instance = ModelInstance(ctx)
            if config.HasField("sequence_batching"):
                self.sequence = SequenceInstance(
                    config, Path(model_file).parent.parent, self._run_one, instance_id=self.instance_id
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
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.instance.run_all, executions, time.perf_counter_ns())

    async def _run_one(self, execution: Execution) -> ExecutionResult:
        assert self.instance is not None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.instance.run, execution)

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

    async def status(self) -> tuple[bool, str]:
        return self.instance is not None, self.load_error
