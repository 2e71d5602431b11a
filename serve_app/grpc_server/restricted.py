"""Triton's restricted protocols over gRPC: an interceptor (policy: ``security/restricted.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc

from serve_app.security.restricted import RestrictedApis, grpc_category


class RestrictedProtocolInterceptor(grpc.aio.ServerInterceptor):
    """Ends restricted calls without the metadata key with UNAVAILABLE, before the handler runs."""

    def __init__(self, apis: RestrictedApis) -> None:
        self.apis = apis

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        metadata = handler_call_details.invocation_metadata or ()
        refused = self.apis.refusal(
            grpc_category(handler_call_details.method), lambda key: _metadata_value(metadata, key)
        )
        if refused is None:
            return handler
        return _refusing(handler, f"This protocol is restricted, expecting header '{refused.header}'")


def _metadata_value(metadata: Iterable[Any], key: str) -> str | None:
    for item in metadata:
        k, v = item[0], item[1]
        if k == key:
            return v if isinstance(v, str) else None  # a '-bin' key carries bytes: never a match
    return None


def _refusing(handler: grpc.RpcMethodHandler[Any, Any], message: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as ``handler`` that reads nothing and aborts with UNAVAILABLE."""

    async def abort(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)
