"""Request framing: a chunked body that also carries a Content-Length is read as chunked, as Triton reads it.

Some clients chunk-encode a body themselves and add ``Transfer-Encoding: chunked`` while their library adds a
``Content-Length`` too (Python's ``requests`` given ``data=`` bytes and that header).  RFC 9112 §6.3 says the
Transfer-Encoding overrides the Content-Length, and that a server that processes such a request must close the
connection after its response: a proxy in front may have framed it by the Content-Length, so whatever follows
the body on this connection can't be trusted.  Triton decodes it; uvicorn's httptools parser (llhttp) refuses
it with 400 ``Invalid HTTP request received.``, and its h11 parser, slower, hands the application the
Content-Length it did not frame the body by.

:class:`ChunkedWinsProtocol` is uvicorn's httptools protocol with llhttp's ``lenient_chunked_length`` (llhttp
then frames the body by its chunks and ignores the length).  For such a request it drops the Content-Length
from the request's headers, so the body limit applies to the bytes as they stream in (``read_body``); it
ignores anything the client sent after that body on the connection; and it closes the connection once the
response is sent and the body read to its end (with ``connection: close`` when the body ended first; closing
before its end would reset the connection under a client still sending, which then may never read its 413).
Other requests are parsed and served exactly as uvicorn does.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Where a request framed by its chunks despite a Content-Length is in its life on the connection.
_NONE, _READING, _READ = 0, 1, 2


class ChunkedWinsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn's own leniency, plus: Transfer-Encoding with Content-Length is framed by the chunks.
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True, lenient_chunked_length=True)
        self._both = _NONE

    # Everything after the body of such a request is ignored: the connection closes after its response.
    def on_message_begin(self) -> None:
        if self._both != _READ:
            super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if self._both != _READ:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._both != _READ:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._both == _READ:
            return
        if _chunked(self.headers) and any(name == b"content-length" for name, _ in self.headers):
            self._both = _READING
            self.headers[:] = [(name, value) for name, value in self.headers if name != b"content-length"]
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._both != _READ:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._both == _READ:
            return
        super().on_message_complete()
        if self._both == _READING:
            self._both = _READ
            if self.cycle.response_complete:  # answered before the body ended (413): its end is read, close
                self.transport.close()
            else:  # uvicorn answers with "connection: close" and closes once the response is sent
                self.cycle.keep_alive = False


def _chunked(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the (lower-cased) headers end the body's transfer codings with ``chunked``."""
    codings = [c.strip().lower() for name, value in headers if name == b"transfer-encoding" for c in value.split(b",")]
    return bool(codings) and codings[-1] == b"chunked"
