"""One gRPC call as the handlers see it, and the gRPC-over-HTTP/2 rules that are pure code.

The wire rules are those of gRPC's PROTOCOL-HTTP2 document: each message is a 5-byte prefix (compressed
flag, big-endian length) and its bytes; the status travels in trailers (``grpc-status``, a
percent-encoded ``grpc-message``); ``grpc-timeout`` is an integer and a unit.
"""

from __future__ import annotations

import base64
import gzip
import zlib
from collections.abc import Callable
from urllib.parse import quote, unquote

import grpc

from serve_app.errors import InvalidArgument, ResourceExhausted, ServeError

MESSAGE_PREFIX = 5
ACCEPT_ENCODING = b"identity,deflate,gzip"
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_DECOMPRESS: dict[bytes, Callable[[bytes], bytes]] = {b"gzip": gzip.decompress, b"deflate": zlib.decompress}
# Printable ASCII but '%' travels as it is in grpc-message; everything else is percent-encoded.
_MESSAGE_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")

Metadata = tuple[tuple[str, str | bytes], ...]


class GrpcAbort(Exception):
    """Ends a call with ``code`` and ``details`` (what ``grpc.aio``'s ``context.abort`` raises)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CallContext:
    """The servicer context of one call: its metadata and ``abort``, as ``grpc.aio`` offers them."""

    __slots__ = ("_metadata", "method")

    def __init__(self, method: str, metadata: Metadata) -> None:
        self.method = method
        self._metadata = metadata

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise GrpcAbort(code, details)


def parse_metadata(headers: list[tuple[bytes, bytes]]) -> Metadata:
    """The call's custom metadata: every header but pseudo-headers and gRPC's own; ``-bin`` values decoded."""
    out: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name[:1] == b":" or name.startswith(b"grpc-") or name in (b"content-type", b"te", b"user-agent"):
            continue
        key = name.decode("latin-1")
        if key.endswith("-bin"):
            out.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
        else:
            out.append((key, value.decode("latin-1")))
    return tuple(out)


def parse_timeout(value: bytes) -> float:
    """Seconds from a ``grpc-timeout`` value such as ``100m`` (InvalidArgument if it is not one)."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        raise InvalidArgument(f"malformed grpc-timeout '{value.decode('latin-1')}'")
    return int(digits) * unit


def status_trailers(code: grpc.StatusCode, details: str) -> list[tuple[bytes, bytes]]:
    trailers = [(b"grpc-status", str(code.value[0]).encode())]
    if details:
        trailers.append((b"grpc-message", quote(details, safe=_MESSAGE_SAFE).encode("ascii")))
    return trailers


def decode_details(value: bytes) -> str:
    """The inverse of the ``grpc-message`` encoding (for tests and clients of our own)."""
    return unquote(value.decode("ascii"))


def frame_message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


class MessageReader:
    """Splits a stream's DATA into messages; refuses one longer than ``max_bytes`` from its prefix alone."""

    __slots__ = ("_buffer", "encoding", "max_bytes")

    def __init__(self, max_bytes: int, encoding: bytes | None) -> None:
        self._buffer = bytearray()
        self.max_bytes = max_bytes
        self.encoding = encoding

    def feed(self, data: bytes) -> list[bytes]:
        """The messages completed by ``data`` (ServeError for one too long or badly compressed)."""
        buffer = self._buffer
        if not buffer and len(data) >= MESSAGE_PREFIX:
            # The common case: one whole message in one DATA frame, taken without copying into the buffer.
            length = int.from_bytes(data[1:5], "big")
            if len(data) == MESSAGE_PREFIX + length:
                self._check(length)
                return [self._payload(data[0], data[MESSAGE_PREFIX:])]
        buffer += data
        messages: list[bytes] = []
        while len(buffer) >= MESSAGE_PREFIX:
            length = int.from_bytes(buffer[1:5], "big")
            self._check(length)
            end = MESSAGE_PREFIX + length
            if len(buffer) < end:
                break
            with memoryview(buffer) as view:  # one copy of the message, not a bytearray slice and then bytes
                payload = bytes(view[MESSAGE_PREFIX:end])
            messages.append(self._payload(buffer[0], payload))
            del buffer[:end]
        return messages

    @property
    def pending(self) -> bool:
        return bool(self._buffer)

    def _check(self, length: int) -> None:
        if length > self.max_bytes:
            raise ResourceExhausted(f"Received message larger than max ({length} vs. {self.max_bytes})")

    def _payload(self, flag: int, payload: bytes) -> bytes:
        if not flag:
            return payload
        decompress = _DECOMPRESS.get(self.encoding or b"identity")
        if decompress is None:
            raise _unimplemented_encoding(self.encoding)
        try:
            data = decompress(payload)
        except (OSError, zlib.error, EOFError) as exc:
            raise InvalidArgument(f"failed to decompress the request message: {exc}") from None
        self._check(len(data))
        return data


def _unimplemented_encoding(encoding: bytes | None) -> ServeError:
    name = (encoding or b"identity").decode("latin-1")
    return InvalidArgument(f"a compressed message with the unsupported grpc-encoding '{name}'")
