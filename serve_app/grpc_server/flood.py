"""What one HTTP/2 connection may cost the server: floods answered with GOAWAY, and memory bounds.

A frame is cheap to send and costs the server work (a task, a header block, an acknowledgement), so a
peer that sends frames which advance nothing is ended with GOAWAY ``ENHANCE_YOUR_CALM``, as grpc-core and
nghttp2 end it; the numbers are theirs where they have one, named where they are used.  Pure code: the
clock is passed in, so tests drive it.
"""

from __future__ import annotations

from dataclasses import dataclass

from serve_app.grpc_server import frames as f

# grpc-core's ping strikes (chttp2 ping abuse policy): a PING sooner than min_recv_ping_interval_without_data
# (5 minutes) after the previous one, with no DATA or HEADERS sent between, is a strike; more than
# DEFAULT_MAX_PING_STRIKES (2) ends the connection with GOAWAY ENHANCE_YOUR_CALM "too_many_pings".
PING_INTERVAL_S = 300.0
MAX_PING_STRIKES = 2

# nghttp2's NGHTTP2_DEFAULT_STREAM_RESET_BURST / NGHTTP2_DEFAULT_STREAM_RESET_RATE: a token bucket of the
# streams a client resets while they are open (the rapid-reset mitigation).
RESET_BURST = 1000
RESET_RATE = 33.0

# nghttp2's NGHTTP2_MAX_CONTINUATIONS: CONTINUATION frames after one HEADERS (our 64 KiB header list
# needs at most 4 at the smallest frame size).
MAX_CONTINUATIONS = 8

# nghttp2's NGHTTP2_DEFAULT_MAX_SETTINGS: entries in one SETTINGS frame.
MAX_SETTINGS_ENTRIES = 32

# Frames that carry no work (empty DATA or CONTINUATION, SETTINGS, PRIORITY, unknown types): a bucket
# the size of nghttp2's NGHTTP2_DEFAULT_MAX_OBQ_FLOOD_ITEM (1000, the acknowledgements a peer may leave
# queued), refilled at 100 a second (ours: a client sends a handful per connection).
IDLE_FRAME_BURST = 1000
IDLE_FRAME_RATE = 100.0

# The same number bounds our PING and SETTINGS acknowledgements waiting in an unread socket's buffer.
MAX_QUEUED_ACKS = 1000


class Abuse(f.ProtocolError):
    """The peer exceeded a flood limit: GOAWAY ``ENHANCE_YOUR_CALM`` with ``message`` as debug data."""

    def __init__(self, message: str) -> None:
        super().__init__(message, f.ENHANCE_YOUR_CALM)


class TokenBucket:
    """``burst`` tokens at most, ``rate`` more a second; each event takes one."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, burst: int, rate: float, now: float) -> None:
        self.burst, self.rate = burst, rate
        self._tokens, self._at = float(burst), now

    def take(self, now: float) -> bool:
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class FloodGuard:
    """The flood limits of one connection; each ``on_*`` raises :class:`Abuse` when a limit is passed."""

    __slots__ = ("_idle", "_last_ping", "_resets", "_strikes", "queued_acks")

    def __init__(self, now: float) -> None:
        self._resets = TokenBucket(RESET_BURST, RESET_RATE, now)
        self._idle = TokenBucket(IDLE_FRAME_BURST, IDLE_FRAME_RATE, now)
        self._last_ping: float | None = None
        self._strikes = 0
        self.queued_acks = 0

    def on_ping(self, now: float) -> None:
        last, self._last_ping = self._last_ping, now
        if last is not None and now - last < PING_INTERVAL_S:
            self._strikes += 1
            if self._strikes > MAX_PING_STRIKES:
                raise Abuse("too_many_pings")

    def on_sent_data(self) -> None:
        """We sent HEADERS or DATA: pings since are the client's keepalive of a busy connection."""
        self._strikes = 0
        self._last_ping = None

    def on_reset(self, now: float) -> None:
        if not self._resets.take(now):
            raise Abuse("too many streams reset")

    def on_idle_frame(self, now: float) -> None:
        if not self._idle.take(now):
            raise Abuse("too many frames without content")

    def on_ack(self, socket_backed_up: bool) -> None:
        """An acknowledgement was queued; counted while the socket's buffer does not empty."""
        self.queued_acks = self.queued_acks + 1 if socket_backed_up else 0
        if self.queued_acks > MAX_QUEUED_ACKS:
            raise Abuse("acknowledgements not read")


@dataclass(slots=True)
class SendBudget:
    """Response bytes waiting for a client's flow-control window or socket, across all connections.

    An answer that cannot be sent at once is parked; parking it must keep the connection's parked bytes
    under ``per_connection`` and the server's under ``total``, except that an answer is always let wait
    where nothing else does (so one answer larger than a cap is still served to a client that reads).
    """

    per_connection: int
    total: int
    parked: int = 0

    def admits(self, connection_parked: int, size: int) -> bool:
        if connection_parked and connection_parked + size > self.per_connection:
            return False
        return not (self.parked and self.parked + size > self.total)
