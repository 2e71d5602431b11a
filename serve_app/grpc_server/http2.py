"""gRPC over one HTTP/2 connection, on the event loop.

Why not ``grpc.aio``: its server hands every call from grpc-core's threads to the event loop and back,
and that cost more CPU per call than the whole of our request path (docs/design/hosting.md).  A
connection here is an ``asyncio.Protocol`` over the frame codec of ``frames.py``: each call runs as one
task, and a response that fits the peer's flow-control window is written in one ``write`` (headers,
message and trailers together) without awaiting anything.

The server side of HTTP/2 that gRPC clients use: streams opened by the client with HEADERS (and
CONTINUATION), DATA with flow control both ways, RST_STREAM, SETTINGS, PING, GOAWAY.  A peer that breaks
the protocol gets GOAWAY and the connection closes; its calls are cancelled.

Bounded as grpc-core and nghttp2 bound a connection: frames are handled in slices of at most
``SLICE_FRAMES``, and reading pauses while the connection's unanswered work is over a bound or its
socket does not take our output, so that one busy connection leaves the event loop to the others.
Floods of frames that advance nothing end with GOAWAY ENHANCE_YOUR_CALM (``flood.py``); answers that
wait for a client's window are capped per connection and in all, and refused (RESOURCE_EXHAUSTED)
beyond the caps.  Nothing of a call outlives its connection: a cancelled call's task keeps its
traceback, so the call must not keep the task (a cycle only the cyclic collector would free, minutes
later, with every request and answer of the call in it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import grpc

from serve_app.errors import ServeError, as_serve_error
from serve_app.grpc_server import flood, frames as f
from serve_app.grpc_server.calls import (
    CallContext,
    GrpcAbort,
    MessageReader,
    frame_message,
    parse_metadata,
    parse_timeout,
    status_trailers,
)
from serve_app.grpc_server.flood import FloodGuard, SendBudget
from serve_app.protocol.status import grpc_status
from serve_app.security.restricted import RestrictedApis, grpc_category

UnaryHandler = Callable[[Any, CallContext], Awaitable[Any]]
StreamHandler = Callable[[AsyncIterator[Any], CallContext], AsyncIterator[Any]]

MAX_CONCURRENT_STREAMS = 4096
MAX_HEADER_LIST_BYTES = 65536
WINDOW_BYTES = 1 << 24  # what a peer may send ahead, per stream and per connection: we read every message whole
MAX_DETAILS_BYTES = 8192  # a longer grpc-message would pass clients' metadata limits
SLICE_FRAMES = 100  # frames handled before the loop serves other connections
MAX_UNANSWERED_CALLS = 1024  # reading pauses while more calls of a connection are being answered...
MAX_UNANSWERED_BYTES = 256 << 20  # ...or their requests hold more bytes than this
MAX_UNSENT_PER_CONNECTION = 256 << 20  # answers waiting for a client's window: see flood.SendBudget
MAX_UNSENT_TOTAL = 1 << 30
WRITE_BUFFER_HIGH = 4 << 20  # unsent bytes in the socket's buffer past which reading pauses
CLOSE_GRACE_S = 5.0  # a connection ended for abuse is cut this long after its GOAWAY if it does not read
_RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))
_OK_TRAILERS = ((b"grpc-status", b"0"),)
_END = object()
_UNREAD = "the client does not read its answers: too many bytes wait for its flow-control window"


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
    budget: SendBudget = field(default_factory=lambda: SendBudget(MAX_UNSENT_PER_CONNECTION, MAX_UNSENT_TOTAL))


class _Call:
    __slots__ = (
        "context", "deadline", "held", "id", "messages", "method", "queue", "reader", "received",
        "remote_closed", "send_window", "task", "timed_out", "working",
    )  # fmt: skip

    def __init__(
        self, stream_id: int, method: Method, context: CallContext, reader: MessageReader, send_window: int
    ) -> None:
        self.id = stream_id
        self.method = method
        self.context = context
        self.reader = reader
        self.send_window = send_window
        self.received = 0  # bytes taken from our window on this stream since we last opened it again
        self.remote_closed = False
        self.messages: list[bytes] = []
        self.queue: asyncio.Queue[Any] | None = None
        self.task: asyncio.Task[None] | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.timed_out = False
        self.held = 0  # request bytes this call holds while it is answered
        self.working = False  # its handler runs (counted in the connection's unanswered work)


class GrpcConnection(asyncio.Protocol):
    def __init__(self, state: ServerState, connections: set[GrpcConnection]) -> None:
        self.state = state
        self.connections = connections
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, _Call] = {}
        self.draining = False
        self._buffer = bytearray()
        self._preface = False
        self._out = bytearray()
        self._flush_due = False  # a flush is scheduled for the end of this loop turn
        self._decoder = f.HeaderDecoder(MAX_HEADER_LIST_BYTES)
        self._continuation: tuple[int, int, bytearray] | None = None  # stream, flags, header block so far
        self._last_stream = 0
        self._peer_window = f.DEFAULT_WINDOW  # the peer's INITIAL_WINDOW_SIZE, for new streams
        self._peer_frame = f.DEFAULT_FRAME_SIZE
        self._send_window = f.DEFAULT_WINDOW  # the connection's
        self._received = 0  # bytes taken from our connection window since we last opened it again
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._encoder = f.HeaderEncoder()
        self._guard = FloodGuard(self.loop.time())
        self._continuations = 0
        self._working = 0  # unary calls whose handler runs
        self._held = 0  # request bytes those calls hold
        self._parked = 0  # answer bytes waiting for the client's window or socket
        self._slice_due = False  # a slice of frames is scheduled
        self._reading_paused = False
        self._writing_paused = False
        self._abort: asyncio.TimerHandle | None = None
        self._ending = False  # GOAWAY sent for an error: what the peer sends now is dropped

    # ------------------------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        self.connections.add(self)
        settings = {
            f.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
            f.INITIAL_WINDOW_SIZE: WINDOW_BYTES,
            f.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_BYTES,
            f.ENABLE_PUSH: 0,
        }
        self._out += f.settings_frame(settings) + f.window_update(0, WINDOW_BYTES - f.DEFAULT_WINDOW)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self.transport = None
        if self._abort is not None:
            self._abort.cancel()
        self._end_all_calls()
        self._buffer = bytearray()
        self._out = bytearray()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._guard.queued_acks = 0
        self._wake_all()
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self._ending:
            return
        self._buffer += data
        if not self._slice_due:
            self._slice()

    def _slice(self) -> None:
        """Handle at most ``SLICE_FRAMES`` frames; the rest wait for the next loop turn, reading paused."""
        self._slice_due = False
        if self.transport is None or self.transport.is_closing() or self._ending:
            return
        buffer = self._buffer
        try:
            if not self._preface:
                if len(buffer) < len(f.PREFACE):
                    if not f.PREFACE.startswith(bytes(buffer)):
                        raise f.ProtocolError("not an HTTP/2 connection preface")
                    return
                if buffer[: len(f.PREFACE)] != f.PREFACE:
                    raise f.ProtocolError("not an HTTP/2 connection preface")
                del buffer[: len(f.PREFACE)]
                self._preface = True
            pos, end, count = 0, len(buffer), 0
            while end - pos >= f.HEADER_BYTES and count < SLICE_FRAMES and not self._busy():
                length = int.from_bytes(buffer[pos : pos + 3], "big")
                if length > f.DEFAULT_FRAME_SIZE:
                    raise f.ProtocolError("frame larger than SETTINGS_MAX_FRAME_SIZE", f.FRAME_SIZE_ERROR)
                start = pos + f.HEADER_BYTES
                if end - start < length:
                    break
                kind, flags = buffer[pos + 3], buffer[pos + 4]
                stream_id = int.from_bytes(buffer[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
                payload = bytes(buffer[start : start + length])
                pos = start + length
                count += 1
                self._frame(kind, flags, stream_id, payload)
            del buffer[:pos]
        except f.ProtocolError as exc:
            self._end(exc)
            return
        self._flush()
        self._update_reading()

    def _end(self, exc: f.ProtocolError) -> None:
        """GOAWAY with the error's code, then our end of the socket shut after it.  What the peer still
        sends is read and dropped: a socket closed with unread bytes is reset, and a reset loses the
        GOAWAY on its way.  A peer that neither reads nor closes is cut after ``CLOSE_GRACE_S``."""
        self._end_all_calls()
        self._buffer = bytearray()
        self._out += f.goaway(self._last_stream, exc.code, str(exc).encode()[:256])
        self._flush()
        self._ending = True
        transport = self.transport
        if transport is None:
            return
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        if transport.can_write_eof():
            transport.write_eof()
        else:
            transport.close()
        self._abort = self.loop.call_later(CLOSE_GRACE_S, self._cut)

    def _cut(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _busy(self) -> bool:
        return self._working > MAX_UNANSWERED_CALLS or self._held > MAX_UNANSWERED_BYTES

    def _frame_ready(self) -> bool:
        buffer = self._buffer
        if not self._preface:
            return len(buffer) >= len(f.PREFACE)
        return len(buffer) >= f.HEADER_BYTES and len(buffer) >= f.HEADER_BYTES + int.from_bytes(buffer[:3], "big")

    def _update_reading(self) -> None:
        """Read while nothing is over its bound; a frame already read waits for the next slice."""
        transport = self.transport
        if transport is None or transport.is_closing() or self._ending:
            return
        ready = self._frame_ready()
        want = not (ready or self._writing_paused or self._busy())
        if want and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        elif not want and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        if ready and not self._slice_due and not self._busy():
            self._slice_due = True
            self.loop.call_soon(self._slice)

    def drain(self) -> None:
        """Refuse new calls (the server stops) while calls under way finish: UNAVAILABLE, which clients
        retry elsewhere."""
        self.draining = True

    def close(self) -> None:
        if self.transport is not None:
            self._out += f.goaway(self._last_stream, f.NO_ERROR)
            self._flush()
            self.transport.close()

    # ------------------------------------------------------------------------------------ frames

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation is not None and kind != f.CONTINUATION:
            raise f.ProtocolError("a header block was interrupted")
        if kind == f.DATA:
            self._data(flags, stream_id, payload)
        elif kind == f.HEADERS:
            if stream_id == 0:
                raise f.ProtocolError("HEADERS on stream 0")
            block = f.strip_padding(flags, payload)
            if flags & f.PRIORITY_FLAG:
                block = block[5:]
            if flags & f.END_HEADERS:
                self._headers(stream_id, flags, block)
            else:
                self._continuation = (stream_id, flags, bytearray(block))
                self._continuations = 0
        elif kind == f.CONTINUATION:
            if self._continuation is None or self._continuation[0] != stream_id:
                raise f.ProtocolError("CONTINUATION without its HEADERS")
            self._continuations += 1
            if self._continuations > flood.MAX_CONTINUATIONS:
                raise flood.Abuse("too many CONTINUATION frames")
            if not payload and not flags & f.END_HEADERS:
                self._guard.on_idle_frame(self.loop.time())
            block_so_far = self._continuation[2]
            block_so_far += payload
            if len(block_so_far) > 2 * MAX_HEADER_LIST_BYTES:
                raise f.ProtocolError("header block too large", f.ENHANCE_YOUR_CALM)
            if flags & f.END_HEADERS:
                headers_flags = self._continuation[1]
                self._continuation = None
                self._headers(stream_id, headers_flags, bytes(block_so_far))
        elif kind == f.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == f.RST_STREAM:
            if len(payload) != 4 or stream_id == 0:
                raise f.ProtocolError("malformed RST_STREAM", f.FRAME_SIZE_ERROR)
            call = self.calls.pop(stream_id, None)
            if call is not None:
                self._guard.on_reset(self.loop.time())
                self._cancel(call)
                self._wake(stream_id)
            else:
                self._guard.on_idle_frame(self.loop.time())
        elif kind == f.SETTINGS:
            if stream_id != 0:
                raise f.ProtocolError("SETTINGS on a stream")
            self._guard.on_idle_frame(self.loop.time())
            if not flags & f.ACK:
                if len(payload) > 6 * flood.MAX_SETTINGS_ENTRIES:
                    raise flood.Abuse("too many SETTINGS entries")
                self._settings(f.parse_settings(payload))
                self._guard.on_ack(self._backed_up())
        elif kind == f.PING:
            if len(payload) != 8 or stream_id != 0:
                raise f.ProtocolError("malformed PING", f.FRAME_SIZE_ERROR)
            if flags & f.ACK:
                self._guard.on_idle_frame(self.loop.time())  # we send no PING of our own
            else:
                self._guard.on_ping(self.loop.time())
                self._out += f.frame(f.PING, f.ACK, 0, payload)
                self._guard.on_ack(self._backed_up())
        elif kind == f.GOAWAY:
            self.draining = True
        elif kind == f.PUSH_PROMISE:
            raise f.ProtocolError("PUSH_PROMISE from a client")
        else:  # PRIORITY and frame types we do not know are ignored, as RFC 9113 says, and counted
            self._guard.on_idle_frame(self.loop.time())

    def _backed_up(self) -> bool:
        """Our output is not leaving: the socket's buffer holds bytes (or the peer's window is shut)."""
        return self._writing_paused or (self.transport is not None and self.transport.get_write_buffer_size() > 0)

    def _settings(self, values: dict[int, int]) -> None:
        for key, value in values.items():
            if key == f.INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise f.ProtocolError("SETTINGS_INITIAL_WINDOW_SIZE too large", f.FLOW_CONTROL_ERROR)
                delta, self._peer_window = value - self._peer_window, value
                for call in self.calls.values():
                    call.send_window += delta
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_FRAME_SIZE <= value <= (1 << 24) - 1:
                    raise f.ProtocolError("SETTINGS_MAX_FRAME_SIZE out of range")
                self._peer_frame = value
            elif key == f.HEADER_TABLE_SIZE:
                self._encoder.set_table_size(value)
        self._out += f.frame(f.SETTINGS, f.ACK, 0)
        self._wake_all()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise f.ProtocolError("malformed WINDOW_UPDATE", f.FRAME_SIZE_ERROR)
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise f.ProtocolError("WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > f.MAX_WINDOW:
                raise f.ProtocolError("connection window above 2^31-1", f.FLOW_CONTROL_ERROR)
            self._wake_all()
            return
        call = self.calls.get(stream_id)
        if call is not None:
            call.send_window += increment
            self._wake(stream_id)
        else:
            self._guard.on_idle_frame(self.loop.time())

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise f.ProtocolError("DATA on stream 0")
        self._received += len(payload)
        if self._received >= WINDOW_BYTES // 2:
            self._out += f.window_update(0, self._received)
            self._received = 0
        data = f.strip_padding(flags, payload)
        end = bool(flags & f.END_STREAM)
        if not data and not end:
            self._guard.on_idle_frame(self.loop.time())
        call = self.calls.get(stream_id)
        if call is None or call.remote_closed:
            if stream_id > self._last_stream:
                raise f.ProtocolError("DATA on a stream that was never opened")
            return  # a call that ended (or was refused) while the client still sent
        call.received += len(payload)
        if not end and call.received >= WINDOW_BYTES // 2:
            self._out += f.window_update(stream_id, call.received)
            call.received = 0
        if data:
            try:
                messages = call.reader.feed(data)
            except ServeError as exc:
                self._fail(call, grpc_status(exc.code), exc.message)
                return
            if call.queue is None:
                call.messages.extend(messages)
                size = sum(map(len, messages))
                call.held += size
                self._held += size
            else:
                for message in messages:
                    call.queue.put_nowait(call.method.parse(message))
        if end:
            self._ended(call)

    def _headers(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self._decoder.decode(block)
        call = self.calls.get(stream_id)
        if call is not None:  # trailers from the client: the end of its side
            if not flags & f.END_STREAM:
                raise f.ProtocolError("a second header block without END_STREAM")
            call.remote_closed = True
            self._ended(call)
            return
        if stream_id <= self._last_stream or not stream_id % 2:
            if stream_id <= self._last_stream:
                self._guard.on_idle_frame(self.loop.time())
                return  # a stream we already closed: headers after its end are ignored
            raise f.ProtocolError("a client stream id must be odd")
        self._last_stream = stream_id
        if len(self.calls) >= MAX_CONCURRENT_STREAMS:
            self._out += f.rst_stream(stream_id, f.REFUSED_STREAM)
            return
        self._request(stream_id, headers, bool(flags & f.END_STREAM))

    # ------------------------------------------------------------------------------------ incoming calls

    def _request(self, stream_id: int, headers: list[tuple[bytes, bytes]], end: bool) -> None:
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
            self._trailers_only(stream_id, end, grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
            return
        if method is None:
            self._trailers_only(stream_id, end, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        metadata = parse_metadata(headers)
        if self.state.restricted is not None:
            refused = self.state.restricted.refusal(grpc_category(path.decode("latin-1")), _lookup(metadata))
            if refused is not None:
                message = f"This protocol is restricted, expecting header '{refused.header}'"
                self._trailers_only(stream_id, end, grpc.StatusCode.UNAVAILABLE, message)
                return
        reader = MessageReader(self.state.max_message_bytes, encoding)
        call = _Call(stream_id, method, CallContext(method.name, metadata), reader, self._peer_window)
        if timeout is not None:
            try:
                seconds = parse_timeout(timeout)
            except ServeError as exc:
                self._trailers_only(stream_id, end, grpc_status(exc.code), exc.message)
                return
            call.deadline = self.loop.call_later(seconds, self._expire, call)
        self.calls[stream_id] = call
        if method.streaming:
            call.queue = asyncio.Queue()
            call.task = self.loop.create_task(self._run_stream(call))
        if end:
            self._ended(call)

    def _ended(self, call: _Call) -> None:
        call.remote_closed = True
        if call.queue is not None:
            call.queue.put_nowait(_END)
            return
        if len(call.messages) != 1 or call.reader.pending:
            self._fail(call, grpc.StatusCode.INTERNAL, "a unary call needs exactly one request message")
            return
        call.working = True
        self._working += 1
        call.task = self.loop.create_task(self._run_unary(call))

    def _end_work(self, call: _Call) -> None:
        """The call's handler returned, or the call was cancelled (a task cancelled before its first step
        never runs its ``finally``): its request no longer counts as work."""
        call.messages = []
        self._held -= call.held
        call.held = 0
        if call.working:
            call.working = False
            self._working -= 1
            if self._reading_paused:  # (reading is paused while the connection is busy)
                self._update_reading()

    def _expire(self, call: _Call) -> None:
        call.timed_out = True
        if call.task is not None:
            call.task.cancel()
        else:
            self._fail(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            self._flush()

    # ------------------------------------------------------------------------------------ running calls

    async def _answer(self, call: _Call) -> bytes:
        """The handler's answer as one framed message; the request and the response object die here."""
        handler = cast(UnaryHandler, call.method.handler)
        request = call.method.parse(call.messages.pop())
        return frame_message(call.method.serialize(await handler(request, call.context)))

    async def _run_unary(self, call: _Call) -> None:
        try:
            payload = await self._answer(call)
        except asyncio.CancelledError:
            if call.timed_out:
                self._fail(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
                self._flush()
            return
        except GrpcAbort as exc:
            self._fail(call, exc.code, exc.details)
            self._flush()
            return
        except Exception as exc:
            err = as_serve_error(exc)
            self._fail(call, grpc_status(err.code), err.message)
            self._flush()
            return
        finally:
            self._end_work(call)
        stream_id = call.id
        if self.transport is None or self.calls.get(stream_id) is not call:
            return
        size = len(payload)
        if (
            size <= call.send_window and size <= self._send_window and size <= self._peer_frame
            and not self._writing_paused
        ):  # fmt: skip
            call.send_window -= size
            self._send_window -= size
            self._out += (
                self._headers_frame(stream_id, _RESPONSE_HEADERS)
                + f.frame(f.DATA, 0, stream_id, payload)
                + self._headers_frame(stream_id, _OK_TRAILERS, end=True)
            )
        else:
            if not self._park(size):
                self._fail(call, grpc.StatusCode.RESOURCE_EXHAUSTED, _UNREAD)
                self._flush()
                return
            try:
                self._out += self._headers_frame(stream_id, _RESPONSE_HEADERS)
                await self._send_data(call, payload)
            except ConnectionError:
                return
            except asyncio.CancelledError:  # not raised on: the task would keep it, and its frames
                if call.timed_out and self.calls.get(stream_id) is call:
                    trailers = _trailers(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
                    self._out += self._headers_frame(stream_id, trailers, end=True)
                    self._done(call)
                    self._flush()
                return
            finally:
                self._unpark(size)
            self._out += self._headers_frame(stream_id, _OK_TRAILERS, end=True)
        self._done(call)
        self._flush_answer()

    def _park(self, size: int) -> bool:
        """Count an answer that waits for the client (False: over the caps, refuse it)."""
        budget = self.state.budget
        if not budget.admits(self._parked, size):
            return False
        self._parked += size
        budget.parked += size
        return True

    def _unpark(self, size: int) -> None:
        self._parked -= size
        self.state.budget.parked -= size

    def _headers_frame(self, stream_id: int, headers: tuple[tuple[bytes, bytes], ...], *, end: bool = False) -> bytes:
        """A HEADERS frame of ``headers`` through the connection's HPACK encoder: append it at once, in
        the order encoded."""
        self._guard.on_sent_data()
        flags = f.END_HEADERS | f.END_STREAM if end else f.END_HEADERS
        return f.frame(f.HEADERS, flags, stream_id, self._encoder.encode(headers))

    async def _run_stream(self, call: _Call) -> None:
        assert call.queue is not None
        handler = cast(StreamHandler, call.method.handler)
        started = False
        try:
            async for response in handler(_requests(call.queue), call.context):
                if self.calls.get(call.id) is not call:
                    return
                if not started:
                    self._out += self._headers_frame(call.id, _RESPONSE_HEADERS)
                    started = True
                message = frame_message(call.method.serialize(response))
                del response
                size = len(message)
                if min(call.send_window, self._send_window) >= size and not self._writing_paused:
                    await self._send_data(call, message)
                elif self._park(size):
                    try:
                        await self._send_data(call, message)
                    finally:
                        self._unpark(size)
                else:
                    raise GrpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, _UNREAD)
                del message
                self._flush()
            code, details = grpc.StatusCode.OK, ""
        except asyncio.CancelledError:
            if not call.timed_out:
                return
            code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        except GrpcAbort as exc:
            code, details = exc.code, exc.details
        except ConnectionError:
            return
        except Exception as exc:
            err = as_serve_error(exc)
            code, details = grpc_status(err.code), err.message
        if not started:
            self._fail(call, code, details)
        elif self.calls.get(call.id) is call:
            self._out += self._headers_frame(call.id, _trailers(code, details), end=True)
            self._done(call)
        self._flush()

    async def _send_data(self, call: _Call, payload: bytes) -> None:
        """Write ``payload`` as the peer's flow-control windows allow, waiting for them to open
        (ConnectionError if the call or the connection ends meanwhile)."""
        view = memoryview(payload)
        stream_id = call.id
        while view:
            room = 0 if self._writing_paused else min(call.send_window, self._send_window, self._peer_frame, len(view))
            if room <= 0:
                self._flush()
                waiter = self._waiters.get(stream_id)
                if waiter is None:
                    waiter = self._waiters[stream_id] = self.loop.create_future()
                await waiter
                if self.transport is None or self.calls.get(stream_id) is not call:
                    raise ConnectionError("the call ended while its response was sent")
                continue
            self._guard.on_sent_data()
            self._out += f.frame(f.DATA, 0, stream_id, bytes(view[:room]))
            call.send_window -= room
            self._send_window -= room
            view = view[room:]

    def _wake(self, stream_id: int) -> None:
        waiter = self._waiters.pop(stream_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            if not waiter.done():
                waiter.set_result(None)

    # ------------------------------------------------------------------------------------ ending calls

    def _fail(self, call: _Call, code: grpc.StatusCode, details: str) -> None:
        """End ``call`` with a status and no messages (gRPC's trailers-only response)."""
        if self.calls.get(call.id) is not call:
            return
        task = call.task
        self._done(call, reset=False)
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            self._end_work(call)
        self._trailers_only(call.id, call.remote_closed, code, details)

    def _trailers_only(self, stream_id: int, remote_closed: bool, code: grpc.StatusCode, details: str) -> None:
        self._out += self._headers_frame(stream_id, _RESPONSE_HEADERS + _trailers(code, details), end=True)
        if not remote_closed:  # the client still sends: it may stop now
            self._out += f.rst_stream(stream_id, f.NO_ERROR)

    def _done(self, call: _Call, *, reset: bool = True) -> None:
        if self.calls.get(call.id) is call:
            del self.calls[call.id]
        if call.deadline is not None:
            call.deadline.cancel()
        call.task = None  # the task ends on its own; the call keeping it would make a cycle (see above)
        if reset and not call.remote_closed:
            self._out += f.rst_stream(call.id, f.NO_ERROR)

    def _cancel(self, call: _Call) -> None:
        if call.deadline is not None:
            call.deadline.cancel()
        if call.task is not None and not call.task.done():
            call.task.cancel()
        call.task = None
        self._end_work(call)
        if call.queue is not None:
            call.queue = None

    def _end_all_calls(self) -> None:
        for call in list(self.calls.values()):
            self._cancel(call)
        self.calls.clear()
        self._wake_all()

    def _flush(self) -> None:
        if self._out and self.transport is not None and not self._ending:  # nothing after our GOAWAY
            self.transport.write(bytes(self._out))
        self._out.clear()

    def _flush_answer(self) -> None:
        """A unary call's answer: written now when no other call of the connection runs; else at the end of
        this loop turn, with the other answers ready by then (a batch's requests end together): one system
        call and one wake-up of the client for all of them."""
        if not self.calls:
            self._flush()
        elif not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush_at_turn_end)

    def _flush_at_turn_end(self) -> None:
        self._flush_due = False
        self._flush()


def _trailers(code: grpc.StatusCode, details: str) -> tuple[tuple[bytes, bytes], ...]:
    return tuple(status_trailers(code, details[:MAX_DETAILS_BYTES]))


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
