"""How a Python model in a replica or shared host reaches the server: a gateway, through its Serve handle.

The schedulers live in the gateways, so a BLS request from a model running
elsewhere goes to a gateway (any replica, as Serve routes it) and through the
called model's scheduler there, wherever that model's instances run; a
decoupled one streams its responses back through Serve's streaming handle.
Model control goes the same way.  Errors come back as the server's own
(``ServeError``), which ``pb_utils`` turns into error responses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from serve_app.errors import as_serve_error
from serve_app.inference.types import InferRequest, InferResponse, StreamItem

GATEWAY = "gateway"


class GatewayLink:
    def __init__(self, server_app: str) -> None:
        self._app = server_app
        self._handle: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the replica's loop, learned on its first call

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.loop is None:
            self.loop = loop

    def _gateway(self) -> Any:
        if self._handle is None:
            from ray import serve

            self._handle = serve.get_deployment_handle(GATEWAY, self._app)
        return self._handle

    async def infer(self, request: InferRequest) -> InferResponse:
        try:
            response: InferResponse = await self._gateway().bls_infer.remote(request)
            return response
        except Exception as exc:
            raise as_serve_error(exc) from None

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[StreamItem, None]:
        try:
            stream = self._gateway().options(stream=True).bls_stream.remote(request)
            async for item in stream:
                yield item
        except Exception as exc:
            if isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
                raise
            yield StreamItem(error=as_serve_error(exc), final=True)

    async def load(self, name: str, config: str, files: dict[str, bytes]) -> None:
        with _unwrapped():
            await self._gateway().bls_load.remote(name, config, files)

    async def unload(self, name: str, unload_dependents: bool) -> None:
        with _unwrapped():
            await self._gateway().bls_unload.remote(name, unload_dependents)

    async def is_ready(self, name: str, version: str) -> bool:
        try:
            ready: bool = await self._gateway().bls_is_ready.remote(name, version)
        except Exception as exc:
            raise as_serve_error(exc) from None
        return ready


@contextlib.contextmanager
def _unwrapped() -> Any:
    try:
        yield
    except Exception as exc:
        raise as_serve_error(exc) from None
