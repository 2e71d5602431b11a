"""FrameBuffer: a lane's messages read without blocking, whole however the bytes arrive."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import numpy as np
import pytest

from serve_app.transport.channel import MAX_FRAME_BYTES, FrameBuffer, FrameTooLarge, encode


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def wire(message: object) -> bytes:
    return b"".join(bytes(f) for f in encode(message))


def test_a_whole_frame_is_one_message_with_its_arrays(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    array = np.arange(16, dtype=np.float32)
    a.sendall(wire((7, {"x": array})))
    inbox = FrameBuffer()
    inbox.feed(b)
    ((call_id, payload),) = inbox.messages()
    assert call_id == 7
    np.testing.assert_array_equal(payload["x"], array)
    assert inbox.messages() == []


def test_a_frame_in_pieces_waits_until_whole(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    data = wire((1, np.ones(1000)))
    inbox = FrameBuffer()
    for cut in (3, 10, len(data) // 2):  # inside the head, the lengths, the body
        a.sendall(data[:cut])
        inbox.feed(b)
        assert inbox.messages() == []
        a.sendall(data[cut:])
        inbox.feed(b)
        ((call_id, array),) = inbox.messages()
        assert call_id == 1 and array.sum() == 1000


def test_frames_that_arrive_together_come_out_in_order(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    first, second = wire((1, "one")), wire((2, np.zeros(4)))
    a.sendall(first + second[:5])
    inbox = FrameBuffer()
    inbox.feed(b)
    assert inbox.messages() == [(1, "one")]
    a.sendall(second[5:])
    inbox.feed(b)
    ((call_id, array),) = inbox.messages()
    assert call_id == 2 and array.tolist() == [0.0] * 4


def test_nothing_to_read_is_no_message_and_a_closed_peer_is_eof(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    inbox = FrameBuffer()
    inbox.feed(b)  # woken with nothing: no error
    assert inbox.messages() == []
    a.close()
    with pytest.raises(EOFError):
        inbox.feed(b)


def test_a_frame_over_the_limit_is_refused_from_its_head(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall((MAX_FRAME_BYTES).to_bytes(4, "big") + (1).to_bytes(4, "big") + (8).to_bytes(8, "big"))
    inbox = FrameBuffer()
    inbox.feed(b)
    with pytest.raises(FrameTooLarge):
        inbox.messages()
