"""HTTP/2 floods against a running server's gRPC port, with a normal client served beside them.

``python -m scripts.h2_attacks --port 8001 --pid PID``: each attack runs for a few seconds on its own
connection to 127.0.0.1 while a normal client calls ``py_add_sub`` every 100 ms on another.  Per attack it
reports the normal client's worst latency and timeouts, the GOAWAY code the attacker got (or "reset" /
"closed" where the server ended a connection whose client did not read its GOAWAY), and the server
process's resident memory: at the start, at its peak, and a second after the attacker closed.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import hpack
import numpy as np

from serve_app.grpc_server import frames as f
from serve_app.protos import grpc_service_pb2 as pb

HOST = "127.0.0.1"
METHOD = "/inference.GRPCInferenceService/ModelInfer"
NORMAL_TIMEOUT_S = 2.0
REQUEST_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", METHOD),
    (":authority", HOST),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def _rss(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _add_sub_request() -> bytes:
    request = pb.ModelInferRequest(model_name="py_add_sub")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[16])
        request.raw_input_contents.append(np.arange(16, dtype=np.float32).tobytes())
    return request.SerializeToString()


def _identity_request(elements: int) -> bytes:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    request.raw_input_contents.append(np.zeros(elements, dtype=np.float32).tobytes())
    return request.SerializeToString()


@dataclass
class NormalClient:
    """Calls ``py_add_sub`` every 100 ms on its own channel; latencies are kept per attack window."""

    port: int
    latencies: list[float] = field(default_factory=list)
    timeouts: int = 0
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        request = pb.ModelInferRequest.FromString(_add_sub_request())
        with grpc.insecure_channel(f"{HOST}:{self.port}") as channel:
            infer = channel.unary_unary(
                METHOD,
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    infer(request, timeout=NORMAL_TIMEOUT_S)
                    self.latencies.append(time.monotonic() - start)
                except grpc.RpcError as exc:
                    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        self.timeouts += 1
                    else:
                        self.errors += 1
                self._stop.wait(max(0.0, 0.1 - (time.monotonic() - start)))

    def reset(self) -> None:
        self.latencies, self.timeouts, self.errors = [], 0, 0

    def stop(self) -> None:
        self._stop.set()


class Attacker:
    """One raw HTTP/2 connection; ``read`` is off for a client that never reads."""

    def __init__(self, port: int, *, window: int | None = None, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket()
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect((HOST, port))
        self.sock.settimeout(2.0)
        self.encoder = hpack.Encoder()
        self.next_id = 1
        self.goaway: int | None = None
        self.closed = False
        self.ended = ""  # how the server ended the connection, if it did: "closed" or "reset"
        settings = {f.INITIAL_WINDOW_SIZE: window} if window is not None else {}
        self.send(f.PREFACE + f.settings_frame(settings))

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = True
        return not self.closed

    def headers(self, *, end_stream: bool, end_headers: bool = True) -> tuple[int, bytes]:
        sid, self.next_id = self.next_id, self.next_id + 2
        block = self.encoder.encode(REQUEST_HEADERS)
        flags = (f.END_HEADERS if end_headers else 0) | (f.END_STREAM if end_stream else 0)
        return sid, f.frame(f.HEADERS, flags, sid, block)

    def drain_for_goaway(self, seconds: float) -> None:
        """Read what the server sent (up to ``seconds``), noting a GOAWAY's code."""
        buffer = bytearray()
        deadline = time.monotonic() + seconds
        self.sock.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                self.ended = "reset"
                break
            if not data:
                self.ended = "closed"
                break
            buffer += data
            while len(buffer) >= f.HEADER_BYTES:
                length = int.from_bytes(buffer[:3], "big")
                if len(buffer) < f.HEADER_BYTES + length:
                    break
                if buffer[3] == f.GOAWAY and self.goaway is None:
                    self.goaway = int.from_bytes(buffer[f.HEADER_BYTES + 4 : f.HEADER_BYTES + 8], "big")
                del buffer[: f.HEADER_BYTES + length]
            if self.goaway is not None and self.goaway != f.NO_ERROR:
                break

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _until(seconds: float) -> Iterator[None]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        yield


def rapid_reset(a: Attacker, seconds: float) -> None:
    """HEADERS then RST_STREAM at once, 10k streams a second (the 2023 rapid-reset pattern)."""
    for _ in _until(seconds):
        batch = bytearray()
        for _ in range(100):
            sid, headers = a.headers(end_stream=False)
            batch += headers + f.rst_stream(sid, f.CANCEL)
        if not a.send(bytes(batch)):
            return
        time.sleep(0.01)


def reset_after_body(a: Attacker, seconds: float) -> None:
    """A whole ModelInfer call, then RST_STREAM: the server starts work the client throws away."""
    body = f.frame(f.DATA, f.END_STREAM, 0, b"\x00" + len(req := _add_sub_request()).to_bytes(4, "big") + req)
    for _ in _until(seconds):
        batch = bytearray()
        for _ in range(100):
            sid, headers = a.headers(end_stream=False)
            batch += headers + body[:5] + sid.to_bytes(4, "big") + body[9:] + f.rst_stream(sid, f.CANCEL)
        if not a.send(bytes(batch)):
            return


def empty_continuation(a: Attacker, seconds: float) -> None:
    """A header block that never ends: HEADERS without END_HEADERS, then empty CONTINUATION frames."""
    sid, headers = a.headers(end_stream=False, end_headers=False)
    a.send(headers)
    batch = f.frame(f.CONTINUATION, 0, sid) * 1000
    for _ in _until(seconds):
        if not a.send(batch):
            return


def empty_data(a: Attacker, seconds: float) -> None:
    """An open stream fed empty DATA frames."""
    sid, headers = a.headers(end_stream=False)
    a.send(headers)
    batch = f.frame(f.DATA, 0, sid) * 1000
    for _ in _until(seconds):
        if not a.send(batch):
            return


def ping_flood(a: Attacker, seconds: float) -> None:
    """PINGs from a client that never reads their acknowledgements."""
    batch = f.frame(f.PING, 0, 0, b"\x00" * 8) * 1000
    for _ in _until(seconds):
        if not a.send(batch):
            return


def settings_flood(a: Attacker, seconds: float) -> None:
    """SETTINGS frames from a client that never reads their acknowledgements."""
    batch = f.settings_frame({f.MAX_FRAME_SIZE: 16384}) * 1000
    for _ in _until(seconds):
        if not a.send(batch):
            return


def zero_window(a: Attacker, seconds: float) -> None:
    """100 calls answered with 4 MiB each to a client whose window is 0; then the connection closes."""
    req = _identity_request(1 << 20)
    message = b"\x00" + len(req).to_bytes(4, "big") + req
    for _ in range(100):
        sid, headers = a.headers(end_stream=False)
        out = bytearray(headers)
        for i in range(0, len(message), f.DEFAULT_FRAME_SIZE):
            chunk = message[i : i + f.DEFAULT_FRAME_SIZE]
            end = f.END_STREAM if i + f.DEFAULT_FRAME_SIZE >= len(message) else 0
            out += f.frame(f.DATA, end, sid, chunk)
        if not a.send(bytes(out)):
            return
    time.sleep(seconds)


@dataclass(frozen=True)
class Attack:
    name: str
    run: Callable[[Attacker, float], None]
    window: int | None = None
    reads: bool = True


ATTACKS = [
    Attack("rapid_reset", rapid_reset),
    Attack("reset_after_body", reset_after_body),
    Attack("empty_continuation", empty_continuation),
    Attack("empty_data", empty_data),
    Attack("ping_flood_no_read", ping_flood, reads=False),
    Attack("settings_flood_no_read", settings_flood, reads=False),
    Attack("zero_window_1", zero_window, window=0, reads=False),
    Attack("zero_window_2", zero_window, window=0, reads=False),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8001, help="the server's gRPC port on 127.0.0.1")
    parser.add_argument("--pid", type=int, required=True, help="the server's process id (for its memory)")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each attack runs")
    parser.add_argument("--only", nargs="*", default=None, help="attack names to run (default: all)")
    args = parser.parse_args(argv)
    normal = NormalClient(args.port)
    thread = threading.Thread(target=normal.run, daemon=True)
    thread.start()
    time.sleep(1.0)
    print(f"{'attack':24} {'p50 ms':>7} {'worst ms':>9} {'calls':>6} {'timeouts':>8} {'errors':>6} {'goaway':>7} "
          f"{'rss MiB start/peak/after':>25}")  # fmt: skip
    for attack in ATTACKS:
        if args.only and attack.name not in args.only:
            continue
        normal.reset()
        start_rss = peak = _rss(args.pid)
        attacker = Attacker(args.port, window=attack.window, rcvbuf=None if attack.reads else 4096)
        worker = threading.Thread(target=attack.run, args=(attacker, args.seconds), daemon=True)
        worker.start()
        while worker.is_alive():
            peak = max(peak, _rss(args.pid))
            worker.join(0.1)
        attacker.drain_for_goaway(1.0)
        peak = max(peak, _rss(args.pid))
        attacker.close()
        time.sleep(1.5)
        after = _rss(args.pid)
        worst = max(normal.latencies, default=0.0) * 1000
        median = statistics.median(normal.latencies) * 1000 if normal.latencies else 0.0
        goaway = attacker.ended or "-" if attacker.goaway is None else str(attacker.goaway)
        mib = 1 << 20
        calls = f"{median:7.1f} {worst:9.1f} {len(normal.latencies):6d} {normal.timeouts:8d} {normal.errors:6d}"
        rss = f"{start_rss / mib:9.0f}/{peak / mib:.0f}/{after / mib:.0f}"
        print(f"{attack.name:24} {calls} {goaway:>7} {rss}", flush=True)
    normal.stop()
    thread.join(5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
