"""The infer route answered by the connection's protocol itself: no ASGI cycle, one write per response.

Why: on the route that carries the load, what uvicorn adds around an ASGI app costs about a tenth of
the gateway's CPU per request (measured in-process, ONNX add_sub: 143 against 129 µs): the
proxy-headers middleware, the ``http.response.*`` messages and the two writes they make (head, then
body), and a listener task per request for the client's disconnect.  Here, once uvicorn has parsed a
request's head, an untraced ``POST`` to the infer route that the restricted APIs let through runs
:meth:`FastInfer.respond` (the same steps and errors as the ASGI route) on a task of its own, reading
the body through uvicorn's cycle, and writes the head and body at once.  A client that closes its
connection cancels that task (the request leaves its queue, counted CANCELED, as on the ASGI route).
Every other request, and pipelining, keep-alive, ``Expect: 100-continue`` and graceful shutdown, stay
uvicorn's: the cycle's state is kept as uvicorn's own ``send`` would keep it.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from starlette.types import Receive, Scope
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from serve_app.http_server.disconnect import withdraw_cancel
from serve_app.http_server.head import BoundedHeadProtocol
from serve_app.http_server.infer_route import FastInfer
from serve_app.http_server.restricted import asgi_header
from serve_app.security.restricted import RestrictedApis, http_category

_CLOSE = b"connection: close\r\n"


class DirectInferProtocol(BoundedHeadProtocol):
    """uvicorn's protocol (bounded heads, chunked bodies framed by their chunks) with the infer route direct."""

    def __init__(self, *args: Any, route: FastInfer, restricted: RestrictedApis, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._route = route
        self._restricted = restricted
        self._direct: asyncio.Task[None] | None = None  # the direct request in progress (one per connection)
        self._gone = False

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        scope = cast(Scope, cycle.scope)
        target = self._route.untraced(scope)
        if target is None or (self._restricted and self._refused(scope)):
            super()._start_asgi_task(cycle, app)
            return
        task = self.loop.create_task(self._serve(cycle, *target))
        self._direct = task
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        task = self._direct
        if task is not None and not task.done():
            self._gone = True
            task.cancel()

    def _refused(self, scope: Scope) -> bool:
        """Whether the restricted APIs refuse it (the ASGI app then answers the 403)."""
        return self._restricted.refusal(http_category(scope["path"]), lambda name: asgi_header(scope, name)) is not None

    async def _serve(self, cycle: RequestResponseCycle, name: str, version: str) -> None:
        task = self._direct
        try:
            scope, receive = cast(Scope, cycle.scope), cast(Receive, cycle.receive)
            status, headers, body = await self._route.respond(name, version, scope, receive, None)
        except asyncio.CancelledError:
            if self._gone and task is not None and withdraw_cancel(task) == 0:
                return  # the client went away: nobody to answer
            raise
        finally:
            if self._direct is task:
                self._direct = None
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()  # the client reads slower than it sends: wait for it (a disconnect ends it)
        if cycle.disconnected:
            return
        _write(cycle, status, headers, body)


def _write(cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    """The response in one write, leaving the cycle as uvicorn's ``send`` would (complete, keep-alive or not)."""
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    content = [STATUS_LINE[status]]
    for name, value in (*cycle.default_headers, *headers):
        content += (name, b": ", value, b"\r\n")
    if not cycle.keep_alive:
        content.append(_CLOSE)
    content += (b"\r\n", body)
    cycle.transport.write(b"".join(content))
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()
