"""A direct call channel from a gateway to a model instance: asyncio TCP, pickle protocol 5.

Why not a Ray Serve handle call per batch: on our machines one costs about 2 ms
of CPU in the caller and 3 ms in the replica (router, metrics, tracing, task
submission), whatever it carries.  This channel costs a pickle and a socket
write on each side.  Ray Serve still places, health-checks, restarts and scales
the replicas; each one opens a channel server, the gateway learns the addresses
through Serve and keeps the Serve handle as the path of last resort.

Frames: ``!II`` (pickle length, buffer count), ``!Q`` per buffer length, the
pickle, then the out-of-band buffers (numpy arrays' memory, written without
copying and read back as zero-copy, read-only views).  Calls are
``(call_id, payload)``; answers are ``(call_id, ok, result or error)`` and may
come back in any order.  A handler that returns an async iterator answers a
*stream* (:meth:`ChannelClient.stream`): one ``(call_id, ITEM, item)`` frame per
item as it is produced (the writer's buffer applies back-pressure), then the
usual final answer; a client that stops reading sends ``(CANCEL, call_id)`` and
the server stops the iterator.  A call's or stream's payload may carry cancel signals
(a ``cancel_signals()`` method, see :mod:`~serve_app.inference.cancel`): when
the client's n-th fires, it sends ``(CANCEL_PART, (call_id, n))`` and the server
fires the n-th of its copy of the payload, leaving the stream running.
One-way messages (``call_id`` -1, :meth:`ChannelClient.post`) get no answer:
the server hands them to its synchronous ``oneway`` handler.

A connection starts with :mod:`~serve_app.transport.handshake`: both ends prove
they hold the shared key (no secret crosses the wire) before a frame is sent or
loaded.  A server closes a connection that has not finished it within
:data:`HANDSHAKE_TIMEOUT_S` and holds at most :data:`MAX_UNAUTHENTICATED` such
connections at once; either end refuses a frame larger than :data:`MAX_FRAME_BYTES`
(announced before it is read) and closes the connection.  When Ray runs with
TLS, the channel runs over TLS with Ray's certificates (:mod:`~serve_app.transport.tls`);
otherwise frames are not encrypted and, like Ray's own ports, the channel assumes a
trusted cluster network: bind it to the node's address, not a public one.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import pickle
import socket
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from serve_app.errors import ResourceExhausted, Unavailable, as_serve_error
from serve_app.inference.cancel import CancelSignal
from serve_app.transport import handshake, pickling
from serve_app.transport.tls import ChannelTls, process_tls

logger = logging.getLogger("serve_app")

_HEAD = struct.Struct("!II")
_RECV_BYTES = 1 << 16  # one lane read: a call of a small model fits whole
_MAX_BUFFERS = 1 << 16
MAX_FRAME_BYTES = 1 << 31  # one call or answer: a batch of requests at the front ends' body limit fits
HANDSHAKE_TIMEOUT_S = 10.0
MAX_UNAUTHENTICATED = 64  # connections a server holds while their handshake is unfinished


def encode(message: Any) -> list[bytes | memoryview]:
    """A message as frames for ``writelines``; numpy buffers travel out of band, uncopied."""
    buffers: list[memoryview] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        try:
            buffers.append(buf.raw())
        except BufferError:  # not contiguous: pickle it in band
            return True
        return False

    main = pickling.dumps(message, out_of_band)
    size = len(main) + sum(b.nbytes for b in buffers)
    if size > MAX_FRAME_BYTES:
        raise ResourceExhausted(f"a channel message of {size} bytes is over the channel's limit of {MAX_FRAME_BYTES}")
    head = _HEAD.pack(len(main), len(buffers))
    if buffers:
        head += struct.pack(f"!{len(buffers)}Q", *(b.nbytes for b in buffers))
    return [head, main, *buffers]


class FrameTooLarge(ValueError):
    """A frame announced more bytes than :data:`MAX_FRAME_BYTES`: nothing of it is read."""


async def read_message(reader: asyncio.StreamReader) -> Any:
    main_len, count = _counts(await reader.readexactly(_HEAD.size))
    lengths = _lengths(main_len, count, await reader.readexactly(8 * count) if count else b"")
    return _load(memoryview(await reader.readexactly(main_len + sum(lengths))), main_len, lengths)


def _counts(head: bytes | bytearray | memoryview) -> tuple[int, int]:
    """A frame's pickle length and buffer count, from its first bytes."""
    main_len, count = _HEAD.unpack(head)
    if count > _MAX_BUFFERS:
        raise ValueError(f"frame announces {count} buffers")
    return int(main_len), int(count)


def _lengths(main_len: int, count: int, raw: bytes | bytearray | memoryview) -> tuple[int, ...]:
    """The buffers' lengths; the whole frame is refused, unread, when it is over the limit."""
    lengths: tuple[int, ...] = struct.unpack(f"!{count}Q", raw) if count else ()
    if main_len + sum(lengths) > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"frame of {main_len + sum(lengths)} bytes is over the limit of {MAX_FRAME_BYTES}")
    return lengths


def _load(blob: memoryview, main_len: int, lengths: tuple[int, ...]) -> Any:
    """The message: its pickle, with its buffers as zero-copy views of ``blob``."""
    buffers = []
    offset = main_len
    for n in lengths:
        buffers.append(blob[offset : offset + n])
        offset += n
    return pickle.loads(blob[:main_len], buffers=buffers)


def recv_exact(sock: socket.socket, n: int) -> memoryview:
    """``n`` bytes from a blocking socket (EOFError when the peer closed it first)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise EOFError("the peer closed the connection")
        got += k
    return view


class FrameBuffer:
    """Messages from bytes as a non-blocking socket gives them (an instance's lane, read on the instance's thread).

    One ``recv`` usually brings a whole call, where reading the head, the lengths and the body in turn
    from a socket with a timeout cost six system calls (a ``poll`` before each ``recv``); a frame
    still incomplete waits here, holding no thread, until the rest arrives.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, sock: socket.socket) -> None:
        """What ``sock`` has (call it when readable: EOFError when the peer closed it)."""
        try:
            data = sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):  # woken with nothing to read after all
            return
        if not data:
            raise EOFError("the peer closed the connection")
        self._buf += data

    def add(self, data: bytes) -> None:
        """Bytes an event loop read for us (a protocol's ``data_received``)."""
        self._buf += data

    def messages(self) -> list[Any]:
        """The messages now whole, in order; their arrays are views of the bytes read (FrameTooLarge,
        ValueError or an unpickling error for a frame that does not load)."""
        out: list[Any] = []
        buf = self._buf
        while len(buf) >= _HEAD.size:
            main_len, count = _counts(buf[: _HEAD.size])
            start = _HEAD.size + 8 * count
            if len(buf) < start:
                break
            lengths = _lengths(main_len, count, buf[_HEAD.size : start])
            end = start + main_len + sum(lengths)
            if len(buf) < end:
                break
            if end == len(buf):  # the usual case: the buffer is this one frame, and its arrays keep it
                blob, buf = memoryview(buf)[start:], bytearray()
            else:
                blob = memoryview(bytes(buf[start:end]))
                del buf[:end]
            out.append(_load(blob, main_len, lengths))
        self._buf = buf
        return out


Address = tuple[str, int] | str  # (host, port), or a Unix socket's path
Handler = Callable[[Any], Awaitable[Any]]
OneWay = Callable[[Any], None]
ONE_WAY = -1
CANCEL = -2  # (CANCEL, call_id): the client no longer reads that stream
CANCEL_PART = -3  # (CANCEL_PART, (call_id, n)): fire the n-th cancel signal of that stream's payload
ITEM = 2  # the ``ok`` slot of a frame that carries one item of a stream
_DRAIN_BYTES = 1 << 20  # a stream waits for the socket when this much is buffered
CLOSED = "the channel to the peer is closed"


def _time_out(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())


class _Outbox:
    """Frames written in one event-loop turn leave in at most two ``writelines`` (few system calls under load)."""

    __slots__ = ("_drain", "_frames", "_scheduled", "_writer")

    def __init__(
        self, writer: asyncio.WriteTransport, drain: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """``drain``: waits until the socket takes more (what :meth:`room` awaits; a server's stream writer's)."""
        self._writer = writer
        self._drain = drain
        self._frames: list[bytes | memoryview] = []
        self._scheduled = False

    def put(self, frames: list[bytes | memoryview]) -> None:
        if self._scheduled:
            self._frames.extend(frames)
            return
        # The first message of a turn leaves at once (a lone call waits for nothing); the ones that follow
        # it in the same turn leave together when the turn ends.
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._flush)
        if not self._writer.is_closing():
            self._writer.writelines(frames)

    def _flush(self) -> None:
        self._scheduled = False
        frames, self._frames = self._frames, []
        if frames and not self._writer.is_closing():
            self._writer.writelines(frames)

    async def room(self) -> None:
        """Wait while the socket's buffer is full (a stream's back-pressure)."""
        if self._writer.get_write_buffer_size() + sum(len(f) for f in self._frames) > _DRAIN_BYTES:
            self._flush()
            if self._drain is not None:
                await self._drain()


class ChannelBroken(Unavailable):
    """The connection itself failed (as opposed to an error the other side answered with).  Its message names
    no address (clients read it in a 503); whoever knows the model and instance says which it was."""


def _forget(calls: dict[int, Any], call_id: int, _: asyncio.Task[None]) -> None:
    calls.pop(call_id, None)


def cancel_signals(payload: Any) -> tuple[CancelSignal | None, ...]:
    """The cancel signals a stream's payload carries (none by default)."""
    method = getattr(payload, "cancel_signals", None)
    return tuple(method()) if method is not None else ()


def _soon(loop: asyncio.AbstractEventLoop, call: Callable[[int, int], None], call_id: int, n: int) -> None:
    """``call(call_id, n)`` on ``loop`` (a signal may fire in any thread, even once the loop is gone)."""
    if not loop.is_closed():
        loop.call_soon_threadsafe(call, call_id, n)


def _fire(signals: tuple[CancelSignal | None, ...], index: Any) -> None:
    if isinstance(index, int) and 0 <= index < len(signals):
        signal = signals[index]
        if signal is not None:
            signal.fire()


class ChannelServer:
    """Serves ``handler(payload)`` to authenticated clients; calls run concurrently."""

    def __init__(
        self, handler: Handler, token: bytes, oneway: OneWay | None = None, tls: ChannelTls | None = None
    ) -> None:
        """``tls``: the contexts to serve over TLS with; by default Ray's, when Ray runs with TLS."""
        self._tls = tls if tls is not None else process_tls()
        self._handler = handler
        self._oneway = oneway
        self._token = token
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.unauthenticated = 0  # connections whose handshake is unfinished

    async def start(self, host: str, port: int = 0) -> tuple[str, int]:
        if self._tls is None:
            self._server = await asyncio.start_server(self._serve, host, port)
        else:
            self._server = await asyncio.start_server(
                self._serve, host, port, ssl=self._tls.server, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S
            )
        sock = self._server.sockets[0]
        return host, int(sock.getsockname()[1])

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonce = handshake.new_nonce()
        writer.write(handshake.hello(nonce))
        response = await reader.readexactly(handshake.RESPONSE_BYTES)
        writer.write(handshake.check_client(self._token, nonce, response))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.unauthenticated >= MAX_UNAUTHENTICATED:
                return
            self.unauthenticated += 1
            try:
                await asyncio.wait_for(self._authenticate(reader, writer), HANDSHAKE_TIMEOUT_S)
            finally:
                self.unauthenticated -= 1
            outbox = _Outbox(writer.transport, writer.drain)
            streams: dict[int, asyncio.Task[None]] = {}  # this connection's calls in progress, by id
            signals: dict[int, tuple[CancelSignal | None, ...]] = {}  # their payloads' cancel signals
            while True:
                call_id, payload = await read_message(reader)
                if call_id == ONE_WAY:
                    self._one_way(payload)
                    continue
                if call_id == CANCEL:
                    running = streams.get(payload)
                    if running is not None:
                        running.cancel()
                    continue
                if call_id == CANCEL_PART:
                    _fire(signals.get(payload[0], ()), payload[1])
                    continue
                task = asyncio.get_running_loop().create_task(self._call(call_id, payload, outbox))
                streams[call_id] = task
                if cancel_signals(payload):
                    signals[call_id] = cancel_signals(payload)
                    task.add_done_callback(functools.partial(_forget, signals, call_id))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                task.add_done_callback(functools.partial(_forget, streams, call_id))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError, handshake.HandshakeFailed):
            pass
        except FrameTooLarge as exc:
            logger.warning("channel: connection closed: %s", exc)
        except Exception:
            logger.exception("channel connection failed")
        finally:
            writer.close()

    def _one_way(self, payload: Any) -> None:
        if self._oneway is None:
            logger.warning("channel: one-way %s ignored (no handler)", type(payload).__name__)
            return
        try:
            self._oneway(payload)
        except Exception:
            logger.exception("channel: one-way %s failed", type(payload).__name__)

    async def _call(self, call_id: int, payload: Any, outbox: _Outbox) -> None:
        try:
            result = await self._handler(payload)
            if isinstance(result, AsyncIterator):
                async for item in result:
                    outbox.put(encode((call_id, ITEM, item)))
                    await outbox.room()
                result = None
            message = (call_id, True, result)
        except asyncio.CancelledError:  # the client stopped reading this stream
            return
        except Exception as exc:  # the caller gets the error; the connection stays up
            message = (call_id, False, as_serve_error(exc))
        try:
            frames = encode(message)
        except ResourceExhausted as exc:  # an answer over the frame limit
            frames = encode((call_id, False, exc))
        outbox.put(frames)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


class ChannelClient:
    """One connection to one instance; many calls in flight, answered by id."""

    def __init__(self, address: Address, tls: ChannelTls | None = None) -> None:
        """``address``: (host, port), or the path of a Unix socket (an instance's lane on this node: no TLS,
        the socket never leaves the machine); ``tls``: the contexts to connect over TLS with; by default Ray's,
        when Ray runs with TLS."""
        self.address = address
        self._tls = tls if tls is not None else process_tls()
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, asyncio.Queue[tuple[int, Any]]] = {}
        self._ids = itertools.count()
        self.closed = False
        self.inflight = 0

    async def connect(self, token: bytes, timeout: float = 5.0) -> None:
        """Connect and run the handshake: nothing is sent or loaded before the peer has proved the key.
        Raises OSError or TimeoutError (unreachable) or ChannelBroken (the handshake failed)."""
        if isinstance(self.address, str):
            opening = asyncio.open_unix_connection(self.address)
        else:
            host, port = self.address
            context = self._tls.client if self._tls is not None else None
            opening = asyncio.open_connection(host, port, ssl=context)
        reader, writer = await asyncio.wait_for(opening, timeout)
        try:
            await asyncio.wait_for(self._authenticate(token, reader, writer), timeout)
        except (asyncio.IncompleteReadError, ConnectionError, handshake.HandshakeFailed) as exc:
            writer.close()
            why = str(exc) if isinstance(exc, handshake.HandshakeFailed) else "it closed the connection"
            raise ChannelBroken(f"the channel's peer failed the handshake: {why}") from None
        except BaseException:
            writer.close()
            raise
        # From here on answers are read by a protocol, in the event loop's own callback: no task wakes per
        # answer and no stream buffer copies it.  Nothing waits in ``reader``: the server has sent nothing
        # since its proof, as it only ever answers calls.
        # (The stream writer is kept: one that is garbage-collected closes its transport.)
        writer.transport.set_protocol(_AnswerReader(self))
        self._writer = writer
        self._outbox = _Outbox(writer.transport)

    @staticmethod
    async def _authenticate(token: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client_nonce = handshake.new_nonce()
        response, server_nonce = handshake.respond(token, await reader.readexactly(handshake.HELLO_BYTES), client_nonce)
        writer.write(response)
        proof = await reader.readexactly(handshake.PROOF_BYTES)
        handshake.check_server(token, server_nonce, client_nonce, proof)

    async def call(self, payload: Any) -> Any:
        return await self.send(payload)

    def post(self, payload: Any) -> None:
        """Send a one-way message (no answer), in order with calls."""
        if self.closed or self._writer is None:
            raise ChannelBroken(CLOSED)
        self._outbox.put(encode((ONE_WAY, payload)))

    def send(self, payload: Any, timeout_s: float | None = None) -> asyncio.Future[Any]:
        """Queue one call for writing (calls leave in the order they are sent) and return its result's future,
        failed with ``TimeoutError`` when no answer came within ``timeout_s`` (a timer on the future, where
        ``asyncio.wait_for`` would wrap each call in a task of its own; its answer, if it comes, is dropped)."""
        if self.closed or self._writer is None:
            raise ChannelBroken(CLOSED)
        call_id = next(self._ids)
        frames = encode((call_id, payload))  # over the frame limit: raises here, nothing sent
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[call_id] = fut
        self.inflight += 1
        timer = loop.call_later(timeout_s, _time_out, fut) if timeout_s is not None else None
        stops = [
            signal.listen(functools.partial(_soon, loop, self._cancel_part, call_id, n))
            for n, signal in enumerate(cancel_signals(payload))
            if signal is not None
        ]

        def done(_: asyncio.Future[Any]) -> None:
            self.inflight -= 1
            self._pending.pop(call_id, None)
            if timer is not None:
                timer.cancel()
            for stop in stops:
                stop()

        fut.add_done_callback(done)
        self._outbox.put(frames)
        return fut

    async def stream(self, payload: Any) -> AsyncGenerator[Any, None]:
        """A call whose answer is a stream: its items as they arrive.  Leaving the loop early tells the
        server to stop producing them."""
        if self.closed or self._writer is None:
            raise ChannelBroken(CLOSED)
        call_id = next(self._ids)
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._streams[call_id] = queue
        self.inflight += 1
        ended = False
        loop = asyncio.get_running_loop()
        stops = [
            signal.listen(functools.partial(_soon, loop, self._cancel_part, call_id, n))
            for n, signal in enumerate(cancel_signals(payload))
            if signal is not None
        ]
        try:
            self._outbox.put(encode((call_id, payload)))
            while True:
                kind, value = await queue.get()
                if kind == ITEM:
                    yield value
                    continue
                ended = True
                if kind is False:
                    raise value
                return
        finally:
            for stop in stops:
                stop()
            self.inflight -= 1
            self._streams.pop(call_id, None)
            if not ended and not self.closed:
                self._outbox.put(encode((CANCEL, call_id)))

    def _cancel_part(self, call_id: int, n: int) -> None:
        """Tell the server to fire the n-th cancel signal of a call or stream still open."""
        if (call_id in self._streams or call_id in self._pending) and not self.closed:
            self._outbox.put(encode((CANCEL_PART, (call_id, n))))

    def _answer(self, call_id: int, ok: Any, result: Any) -> None:
        queue = self._streams.get(call_id)
        if queue is not None:
            queue.put_nowait((ok, result))
            return
        fut = self._pending.get(call_id)
        if fut is not None and not fut.done():
            if ok:
                fut.set_result(result)
            else:
                fut.set_exception(result)

    def _fail(self, reason: str) -> None:
        self.closed = True
        err = ChannelBroken(f"the channel's peer is unavailable: {reason}")
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        for queue in self._streams.values():
            queue.put_nowait((False, err))
        if self._writer is not None:
            self._writer.close()

    def close(self) -> None:
        self._fail("closed by the gateway")


class _AnswerReader(asyncio.Protocol):
    """A client's connection once its handshake is done: answers are loaded as the loop reads their bytes."""

    def __init__(self, client: ChannelClient) -> None:
        self._client = client
        self._inbox = FrameBuffer()

    def data_received(self, data: bytes) -> None:
        self._inbox.add(data)
        try:
            for call_id, ok, result in self._inbox.messages():
                self._client._answer(call_id, ok, result)
        except Exception as exc:  # a frame that does not load: the connection can't be read on
            logger.exception("channel to %s failed", self._client.address)
            self._client._fail(f"bad frame: {exc}")

    def eof_received(self) -> bool:
        return False  # the transport closes: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._client._fail(f"connection lost ({type(exc).__name__})" if exc is not None else "connection closed")
