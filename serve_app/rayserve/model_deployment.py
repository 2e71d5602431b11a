"""One Ray Serve replica = one Triton model instance.

The replica never fails its constructor over the model: a load error is kept
and reported (``status``) so that one bad model does not fail the whole Serve
application; its requests get UNAVAILABLE with the reason.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from serve_app.backends import BackendContext
from serve_app.errors import Unavailable, as_serve_error
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.protos import model_config_pb2 as mc
from serve_app.runtime import ModelInstance
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
        ctx = BackendContext(
            model_name=model_name,
            version=version,
            config=mc.ModelConfig.FromString(config_bytes),
            model_file=Path(model_file),
            device_kind=kind,
            gpu_ids=gpu_ids,
        )
        try:
            self.instance = ModelInstance(ctx)
        except Exception as exc:
            self.load_error = as_serve_error(exc).message
        # One execution at a time per instance, off the replica's event loop.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{model_name}-exec")
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

    async def channel_address(self) -> tuple[str, int] | None:
        """Where the gateway can reach ``execute`` directly (opened on first ask); None without a token."""
        if not self._token:
            return None
        if self._address is None:
            import ray

            self._channel = ChannelServer(self.execute, self._token)
            self._address = await self._channel.start(ray.util.get_node_ip_address())
        return self._address

    async def status(self) -> tuple[bool, str]:
        return self.instance is not None, self.load_error
