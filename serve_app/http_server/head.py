"""Bounds on an HTTP request's head: the request line, the headers' count and bytes, and its time.

uvicorn's httptools protocol takes a request line and headers of any size (the URL is grown by
concatenation, so its cost is quadratic) and waits for ever for a head that never completes.  Here
the head is checked as its bytes arrive, before the app sees the request: a request line over
``MAX_REQUEST_LINE_BYTES`` gets 414, more than ``MAX_HEADERS`` headers or a head over
``MAX_HEAD_BYTES`` get 431 (with Triton's ``{"error": ...}`` body), and a connection whose head is not
complete ``HEAD_TIMEOUT_S`` after the connection or the request began is closed.  Between requests
uvicorn's keep-alive timeout applies.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from serve_app import limits
from serve_app.http_server.framing import _READ, ChunkedWinsProtocol

_REASONS = {414: b"URI Too Long", 431: b"Request Header Fields Too Large"}


class _HeadRefused(Exception):
    """Raised from a parser callback to stop parsing a head that is over a limit."""


class BoundedHeadProtocol(ChunkedWinsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # between the end of a request's body (or the connection's start) and its head's end
        self._head_bytes = 0
        self._header_count = 0
        self._field_bytes = 0  # the headers' names and values of the request being parsed, with their separators
        self._refusal: tuple[int, str] | None = None
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # Counted per read: the read that completes a head may also carry its body's first bytes.
        if self._in_head and self._head_bytes > limits.MAX_HEAD_BYTES and self._refusal is None:
            self._refuse(431, f"the request line and headers are over {limits.MAX_HEAD_BYTES} bytes")
            self.send_400_response("")

    # Parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._both == _READ:  # bytes after a body framed by its chunks: ignored, the connection closes
            return
        self._in_head = True
        self._header_count = 0
        self._field_bytes = 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > limits.MAX_REQUEST_LINE_BYTES:
            self._refuse(414, f"the request line is over {limits.MAX_REQUEST_LINE_BYTES} bytes")
            raise _HeadRefused

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > limits.MAX_HEADERS:
            self._refuse(431, f"the request has more than {limits.MAX_HEADERS} headers")
            raise _HeadRefused
        # The reads' count misses a head completed by the read that crosses the limit: its fields count here.
        self._field_bytes += len(name) + len(value) + 4
        if len(self.url) + self._field_bytes > limits.MAX_HEAD_BYTES:
            self._refuse(431, f"the request line and headers are over {limits.MAX_HEAD_BYTES} bytes")
            raise _HeadRefused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # the next request's head, if any, is counted from here
        self._head_bytes = 0

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request the parser refused; ours when a head limit refused it."""
        if self._refusal is None:
            super().send_400_response(msg)
            return
        status, text = self._refusal
        body = json.dumps({"error": text}).encode()
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, _REASONS[status], len(body))
        )
        self.transport.write(head + body)
        self.transport.close()

    def _refuse(self, status: int, text: str) -> None:
        self._refusal = (status, text)
        self._disarm()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(limits.HEAD_TIMEOUT_S, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self.transport.close()
