"""An OTLP/HTTP trace receiver for tests: what the server exports, as plain span records.

It answers ``POST /v1/traces`` (protobuf ``ExportTraceServiceRequest``, as OpenTelemetry's
OTLP/HTTP exporter sends it) from a thread of the test process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


@dataclass(frozen=True)
class SpanRecord:
    name: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root span
    events: tuple[str, ...]
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[SpanRecord] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver._take(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """As ``--trace-config opentelemetry,url=`` takes it (Triton's form: no scheme)."""
        return f"127.0.0.1:{self.port}/v1/traces"

    def _take(self, request: Any) -> None:
        records = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    records.append(
                        SpanRecord(
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            tuple(e.name for e in s.events),
                            {a.key: _value(a.value) for a in s.attributes},
                            resource,
                        )
                    )
        with self._lock:
            self.spans.extend(records)

    def wait_for(self, done: Callable[[list[SpanRecord]], bool], timeout_s: float = 30.0) -> list[SpanRecord]:
        """The spans received once ``done`` holds for them (or all of them at the timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spans = list(self.spans)
            if done(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
