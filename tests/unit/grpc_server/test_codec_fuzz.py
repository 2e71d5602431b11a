"""Properties of the frame codec and of a connection fed arbitrary frames (Hypothesis, bounded examples).

A connection given any bytes after the preface either goes on or ends with GOAWAY: it never raises
out of ``data_received``, and its accounting never goes negative.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import hpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from serve_app.grpc_server import frames as f
from serve_app.grpc_server.http2 import GrpcConnection, ServerState
from tests.unit.grpc_server.h2_support import ECHO, FakeTransport, Handlers, request_headers, table, written_frames

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
HEADER_NAMES = st.sampled_from([b"grpc-status", b"grpc-message", b"content-type", b":status", b"x-key", b"te"])
HEADERS = st.lists(st.tuples(HEADER_NAMES, st.binary(max_size=40)), min_size=1, max_size=5).map(tuple)


@FUZZ
@given(
    kind=st.integers(0, 255),
    flags=st.integers(0, 255),
    stream_id=st.integers(0, (1 << 31) - 1),
    payload=st.binary(max_size=300),
)
def test_frame_layout_round_trips(kind: int, flags: int, stream_id: int, payload: bytes) -> None:
    data = f.frame(kind, flags, stream_id, payload)
    assert written_frames(data) == [(kind, flags, stream_id, payload)]


@FUZZ
@given(st.dictionaries(st.integers(0, 0xFFFF), st.integers(0, (1 << 32) - 1), max_size=10))
def test_settings_round_trip(values: dict[int, int]) -> None:
    assert f.parse_settings(f.settings_frame(values)[f.HEADER_BYTES :]) == values


@FUZZ
@given(flags=st.integers(0, 255), payload=st.binary(max_size=300))
def test_padding_is_stripped_or_refused(flags: int, payload: bytes) -> None:
    try:
        data = f.strip_padding(flags, payload)
    except f.ProtocolError:
        assert flags & f.PADDED
        return
    assert payload.find(data) in (0, 1)
    if flags & f.PADDED:
        assert len(data) == len(payload) - 1 - payload[0]


@FUZZ
@given(blocks=st.lists(HEADERS, max_size=12), table_size=st.none() | st.integers(0, 8192))
def test_our_header_blocks_decode_with_any_hpack_decoder(
    blocks: list[tuple[tuple[bytes, bytes], ...]], table_size: int | None
) -> None:
    encoder, decoder = f.HeaderEncoder(), hpack.Decoder()
    for i, headers in enumerate(blocks):
        if table_size is not None and i == len(blocks) // 2:  # the peer's SETTINGS_HEADER_TABLE_SIZE
            decoder.max_allowed_table_size = table_size
            encoder.set_table_size(table_size)
        assert decoder.decode(encoder.encode(headers), raw=True) == list(headers)


@FUZZ
@given(st.lists(HEADERS, max_size=12))
def test_the_cached_decoder_agrees_with_hpack(blocks: list[tuple[tuple[bytes, bytes], ...]]) -> None:
    encoder, cached, plain = hpack.Encoder(), f.HeaderDecoder(65536), hpack.Decoder()
    for headers in blocks:
        block = encoder.encode(list(headers))
        assert cached.decode(block) == plain.decode(block, raw=True)


@FUZZ
@given(st.binary(max_size=200))
def test_a_broken_header_block_is_a_compression_error(block: bytes) -> None:
    try:
        f.HeaderDecoder(65536).decode(block)
    except f.ProtocolError as exc:
        assert exc.code == f.COMPRESSION_ERROR


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


FRAMES = st.lists(
    st.tuples(
        st.integers(0, 11),  # the frame types we know, and two we do not
        st.sampled_from([0, f.END_STREAM, f.END_HEADERS, f.END_HEADERS | f.END_STREAM, f.PADDED, 0xFF]),
        st.sampled_from([0, 1, 3, 5, 2]),
        st.one_of(
            st.binary(max_size=40),
            st.just(request_headers(hpack.Encoder(), ECHO)),
            st.just(b"\x00\x00\x00\x00\x02ab"),  # a framed message
            st.just(b"\x00\x00\x00\x01"),  # a window increment, an error code
            st.just(b"\x00\x04\x00\x00\xff\xff"),  # a setting
        ),
    ),
    max_size=25,
)


@FUZZ
@given(frames=FRAMES, cut=st.integers(1, 50))
def test_a_connection_fed_any_frames_goes_on_or_says_goaway(
    loop: asyncio.AbstractEventLoop, frames: list[tuple[int, int, int, bytes]], cut: int
) -> None:
    async def feed() -> None:
        connection = GrpcConnection(ServerState(table(Handlers()), 1 << 20, None), set())
        transport = FakeTransport()
        connection.connection_made(transport)
        data = f.PREFACE + b"".join(f.frame(*frame) for frame in frames)
        for i in range(0, len(data), cut):  # any split of the bytes into reads
            connection.data_received(data[i : i + cut])
            await asyncio.sleep(0)
        for _ in range(20):
            await asyncio.sleep(0)
        if transport.closing or transport.eof:
            assert written_frames(transport.written)[-1][0] == f.GOAWAY
        assert connection._working >= 0 and connection._held >= 0 and connection._parked >= 0
        connection.connection_lost(None)
        for _ in range(5):
            await asyncio.sleep(0)
        assert connection._working == 0 and connection._held == 0 and connection.state.budget.parked == 0

    loop.run_until_complete(feed())
