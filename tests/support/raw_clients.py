"""Blocking clients on plain sockets for bytes no well-behaved client sends: a raw HTTP/1.1 exchange, and a gRPC
call written frame by frame by h2's client state machine within the server's flow-control windows.  They run in
threads, so a test's event loop serves only the servers, and they send from the caller's one copy of a body."""

from __future__ import annotations

import socket

import h2.config
import h2.connection
import h2.events
import h2.exceptions

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"


def read_all(sock: socket.socket) -> bytes:
    """Until the peer closes (a reset after some bytes keeps what came)."""
    chunks = []
    try:
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def http_status(raw: bytes) -> int | None:
    """The status of an HTTP/1.1 answer, ``None`` when nothing (or not HTTP) came back."""
    if not raw.startswith(b"HTTP/1."):
        return None
    return int(raw.split(b" ", 2)[1])


def http_exchange(port: int, *parts: bytes, timeout: float = 60.0, half_close: bool = False) -> bytes:
    """Send ``parts``, then read until the server closes; a server that closes early (a refusal while the
    client still writes) ends the sending.  ``half_close``: shut the sending side once sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            for part in parts:
                sock.sendall(part)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return read_all(sock)


def grpc_frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def grpc_call(port: int, framed: bytes, path: str = INFER_PATH, timeout: float = 60.0) -> int | None:
    """One unary call with ``framed`` as its DATA (messages with their prefixes, as given); its grpc-status,
    ``None`` when the connection ended without one."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:

        def pump() -> list[h2.events.Event]:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed")
            events = conn.receive_data(data)
            sock.sendall(conn.data_to_send())
            return events

        try:
            conn.initiate_connection()
            stream = conn.get_next_available_stream_id()
            headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                       ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip
            conn.send_headers(stream, headers)
            sock.sendall(conn.data_to_send())
            view, sent = memoryview(framed), 0
            while sent < len(framed):
                size = min(conn.local_flow_control_window(stream), conn.max_outbound_frame_size, len(framed) - sent)
                if size <= 0:
                    for event in pump():
                        if isinstance(event, (h2.events.StreamReset, h2.events.StreamEnded)):
                            sent = len(framed)  # answered (or reset) before the whole message went
                    continue
                conn.send_data(stream, view[sent : sent + size].tobytes())
                sock.sendall(conn.data_to_send())
                sent += size
            if conn.state_machine.state != h2.connection.ConnectionState.CLOSED:
                try:
                    conn.end_stream(stream)
                    sock.sendall(conn.data_to_send())
                except h2.exceptions.StreamClosedError:
                    pass
            while True:
                for event in pump():
                    if isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(event.flow_controlled_length, stream)
                    if isinstance(event, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
                        found = dict(event.headers).get(b"grpc-status")
                        if found is not None:
                            return int(found)
                    if isinstance(event, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                        return None
        except (ConnectionError, h2.exceptions.ProtocolError, OSError):
            return None
