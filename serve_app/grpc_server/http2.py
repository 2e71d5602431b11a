"""gRPC over one HTTP/2 connection, on the event loop, with the ``h2`` state machine.

Why not ``grpc.aio``: its server hands every call from grpc-core's threads to the event loop and back, and
that costs more CPU per call than the whole of our request path (measured in docs/design/hosting.md).  A
connection here is an ``asyncio.Protocol``: ``h2`` parses the frames and keeps the flow-control and
stream states; each call runs as one task; a response that fits the peer's window is written without
awaiting anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.stream import StreamState

from serve_app.errors import ServeError, as_serve_error
from serve_app.grpc_server.calls import (
    CallContext,
    GrpcAbort,
    MessageReader,
    frame_message,
    parse_metadata,
    parse_timeout,
    status_trailers,
)
from serve_app.protocol.status import grpc_status
from serve_app.security.restricted import RestrictedApis, grpc_category

UnaryHandler = Callable[[Any, CallContext], Awaitable[Any]]
StreamHandler = Callable[[AsyncIterator[Any], CallContext], AsyncIterator[Any]]

MAX_CONCURRENT_STREAMS = 4096
WINDOW_BYTES = 1 << 24  # what a peer may send ahead, per stream and per connection: we read every message whole
_RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
_OK_TRAILERS = [(b"grpc-status", b"0")]
_END = object()


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC: how its request bytes parse, how its responses serialize, and its handler."""

    name: str
    parse: Callable[[bytes], Any]
    serialize: Callable[[Any], bytes]
    handler: UnaryHandler | StreamHandler
    streaming: bool


@dataclass(frozen=True, slots=True)
class ServerState:
    """What every connection of one server shares."""

    methods: dict[bytes, Method]
    max_message_bytes: int
    restricted: RestrictedApis | None


class _Call:
    __slots__ = ("context", "deadline", "id", "messages", "method", "queue", "reader", "task", "timed_out")

    def __init__(self, stream_id: int, method: Method, context: CallContext, reader: MessageReader) -> None:
        self.id = stream_id
        self.method = method
        self.context = context
        self.reader = reader
        self.messages: list[bytes] = []
        self.queue: asyncio.Queue[Any] | None = None
        self.task: asyncio.Task[None] | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.timed_out = False


class GrpcConnection(asyncio.Protocol):
    def __init__(self, state: ServerState, connections: set[GrpcConnection]) -> None:
        self.state = state
        self.connections = connections
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.h2 = h2.connection.H2Connection(config=config)
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW_BYTES,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 65536,
            },
        )
        self.calls: dict[int, _Call] = {}
        self.window_waiters: dict[int, asyncio.Future[None]] = {}
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.draining = False

    # ------------------------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes
        self.connections.add(self)
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(WINDOW_BYTES - 65535)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self.transport = None
        for call in list(self.calls.values()):
            self._cancel(call)
        self.calls.clear()
        for waiter in self.window_waiters.values():
            if not waiter.done():
                waiter.set_result(None)
        self.window_waiters.clear()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            kind = type(event)
            stream_id: int = getattr(event, "stream_id", 0)
            if kind is h2.events.DataReceived:
                self._data(event)
            elif kind is h2.events.RequestReceived:
                self._request(event)
            elif kind is h2.events.StreamEnded:
                self._ended(stream_id)
            elif kind is h2.events.WindowUpdated:
                self._window_opened(stream_id)
            elif kind is h2.events.StreamReset:
                call = self.calls.pop(stream_id, None)
                if call is not None:
                    self._cancel(call)
                self._window_opened(stream_id)
            elif kind is h2.events.RemoteSettingsChanged:
                self._window_opened(0)
            elif kind is h2.events.ConnectionTerminated and self.transport is not None:
                self._flush()
                self.transport.close()
        self._flush()

    def drain(self) -> None:
        """Refuse new calls (the server stops) while calls under way finish.

        Not a GOAWAY frame: ``h2`` closes its side of the connection when it sends one, and the calls under
        way could not answer; a new call gets UNAVAILABLE instead, which clients retry elsewhere."""
        self.draining = True

    def close(self) -> None:
        if self.transport is not None:
            try:
                self.h2.close_connection()
            except h2.exceptions.ProtocolError:
                pass
            self._flush()
            self.transport.close()

    # ------------------------------------------------------------------------------------ incoming calls

    def _request(self, event: Any) -> None:
        stream_id: int = event.stream_id
        headers: list[tuple[bytes, bytes]] = event.headers
        path = b""
        timeout: bytes | None = None
        encoding: bytes | None = None
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                encoding = value
        method = self.state.methods.get(path)
        if self.draining:
            self._trailers_only(stream_id, grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
            return
        if method is None:
            self._trailers_only(stream_id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        metadata = parse_metadata(headers)
        if self.state.restricted is not None:
            refused = self.state.restricted.refusal(grpc_category(path.decode("latin-1")), _lookup(metadata))
            if refused is not None:
                message = f"This protocol is restricted, expecting header '{refused.header}'"
                self._trailers_only(stream_id, grpc.StatusCode.UNAVAILABLE, message)
                return
        reader = MessageReader(self.state.max_message_bytes, encoding)
        call = _Call(stream_id, method, CallContext(method.name, metadata), reader)
        if timeout is not None:
            try:
                seconds = parse_timeout(timeout)
            except ServeError as exc:
                self._trailers_only(stream_id, grpc_status(exc.code), exc.message)
                return
            call.deadline = self.loop.call_later(seconds, self._expire, call)
        self.calls[stream_id] = call
        if method.streaming:
            call.queue = asyncio.Queue()
            call.task = self.loop.create_task(self._run_stream(call))

    def _data(self, event: Any) -> None:
        stream_id: int = event.stream_id
        try:
            self.h2.acknowledge_received_data(event.flow_controlled_length, stream_id)
        except h2.exceptions.StreamClosedError:
            pass
        call = self.calls.get(stream_id)
        if call is None:
            return
        try:
            messages = call.reader.feed(event.data)
        except ServeError as exc:
            self._fail(call, grpc_status(exc.code), exc.message)
            return
        if call.queue is None:
            call.messages.extend(messages)
        else:
            for message in messages:
                call.queue.put_nowait(call.method.parse(message))

    def _ended(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is None:
            return
        if call.queue is not None:
            call.queue.put_nowait(_END)
            return
        if len(call.messages) != 1 or call.reader.pending:
            self._fail(call, grpc.StatusCode.INTERNAL, "a unary call needs exactly one request message")
            return
        call.task = self.loop.create_task(self._run_unary(call, call.method.parse(call.messages[0])))

    def _expire(self, call: _Call) -> None:
        call.timed_out = True
        if call.task is not None:
            call.task.cancel()
        else:
            self._fail(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    # ------------------------------------------------------------------------------------ running calls

    async def _run_unary(self, call: _Call, request: Any) -> None:
        handler: UnaryHandler = call.method.handler  # type: ignore[assignment]
        try:
            response = await handler(request, call.context)
            payload = frame_message(call.method.serialize(response))
        except asyncio.CancelledError:
            if call.timed_out:
                self._fail(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            return
        except GrpcAbort as exc:
            self._fail(call, exc.code, exc.details)
            return
        except Exception as exc:
            err = as_serve_error(exc)
            self._fail(call, grpc_status(err.code), err.message)
            return
        stream_id = call.id
        if self.transport is None or self.calls.get(stream_id) is not call:
            return
        try:
            self.h2.send_headers(stream_id, _RESPONSE_HEADERS)
            if len(payload) <= min(self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size):
                self.h2.send_data(stream_id, payload)
            else:
                await self._send_data(call, payload)
            self.h2.send_headers(stream_id, _OK_TRAILERS, end_stream=True)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, ConnectionError):
            pass
        self._done(call)
        self._flush()

    async def _run_stream(self, call: _Call) -> None:
        assert call.queue is not None
        queue = call.queue
        handler: StreamHandler = call.method.handler  # type: ignore[assignment]
        started = False
        try:
            async for response in handler(_requests(queue), call.context):
                if self.calls.get(call.id) is not call:
                    return
                if not started:
                    self.h2.send_headers(call.id, _RESPONSE_HEADERS)
                    started = True
                await self._send_data(call, frame_message(call.method.serialize(response)))
                self._flush()
            code, details = grpc.StatusCode.OK, ""
        except asyncio.CancelledError:
            if not call.timed_out:
                return
            code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        except GrpcAbort as exc:
            code, details = exc.code, exc.details
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, ConnectionError):
            self._done(call)
            return
        except Exception as exc:
            err = as_serve_error(exc)
            code, details = grpc_status(err.code), err.message
        if not started:
            self._fail(call, code, details)
            return
        try:
            self.h2.send_headers(call.id, status_trailers(code, details), end_stream=True)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass
        self._done(call)
        self._flush()

    async def _send_data(self, call: _Call, payload: bytes) -> None:
        """Write ``payload`` as the peer's flow-control window allows, waiting for it to open."""
        view = memoryview(payload)
        stream_id = call.id
        while view:
            window = min(self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size)
            if window <= 0:
                self._flush()
                waiter = self.window_waiters.get(stream_id)
                if waiter is None:
                    waiter = self.window_waiters[stream_id] = self.loop.create_future()
                await waiter
                if self.transport is None or self.calls.get(stream_id) is not call:
                    raise ConnectionError("the call ended while its response was sent")
                continue
            self.h2.send_data(stream_id, view[:window].tobytes())
            view = view[window:]

    def _window_opened(self, stream_id: int) -> None:
        if stream_id == 0:
            waiters = list(self.window_waiters.values())
            self.window_waiters.clear()
        else:
            waiter = self.window_waiters.pop(stream_id, None)
            waiters = [waiter] if waiter is not None else []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # ------------------------------------------------------------------------------------ ending calls

    def _fail(self, call: _Call, code: grpc.StatusCode, details: str) -> None:
        """End ``call`` with a status and no messages (gRPC's trailers-only response)."""
        if self.calls.get(call.id) is not call:
            return
        self._done(call)
        if call.task is not None and not call.task.done() and call.task is not asyncio.current_task():
            call.task.cancel()
        self._trailers_only(call.id, code, details)

    def _trailers_only(self, stream_id: int, code: grpc.StatusCode, details: str) -> None:
        try:
            self.h2.send_headers(stream_id, _RESPONSE_HEADERS + status_trailers(code, details), end_stream=True)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            return
        self._reset_if_open(stream_id)
        self._flush()

    def _done(self, call: _Call) -> None:
        if self.calls.get(call.id) is call:
            del self.calls[call.id]
        if call.deadline is not None:
            call.deadline.cancel()
        self._reset_if_open(call.id)

    def _reset_if_open(self, stream_id: int) -> None:
        """A call we ended while the client still sends is reset, so that the client stops sending."""
        stream = self.h2.streams.get(stream_id)
        if stream is not None and stream.state_machine.state is StreamState.HALF_CLOSED_LOCAL:
            try:
                self.h2.reset_stream(stream_id)
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                pass

    def _cancel(self, call: _Call) -> None:
        if call.deadline is not None:
            call.deadline.cancel()
        if call.task is not None and not call.task.done():
            call.task.cancel()

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None:
            self.transport.write(data)


async def _requests(queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    while (item := await queue.get()) is not _END:
        yield item


def _lookup(metadata: tuple[tuple[str, str | bytes], ...]) -> Callable[[str], str | None]:
    def value(key: str) -> str | None:
        for k, v in metadata:
            if k == key:
                return v if isinstance(v, str) else None  # a '-bin' key carries bytes: never a match
        return None

    return value
