"""HTTP/2 frames as gRPC uses them (RFC 9113), and header blocks through a cached HPACK decoder.

Why our own frame codec: with the ``h2`` library's state machine the front end spent more CPU in
framing than in the whole of our request path (docs/design/hosting.md).  gRPC needs a small part of
HTTP/2 (no server push, no priorities, no upgrade), and a frame is a 9-byte header and a payload, so the
codec is short.  HPACK stays with the ``hpack`` library; a client repeats the same header block on
every call, so decoded blocks are cached for as long as the decoder's dynamic table is unchanged.  Our
own response headers and trailers go through one encoder per connection, as grpc-core sends them: the
first answer adds them to the peer's dynamic table, and every later answer names them by index.
"""

from __future__ import annotations

from hpack import Decoder, Encoder, NeverIndexedHeaderTuple
from hpack.exceptions import HPACKError
from hpack.hpack import encode_integer

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_BYTES = 9

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

# SETTINGS identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = (
    range(1, 7)
)

# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 6, 7, 8, 9, 11

DEFAULT_WINDOW = 65535
DEFAULT_FRAME_SIZE = 16384
MAX_WINDOW = (1 << 31) - 1
_DECODE_CACHE_SIZE = 64
_ENCODE_CACHE_SIZE = 64
DEFAULT_TABLE_SIZE = 4096


class ProtocolError(Exception):
    """A peer broke HTTP/2's rules: the connection ends with GOAWAY and ``code``."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def settings_frame(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in values.items()))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)


def parse_settings(payload: bytes) -> dict[int, int]:
    if len(payload) % 6:
        raise ProtocolError("SETTINGS payload is not a multiple of 6 bytes", FRAME_SIZE_ERROR)
    return {
        int.from_bytes(payload[i : i + 2], "big"): int.from_bytes(payload[i + 2 : i + 6], "big")
        for i in range(0, len(payload), 6)
    }


def strip_padding(flags: int, payload: bytes) -> bytes:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolError("padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]


# -------------------------------------------------------------------------------------------- HPACK


def _string(value: bytes) -> bytes:
    """An HPACK string literal without Huffman coding."""
    return bytes(encode_integer(len(value), 7)) + value


def literal_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block of literals never added to the peer's dynamic table (so it is the same bytes every
    time and can be built once).  ``:status 200`` uses its static index."""
    out = bytearray()
    for name, value in headers:
        if name == b":status" and value == b"200":
            out += b"\x88"
        else:
            out += b"\x00" + _string(name) + _string(value)
    return bytes(out)


class HeaderDecoder:
    """HPACK decoding with a cache of whole blocks, valid while the dynamic table does not change: the
    table changes only by ``add`` (counted here) and by a size update, so a block decoded with no change
    means the same headers until the next change, which empties the cache."""

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = Decoder(max_header_list_size=max_header_list_size)
        self._cache: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._changes = 0
        table = self._decoder.header_table
        add = table.add

        def counted_add(name: bytes, value: bytes) -> None:
            self._changes += 1
            add(name, value)

        table.add = counted_add  # type: ignore[method-assign]

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The block's headers as (name, value) bytes; the list is shared with later calls: read only."""
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        table = self._decoder.header_table
        changes, size = self._changes, table.maxsize
        try:
            headers = [(bytes(n), bytes(v)) for n, v in self._decoder.decode(block, raw=True)]
        except (HPACKError, IndexError, ValueError) as exc:
            raise ProtocolError(f"bad header block: {exc}", COMPRESSION_ERROR) from None
        if self._changes != changes or table.maxsize != size:
            self._cache.clear()
            return headers
        if len(self._cache) >= _DECODE_CACHE_SIZE:
            self._cache.clear()
        self._cache[block] = headers
        return headers


class HeaderEncoder:
    """HPACK encoding through the dynamic table, with a cache of whole blocks valid while the table does
    not change (a block that added nothing is the same bytes next time).  Values under ``NOT_INDEXED``
    names vary per call (an error's text) and are never added, so they cannot evict the repeated ones."""

    NOT_INDEXED = frozenset({b"grpc-message"})

    def __init__(self) -> None:
        self._encoder = Encoder()
        self._cache: dict[tuple[tuple[bytes, bytes], ...], bytes] = {}
        self._changes = 0
        table = self._encoder.header_table
        add = table.add

        def counted_add(name: bytes, value: bytes) -> None:
            self._changes += 1
            add(name, value)

        table.add = counted_add  # type: ignore[method-assign]

    def set_table_size(self, size: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE, the most it keeps: ours is that up to HPACK's default
        4096 (nghttp2's encoder stops there too); the next block starts with a size update."""
        self._encoder.header_table_size = min(size, DEFAULT_TABLE_SIZE)
        self._cache.clear()

    def encode(self, headers: tuple[tuple[bytes, bytes], ...]) -> bytes:
        """The block for ``headers``; blocks must reach the peer in the order they were encoded."""
        cached = self._cache.get(headers)
        if cached is not None:
            return cached
        changes, pending = self._changes, self._encoder.table_size_changes
        block = bytes(
            self._encoder.encode(
                [NeverIndexedHeaderTuple(n, v) if n in self.NOT_INDEXED else (n, v) for n, v in headers],
                huffman=True,
            )
        )
        if self._changes != changes or pending:
            self._cache.clear()
            return block
        if len(self._cache) >= _ENCODE_CACHE_SIZE:
            self._cache.clear()
        self._cache[headers] = block
        return block
