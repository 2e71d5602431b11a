"""The gRPC-over-HTTP/2 rules that are pure code: message framing, timeouts, metadata and status trailers."""

from __future__ import annotations

import gzip
import zlib

import grpc
import pytest

from serve_app.errors import InvalidArgument, ResourceExhausted
from serve_app.grpc_server.calls import (
    MessageReader,
    decode_details,
    frame_message,
    parse_metadata,
    parse_timeout,
    status_trailers,
)


def test_one_message_in_one_frame() -> None:
    assert MessageReader(100, None).feed(frame_message(b"abc")) == [b"abc"]


def test_messages_split_and_joined_across_frames() -> None:
    data = frame_message(b"first") + frame_message(b"") + frame_message(b"third")
    reader = MessageReader(100, None)
    out: list[bytes] = []
    for i in range(0, len(data), 3):
        out += reader.feed(data[i : i + 3])
    assert out == [b"first", b"", b"third"]
    assert not reader.pending


def test_a_message_over_the_limit_is_refused_from_its_prefix() -> None:
    reader = MessageReader(10, None)
    with pytest.raises(ResourceExhausted, match=r"larger than max \(11 vs. 10\)"):
        reader.feed(frame_message(b"x" * 11)[:7])


@pytest.mark.parametrize(("encoding", "compress"), [(b"gzip", gzip.compress), (b"deflate", zlib.compress)])
def test_compressed_messages(encoding: bytes, compress: object) -> None:
    payload = compress(b"hello" * 10)  # type: ignore[operator]
    framed = b"\x01" + len(payload).to_bytes(4, "big") + payload
    assert MessageReader(1000, encoding).feed(framed) == [b"hello" * 10]


def test_decompressed_size_counts_against_the_limit() -> None:
    payload = gzip.compress(b"\x00" * 10_000)
    framed = b"\x01" + len(payload).to_bytes(4, "big") + payload
    with pytest.raises(ResourceExhausted):
        MessageReader(1000, b"gzip").feed(framed)


def test_bad_compressed_bytes_are_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="decompress"):
        MessageReader(1000, b"gzip").feed(b"\x01\x00\x00\x00\x03abc")
    with pytest.raises(InvalidArgument, match="grpc-encoding 'snappy'"):
        MessageReader(1000, b"snappy").feed(b"\x01\x00\x00\x00\x03abc")


@pytest.mark.parametrize(
    ("value", "seconds"), [(b"100m", 0.1), (b"2S", 2.0), (b"1M", 60.0), (b"1H", 3600.0), (b"500u", 5e-4), (b"7n", 7e-9)]
)
def test_timeouts(value: bytes, seconds: float) -> None:
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"m", b"10", b"10x", b"-1S", b"123456789S"])
def test_malformed_timeouts(value: bytes) -> None:
    with pytest.raises(InvalidArgument, match="grpc-timeout"):
        parse_timeout(value)


def test_metadata_skips_reserved_headers_and_decodes_binary_values() -> None:
    headers = [
        (b":path", b"/x/y"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"grpc-timeout", b"1S"),
        (b"traceparent", b"00-abc"),
        (b"key-bin", b"AAEC"),
    ]
    assert parse_metadata(headers) == (("traceparent", "00-abc"), ("key-bin", b"\x00\x01\x02"))


def test_status_trailers_percent_encode_the_message() -> None:
    trailers = dict(status_trailers(grpc.StatusCode.NOT_FOUND, "model 'ü' 100% gone\n"))
    assert trailers[b"grpc-status"] == b"5"
    assert decode_details(trailers[b"grpc-message"]) == "model 'ü' 100% gone\n"
    assert dict(status_trailers(grpc.StatusCode.OK, "")) == {b"grpc-status": b"0"}
