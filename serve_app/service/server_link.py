"""What a Python model's BLS calls and model-control calls reach: this process's service.

A BLS request goes through the called model's scheduler, as a client's
would (its batching, sequences and statistics apply), with Triton's BLS
errors: a model that is not ready, or a decoupled model called without
``decoupled=True``, comes back as an error response, not an exception.
Where the models' instances live in processes without a service (their own
replicas, shared hosts), the Ray layer forwards these calls to a gateway,
which answers them with this same link.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from serve_app.errors import InternalError, NotFound, ServeError
from serve_app.inference.cancel import CancelSignal
from serve_app.inference.types import InferRequest, InferResponse, StreamItem
from serve_app.repository.api import LoadParameters
from serve_app.service.inference_service import InferenceService
from serve_app.service.registry import ServedModel


@dataclass(frozen=True, slots=True)
class BlsInfer:
    """A BLS request sent to a gateway over a direct channel (one response)."""

    request: InferRequest


@dataclass(frozen=True, slots=True)
class BlsStream:
    """A BLS request to a decoupled model sent to a gateway over a direct channel (its responses stream back)."""

    request: InferRequest

    def cancel_signals(self) -> tuple[CancelSignal | None, ...]:
        """The request's cancel signal, which the channel forwards (``ResponseIterator.cancel()``)."""
        return (self.request.cancel,)


def bls_error(model: str, detail: str) -> str:
    """Triton's wording for a BLS request that could not run (``request_executor.cc``)."""
    return f"Model {model} - Error when running inference: {detail}"


class ServiceLink:
    def __init__(self, service: InferenceService | None = None) -> None:
        self.service = service
        self.loop: asyncio.AbstractEventLoop | None = None  # where the service runs (the models' calls go there)

    def _service(self) -> InferenceService:
        if self.service is None:
            raise InternalError("the server is not running yet")
        return self.service

    async def _model(self, request: InferRequest, *, decoupled: bool = False) -> ServedModel:
        """The called model (loaded first, when the server loads on demand and it isn't); ``decoupled``: for
        ``exec(decoupled=True)``, where Triton names a model it does not know as its core does (``Request for
        unknown model: ...``), and one it knows but that is not ready as the non-decoupled call does."""
        service = self._service()
        name, version = request.model_name, request.model_version
        if not service.model_ready(name, version):
            if decoupled and not service.registry.versions(name) and service.registry.failed(name) is None:
                missing = NotFound(bls_error(name, f"Request for unknown model: '{name}' is not found"))
            else:
                missing = NotFound(
                    bls_error(name, f"Failed for execute the inference request. Model '{name}' is not ready.")
                )
            if service.on_demand is None or service.registry.versions(name):
                raise missing
            try:
                return await service.model_after_miss(name, version, missing)
            except ServeError as exc:
                raise type(exc)(bls_error(name, exc.message)) from None
        return service.model(name, version)

    async def infer(self, request: InferRequest) -> InferResponse:
        model = await self._model(request)
        if model.is_decoupled:
            raise InternalError(
                bls_error(
                    request.model_name,
                    f"Model {request.model_name} is using the decoupled. The current BLS request call doesn't "
                    "support models using the decoupled transaction policy. Please use 'decoupled=True' argument to "
                    "the 'exec' or 'async_exec' calls for decoupled models.'",
                )
            )
        return await self._service().infer(model, request)

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[StreamItem, None]:
        model = await self._model(request, decoupled=True)
        try:
            async with contextlib.aclosing(self._service().infer_stream(model, request)) as items:
                async for item in items:
                    yield item
        except ServeError as exc:
            yield StreamItem(error=exc, final=True)

    async def on_channel(self, message: object) -> object:
        """What a gateway's BLS channel serves: the calls of Python models in other processes."""
        if isinstance(message, BlsInfer):
            return await self.infer(message.request)
        if isinstance(message, BlsStream):
            return self.infer_stream(message.request)
        raise TypeError(f"unexpected channel message {type(message).__name__}")

    async def load(self, name: str, config: str, files: dict[str, bytes]) -> None:
        await self._service().repository_load(name, LoadParameters(config_json=config or None, files=dict(files)))

    async def unload(self, name: str, unload_dependents: bool) -> None:
        await self._service().repository_unload(name, unload_dependents)

    async def is_ready(self, name: str, version: str) -> bool:
        return self._service().model_ready(name, version)
