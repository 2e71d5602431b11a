"""GRPCInferenceService over :class:`InferenceService`.

The service is served under Triton's full name ``inference.GRPCInferenceService``
(our proto package differs from Triton's, so both can load in one process).
Every handler is wrapped once, in the table: an error of any handler becomes the
call's status by one mapping.  Request bytes that are not a valid message are
answered INVALID_ARGUMENT (grpc itself would answer INTERNAL), in-band on a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from google.protobuf.message import DecodeError

from serve_app.errors import InvalidArgument, ServeError, Unsupported, as_serve_error
from serve_app.grpc_server import trace_logging
from serve_app.grpc_server.calls import CallContext
from serve_app.grpc_server.http2 import Method
from serve_app.grpc_server.shared_memory import SharedMemoryRpcs
from serve_app.inference.options import EMPTY_FINAL
from serve_app.limits import DEFAULT_LIMITS, RequestLimits
from serve_app.protocol import grpc_codec, repository_codec, stats_codec
from serve_app.protocol.status import grpc_status
from serve_app.protos import grpc_service_pb2 as pb
from serve_app.scheduling.decoupled_scheduler import DECOUPLED_UNARY
from serve_app.service import InferenceService

SERVICE_NAME = "inference.GRPCInferenceService"
FINAL_RESPONSE = "triton_final_response"  # the response parameter that marks a request's last response
# A stream opened with this header set to "true" ends at its first error, with that error as its gRPC status.
GRPC_ERROR_HEADER = "triton_grpc_error"
MAX_STREAM_INFLIGHT = 1024  # requests of one stream being served at once; the stream waits beyond that
MAX_STREAM_PENDING = 64  # responses of one stream ready and not yet taken by the client; producers wait beyond

UnaryHandler = Callable[[Any, CallContext], Awaitable[Any]]


class MalformedRequest:
    """What the deserializer hands on for bytes that don't parse: the handler answers INVALID_ARGUMENT."""

    __slots__ = ("error",)

    def __init__(self, exc: Exception, error: InvalidArgument | None = None) -> None:
        self.error = error or InvalidArgument(f"failed to parse the request message: {exc}")


def _deserializer(message_type: Any, limits: RequestLimits) -> Callable[[bytes], Any]:
    infer = message_type is pb.ModelInferRequest

    def parse(data: bytes) -> Any:
        try:
            return grpc_codec.parse_model_infer_request(data, limits) if infer else message_type.FromString(data)
        except InvalidArgument as exc:  # refused on its bytes, before it is decoded
            return MalformedRequest(exc, exc)
        except (DecodeError, ValueError, RuntimeError) as exc:
            return MalformedRequest(exc)

    return parse


class InferenceServicer(SharedMemoryRpcs):
    def __init__(self, service: InferenceService, limits: RequestLimits = DEFAULT_LIMITS) -> None:
        self.service = service
        self.limits = limits

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.service.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        md = self.service.server_metadata()
        return pb.ServerMetadataResponse(name=md.name, version=md.version, extensions=md.extensions)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        md = self.service.model_metadata(request.name, request.version)
        TM = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=md.name,
            versions=md.versions,
            platform=md.platform,
            inputs=[TM(name=t.name, datatype=t.datatype, shape=t.shape) for t in md.inputs],
            outputs=[TM(name=t.name, datatype=t.datatype, shape=t.shape) for t in md.outputs],
        )

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=self.service.model_config(request.name, request.version))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        return stats_codec.stats_to_proto(await self.service.model_statistics(request.name, request.version))

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        repository_codec.check_repository_name(request.repository_name)
        resp = pb.RepositoryIndexResponse()
        for e in await self.service.repository_index_async(request.ready):
            resp.models.add(name=e.name, version=e.version, state=e.state, reason=e.reason)
        return resp

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        repository_codec.check_repository_name(request.repository_name)
        params = repository_codec.grpc_load_parameters(request.parameters)
        await self.service.repository_load(request.model_name, params)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        repository_codec.check_repository_name(request.repository_name)
        unload_dependents = repository_codec.grpc_unload_dependents(request.parameters)
        await self.service.repository_unload(request.model_name, unload_dependents)
        return pb.RepositoryModelUnloadResponse()

    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        return await trace_logging.trace_setting(self.service, request)

    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        return await trace_logging.log_settings(self.service, request)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        trace = trace_logging.start_trace(self.service, request.model_name, context)
        if trace is not None:
            return await trace_logging.run_traced(trace, self._model_infer(request))
        return await self._model_infer(request)

    async def _model_infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        try:
            model = self.service.model(request.model_name, request.model_version)
        except ServeError as miss:  # not served: loaded on demand when that is on
            model = await self.service.model_after_miss(request.model_name, request.model_version, miss)
        if model.is_decoupled:
            raise Unsupported(DECOUPLED_UNARY)
        shm = self.service.shared_memory
        req = grpc_codec.decode_model_infer_request(request, self.limits, shm)
        resp = await self.service.infer(model, req)
        return grpc_codec.encode_model_infer_response(resp, req, shm)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Each request gets one response; errors travel in-band and keep the stream open, unless the client
        opened the stream with the ``triton_grpc_error: true`` header: then the first error ends the stream
        with its gRPC status, as Triton does.

        Requests run concurrently and each response is sent when it is ready, as Triton does, so a
        sequence waiting in the backlog does not hold up the others on the stream.  Steps of one
        sequence start in arrival order, so their responses come back in that order.
        """
        responses: asyncio.Queue[tuple[pb.ModelStreamInferResponse, ServeError | None] | None] = asyncio.Queue()
        strict = _grpc_errors_wanted(context)
        room = asyncio.Semaphore(MAX_STREAM_INFLIGHT)
        # A client that stops reading stops its stream: its requests wait for room here, no more are read.
        ready = asyncio.Semaphore(MAX_STREAM_PENDING)
        tasks: set[asyncio.Task[None]] = set()

        async def answer(request: pb.ModelInferRequest) -> None:
            try:
                async for response in self._stream_responses(request):
                    await ready.acquire()
                    responses.put_nowait(response)
            finally:
                room.release()

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await room.acquire()
                    task = asyncio.get_running_loop().create_task(answer(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                while tasks:
                    await asyncio.wait(set(tasks))
            finally:
                responses.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (item := await responses.get()) is not None:
                ready.release()
                response, error = item
                if strict and error is not None:
                    await context.abort(grpc_status(error.code), error.message)
                yield response
        finally:
            reader.cancel()
            for task in tasks:
                task.cancel()

    async def _stream_responses(
        self, request: pb.ModelInferRequest | MalformedRequest
    ) -> AsyncIterator[tuple[pb.ModelStreamInferResponse, ServeError | None]]:
        """A request's responses on the stream, each with its error if it is one: one for most models, each
        one a decoupled model sends (with ``triton_final_response``).  Errors travel as ``error_message``."""
        if isinstance(request, MalformedRequest):
            yield pb.ModelStreamInferResponse(error_message=request.error.message), request.error
            return
        final = True
        try:
            try:
                model = self.service.model(request.model_name, request.model_version)
            except ServeError as miss:  # not served: loaded on demand when that is on
                model = await self.service.model_after_miss(request.model_name, request.model_version, miss)
            empty_final = _empty_final_wanted(request)
            req = grpc_codec.decode_model_infer_request(request, self.limits, self.service.shared_memory)
            async with contextlib.aclosing(self.service.infer_stream(model, req)) as items:
                async for item in items:
                    final = item.final
                    if item.error is not None:
                        yield _error_response(request, item.error, final if model.is_decoupled else None), item.error
                        continue
                    if item.response is None:  # the final flag alone
                        if empty_final:
                            yield _flag_only_final(request), None
                        continue
                    out = grpc_codec.encode_model_infer_response(item.response, req, self.service.shared_memory)
                    out.parameters[FINAL_RESPONSE].bool_param = item.final
                    yield pb.ModelStreamInferResponse(infer_response=out), None
        except Exception as exc:
            error = as_serve_error(exc)
            yield _error_response(request, error, None), error


def _grpc_errors_wanted(context: Any) -> bool:
    """Whether the stream was opened with ``triton_grpc_error: true``."""
    try:
        metadata = context.invocation_metadata() or ()
    except Exception:
        return False
    return any(key == GRPC_ERROR_HEADER and str(value).lower() == "true" for key, value in metadata)


def _empty_final_wanted(request: pb.ModelInferRequest) -> bool:
    """The request's ``triton_enable_empty_final_response`` (a bool_param), as Triton reads it."""
    param = request.parameters.get(EMPTY_FINAL)
    if param is None:
        return False
    if param.WhichOneof("parameter_choice") != "bool_param":
        raise InvalidArgument(f"invalid value type for '{EMPTY_FINAL}' parameter, expected bool_param.")
    return bool(param.bool_param)


def _error_response(
    request: pb.ModelInferRequest, error: ServeError, final: bool | None
) -> pb.ModelStreamInferResponse:
    out = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version, id=request.id)
    if final is not None:
        out.parameters[FINAL_RESPONSE].bool_param = final
    return pb.ModelStreamInferResponse(error_message=error.message, infer_response=out)


def _flag_only_final(request: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
    """What Triton writes for a decoupled request's final flag when the client asked for it: no outputs."""
    out = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version, id=request.id)
    out.parameters[FINAL_RESPONSE].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=out)


# RPC name -> (request type, response type, client streaming)
_METHODS: dict[str, tuple[Any, Any, bool]] = {
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse, False),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse, False),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse, False),
    "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse, False),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse, False),
    "ModelInfer": (pb.ModelInferRequest, pb.ModelInferResponse, False),
    "ModelStreamInfer": (pb.ModelInferRequest, pb.ModelStreamInferResponse, True),
    "ModelConfig": (pb.ModelConfigRequest, pb.ModelConfigResponse, False),
    "ModelStatistics": (pb.ModelStatisticsRequest, pb.ModelStatisticsResponse, False),
    "RepositoryIndex": (pb.RepositoryIndexRequest, pb.RepositoryIndexResponse, False),
    "RepositoryModelLoad": (pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse, False),
    "RepositoryModelUnload": (pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse, False),
    "SystemSharedMemoryStatus": (pb.SystemSharedMemoryStatusRequest, pb.SystemSharedMemoryStatusResponse, False),
    "SystemSharedMemoryRegister": (
        pb.SystemSharedMemoryRegisterRequest,
        pb.SystemSharedMemoryRegisterResponse,
        False,
    ),
    "SystemSharedMemoryUnregister": (
        pb.SystemSharedMemoryUnregisterRequest,
        pb.SystemSharedMemoryUnregisterResponse,
        False,
    ),
    "CudaSharedMemoryStatus": (pb.CudaSharedMemoryStatusRequest, pb.CudaSharedMemoryStatusResponse, False),
    "CudaSharedMemoryRegister": (pb.CudaSharedMemoryRegisterRequest, pb.CudaSharedMemoryRegisterResponse, False),
    "CudaSharedMemoryUnregister": (
        pb.CudaSharedMemoryUnregisterRequest,
        pb.CudaSharedMemoryUnregisterResponse,
        False,
    ),
    "TraceSetting": (pb.TraceSettingRequest, pb.TraceSettingResponse, False),
    "LogSettings": (pb.LogSettingsRequest, pb.LogSettingsResponse, False),
}


def _unary(fn: UnaryHandler | None, name: str) -> UnaryHandler:
    async def handler(request: Any, context: CallContext) -> Any:
        if isinstance(request, MalformedRequest):
            raise request.error
        if fn is None:
            raise Unsupported(f"{name} is not supported by this server")
        return await fn(request, context)

    return handler


def method_table(servicer: InferenceServicer) -> dict[bytes, Method]:
    """Triton's service, by the ``:path`` of each RPC: every handler gets the same parsing and error
    mapping here (errors become the status of the call, by ``protocol/status.py``)."""
    table: dict[bytes, Method] = {}
    for name, (req_t, resp_t, streaming) in _METHODS.items():
        fn = getattr(servicer, name, None)
        handler = cast(Callable[..., Any], fn) if streaming else _unary(fn, name)
        path = f"/{SERVICE_NAME}/{name}".encode()
        parse = _deserializer(req_t, servicer.limits)
        table[path] = Method(name, parse, resp_t.SerializeToString, handler, streaming)
    return table
