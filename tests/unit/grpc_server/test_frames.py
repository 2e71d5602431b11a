"""HTTP/2 frame helpers and the cached HPACK decoder."""

from __future__ import annotations

import hpack
import pytest

from serve_app.grpc_server import frames as f


def test_frame_layout() -> None:
    assert f.frame(f.DATA, f.END_STREAM, 3, b"ab") == b"\x00\x00\x02\x00\x01\x00\x00\x00\x03ab"
    assert f.window_update(0, 7)[9:] == b"\x00\x00\x00\x07"
    assert f.parse_settings(f.settings_frame({f.INITIAL_WINDOW_SIZE: 1 << 20, f.ENABLE_PUSH: 0})[9:]) == {
        f.INITIAL_WINDOW_SIZE: 1 << 20,
        f.ENABLE_PUSH: 0,
    }
    with pytest.raises(f.ProtocolError):
        f.parse_settings(b"\x00" * 5)


def test_padding() -> None:
    assert f.strip_padding(0, b"\x02abc") == b"\x02abc"
    assert f.strip_padding(f.PADDED, b"\x02abcde") == b"abc"
    with pytest.raises(f.ProtocolError):
        f.strip_padding(f.PADDED, b"\x05ab")


def test_literal_headers_decode_with_any_hpack_decoder() -> None:
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-message", b"x" * 300)]
    block = f.literal_headers(headers)
    decoder = hpack.Decoder()
    assert decoder.decode(block, raw=True) == headers
    assert decoder.decode(block, raw=True) == headers
    assert len(decoder.header_table.dynamic_entries) == 0  # never indexed: the same bytes every time


def test_cached_decoding_follows_the_dynamic_table() -> None:
    encoder = hpack.Encoder()
    decoder = f.HeaderDecoder(65536)
    first = [(":path", "/a"), ("x-key", "one")]
    # The first block adds to the table; the repeat is all indexed references, decoded once then cached.
    assert decoder.decode(encoder.encode(first)) == [(b":path", b"/a"), (b"x-key", b"one")]
    repeat = encoder.encode(first)
    assert decoder.decode(repeat) == decoder.decode(repeat) == [(b":path", b"/a"), (b"x-key", b"one")]
    # A new value is added to the table, shifting indices: the cached block must not be reused blindly.
    decoder.decode(encoder.encode([(":path", "/a"), ("x-key", "two")]))
    again = encoder.encode(first)
    assert decoder.decode(again) == [(b":path", b"/a"), (b"x-key", b"one")]


def test_a_bad_block_is_a_compression_error() -> None:
    with pytest.raises(f.ProtocolError) as info:
        f.HeaderDecoder(65536).decode(b"\xff\xff\xff\xff")
    assert info.value.code == f.COMPRESSION_ERROR


def test_response_headers_go_through_the_dynamic_table() -> None:
    """As grpc-core sends them: the first answer adds the headers, later answers name them by index."""
    encoder = f.HeaderEncoder()
    decoder = hpack.Decoder()
    headers = ((b":status", b"200"), (b"content-type", b"application/grpc"))
    trailers = ((b"grpc-status", b"0"),)
    first = [encoder.encode(headers), encoder.encode(trailers)]
    again = [encoder.encode(headers), encoder.encode(trailers)]
    assert sum(map(len, again)) == 3 < sum(map(len, first))  # one byte per header
    for block, expected in zip(first + again, [headers, trailers] * 2, strict=True):
        assert decoder.decode(block, raw=True) == list(expected)


def test_error_details_are_never_indexed_and_the_table_size_is_the_peers() -> None:
    encoder = f.HeaderEncoder()
    decoder = hpack.Decoder()
    for i in range(50):
        block = encoder.encode(((b"grpc-status", b"13"), (b"grpc-message", b"failure %d" % i)))
        assert decoder.decode(block, raw=True) == [(b"grpc-status", b"13"), (b"grpc-message", b"failure %d" % i)]
    assert [name for name, _ in decoder.header_table.dynamic_entries] == [b"grpc-status"]
    encoder.set_table_size(0)  # the peer's SETTINGS_HEADER_TABLE_SIZE
    block = encoder.encode(((b"grpc-status", b"0"),))
    assert decoder.decode(block, raw=True) == [(b"grpc-status", b"0")]
    assert len(decoder.header_table.dynamic_entries) == 0
