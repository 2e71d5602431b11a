"""How a Python model in a replica or shared host reaches the server: a gateway, through its Serve handle.

The schedulers live in the gateways, so a BLS request from a model running
elsewhere goes to a gateway and through the called model's scheduler there,
wherever that model's instances run.  Requests cross on a direct channel to
one gateway (whose address a Serve call returns, so Serve picks the gateway;
a broken channel is replaced by another on the next call): a Serve handle
call costs milliseconds, the channel a fraction of one.  A decoupled model's
responses stream back on the channel as they come.  Model control, rare,
goes through the gateway's Serve handle.  Errors come back as the server's
own (``ServeError``), which ``pb_utils`` turns into error responses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from serve_app.errors import as_serve_error
from serve_app.inference.types import InferRequest, InferResponse, StreamItem
from serve_app.service.server_link import BlsInfer, BlsStream
from serve_app.transport import ChannelClient

GATEWAY = "gateway"


class GatewayLink:
    def __init__(self, server_app: str, token: bytes = b"") -> None:
        """``token``: the direct channels' shared token (without one, every call goes through Serve)."""
        self._app = server_app
        self._token = token
        self._handle: Any = None
        self._client: ChannelClient | None = None
        self._connecting = asyncio.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None  # the replica's loop, learned on its first call

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.loop is None:
            self.loop = loop

    def _gateway(self) -> Any:
        if self._handle is None:
            from ray import serve

            self._handle = serve.get_deployment_handle(GATEWAY, self._app)
        return self._handle

    async def _channel(self) -> ChannelClient | None:
        """A channel to a gateway's BLS server (None: calls go through Serve)."""
        if not self._token:
            return None
        async with self._connecting:
            if self._client is None or self._client.closed:
                address = await self._gateway().bls_address.remote()
                if address is None:
                    return None
                client = ChannelClient((str(address[0]), int(address[1])))
                await client.connect(self._token)
                self._client = client
            return self._client

    async def infer(self, request: InferRequest) -> InferResponse:
        try:
            client = await self._channel()
            if client is not None:
                answer: InferResponse = await client.call(BlsInfer(request))
                return answer
            response: InferResponse = await self._gateway().bls_infer.remote(request)
            return response
        except Exception as exc:
            raise as_serve_error(exc) from None

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[StreamItem, None]:
        try:
            client = await self._channel()
            if client is not None:
                async with contextlib.aclosing(client.stream(BlsStream(request))) as items:
                    async for item in items:
                        yield item
                return
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
