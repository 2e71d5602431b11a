"""An instance's one thread: the work its process hands it, and the lane gateways on its node call it through.

Triton runs each instance's executions on one thread of its own, and a Python
model's stub waits on shared memory for the next batch with nothing between.
Here the instance's thread is that place: it runs what its process submits
(load, warmup, sequence steps, streams, batches that came over the channel),
one at a time and in order, as a one-worker thread pool would, and it also
serves its *lane*: a Unix socket that gateways on the same node send
:class:`~serve_app.hosting.messages.ExecuteOn` batches to.  A lane call is
read, executed and answered on this thread, so it pays no hand-off between
the process's event loop and the instance's thread (two thread wake-ups and
about 0.1 ms per call for a small model on our 2-core machines) and no
asyncio in the model's process.  Model code still runs on the thread that ran
its ``initialize`` (Triton's contract: thread-local state such as torch's
grad mode holds), and a BLS call from it still goes to the process's event
loop, which is free.

The lane speaks the channel's frames and handshake (:mod:`~serve_app.transport.channel`),
so a gateway's :class:`~serve_app.transport.ChannelClient` calls it as it
calls a channel.  Its socket is created in a directory only this user can
enter, and a connection must still prove the channel's key before a frame is
loaded.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import selectors
import shutil
import socket
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from serve_app.errors import as_serve_error
from serve_app.transport import handshake
from serve_app.transport.channel import FrameBuffer, encode, recv_exact

logger = logging.getLogger("ray.serve")

LaneHandler = Callable[[Any], Any]  # a lane call's payload -> its result (raises: the caller gets the error)
HANDSHAKE_TIMEOUT_S = 2.0  # a lane connection that has not proved the key by then is closed
SEND_TIMEOUT_S = 30.0  # an answer the gateway does not read by then closes its connection
_AF_UNIX_PATH_MAX = 107


class InstanceThread(Executor):
    """A one-worker executor whose worker also serves the instance's lane between tasks."""

    def __init__(self, name: str) -> None:
        self._tasks: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = deque()
        self._lock = threading.Lock()
        self._waiting = False  # the worker sleeps in select(): a submit must wake it
        self._stopped = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lane_dir = ""
        self._lane: socket.socket | None = None
        self._handler: LaneHandler | None = None
        self._token = b""
        self.lane_calls = 0  # lane calls in progress (0 or 1: they run on this thread)
        self._worker = threading.Thread(target=self._run, name=name, daemon=True)
        self._worker.start()

    # -- the executor --------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        call = functools.partial(fn, **kwargs) if kwargs else fn
        with self._lock:
            if self._stopped:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._tasks.append((future, call, args))
            wake = self._waiting
            self._waiting = False
        if wake:
            with contextlib.suppress(BlockingIOError):
                self._wake_w.send(b"\0")
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._stopped = True
            if cancel_futures:
                while self._tasks:
                    self._tasks.popleft()[0].cancel()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        if wait and threading.current_thread() is not self._worker:
            self._worker.join()

    # -- the lane ------------------------------------------------------------------
    def open_lane(self, handler: LaneHandler, token: bytes, instance_id: str) -> str:
        """Serve ``handler`` to gateways on this node at a Unix socket; its path ("" when no socket could be
        made here, e.g. a path too long for the platform: gateways then use the channel)."""
        if self._lane is not None:
            return str(self._lane.getsockname())
        directory = tempfile.mkdtemp(prefix="serve_app-lane-")  # mode 0700: only this user enters it
        path = os.path.join(directory, "lane.sock")
        if len(path.encode()) > _AF_UNIX_PATH_MAX:
            shutil.rmtree(directory, ignore_errors=True)
            return ""
        lane = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lane.bind(path)
            lane.listen(64)
        except OSError as exc:
            lane.close()
            shutil.rmtree(directory, ignore_errors=True)
            logger.warning("instance %s: no lane (%s); gateways use its channel", instance_id, exc)
            return ""
        lane.setblocking(False)
        self._lane_dir, self._lane, self._handler, self._token = directory, lane, handler, token
        self.submit(self._selector.register, lane, selectors.EVENT_READ, self._accept)
        return path

    def _accept(self, lane: socket.socket) -> None:
        try:
            conn, _ = lane.accept()
        except (BlockingIOError, InterruptedError):
            return
        try:
            conn.settimeout(HANDSHAKE_TIMEOUT_S)
            nonce = handshake.new_nonce()
            conn.sendall(handshake.hello(nonce))
            conn.sendall(handshake.check_client(self._token, nonce, bytes(recv_exact(conn, handshake.RESPONSE_BYTES))))
        except (OSError, EOFError, handshake.HandshakeFailed):
            conn.close()
            return
        conn.setblocking(False)
        self._selector.register(conn, selectors.EVENT_READ, functools.partial(self._serve, FrameBuffer()))

    def _serve(self, inbox: FrameBuffer, conn: socket.socket) -> None:
        """Read what ``conn`` sent; run each call now whole, here, and answer it."""
        try:
            inbox.feed(conn)
            calls = inbox.messages()
        except Exception as exc:  # closed, or a frame that does not load: only this connection ends
            if not isinstance(exc, (EOFError, ConnectionError)):
                logger.warning("lane connection closed: %s", exc)
            self._selector.unregister(conn)
            conn.close()
            return
        for call_id, payload in calls:
            if not self._answer(conn, call_id, payload):
                return

    def _answer(self, conn: socket.socket, call_id: int, payload: Any) -> bool:
        """Run one call and send its answer; False when that closed the connection."""
        assert self._handler is not None
        self.lane_calls += 1
        try:
            message = (call_id, True, self._handler(payload))
        except BaseException as exc:  # the caller gets the error; the connection and this thread stay up
            message = (call_id, False, as_serve_error(exc))
        finally:
            self.lane_calls -= 1
        try:
            frames = encode(message)
        except Exception as exc:  # over the frame limit, or an answer that does not pickle: the caller is told
            frames = encode((call_id, False, as_serve_error(exc)))
        try:
            _send_all(conn, frames)
        except OSError:
            self._selector.unregister(conn)
            conn.close()
            return False
        return True

    # -- the worker ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    task = self._tasks.popleft() if self._tasks else None
                    if task is None:
                        if self._stopped:
                            return
                        self._waiting = True
                if task is not None:
                    _run_task(*task)
                    if self._lane is None:
                        continue
                for key, _ in self._selector.select(None if task is None else 0):
                    if key.data is None:
                        with contextlib.suppress(BlockingIOError):
                            self._wake_r.recv(4096)
                        continue
                    try:
                        key.data(key.fileobj)
                    except Exception:  # a lane connection's failure never stops the instance's thread
                        logger.exception("lane connection failed")
        finally:
            self._close_lane()

    def _close_lane(self) -> None:
        for key in list(self._selector.get_map().values()):
            if key.fileobj is not self._wake_r:
                with contextlib.suppress(OSError):
                    key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        if self._lane_dir:
            shutil.rmtree(self._lane_dir, ignore_errors=True)


def _run_task(future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args)
    except BaseException as exc:  # as a thread pool does: SystemExit from model code reaches its caller
        future.set_exception(exc)
    else:
        future.set_result(result)


def _send_all(conn: socket.socket, frames: list[bytes | memoryview]) -> None:
    """Every byte of ``frames`` on a non-blocking socket: what fits at once, then the rest as the reader takes it
    (TimeoutError, an OSError, when it takes nothing for :data:`SEND_TIMEOUT_S`)."""
    views = [memoryview(f).cast("B") for f in frames]
    while views:
        try:
            sent = conn.sendmsg(views)
        except BlockingIOError:
            sent = 0
        while views and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]
        if views and not select.select([], [conn], [], SEND_TIMEOUT_S)[1]:
            raise TimeoutError("the gateway did not read its answer")
