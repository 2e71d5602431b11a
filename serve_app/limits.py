"""How large a request the server takes.

A request's cost is decided by what it declares (Content-Length, JSON nesting, shapes, how many
inputs and outputs) long before its tensors exist, so each limit is a number checked against the
declaration (``serve_app/protocol/limits.py`` holds the checks both front ends call).

Defaults:

- ``max_body_bytes`` 64 MiB: Triton's HTTP default (``--http-max-input-size``).  This one limit
  covers both protocols (gRPC's max receive message size follows it; Triton's gRPC takes up to
  2 GiB): a parsed body is many times its size (JSON of empty objects about 26x, gRPC repeated
  fields about 24x), so the limit bounds what one request can make a gateway hold.  Clients with
  larger tensors raise it (``--max-body-bytes``) or pass them through shared memory.
- ``max_tensor_elements`` 2**28: four times what a default body can carry in one-byte elements, so
  it only refuses shapes no body could fill; it bounds tensors in shared memory too.
- ``max_json_depth`` 100: Triton's limit on the nesting of a tensor's ``data``; a body may nest
  ``JSON_ENVELOPE`` (4) levels more, the request's own (body, ``inputs``, an input, ``parameters``).
- ``max_inputs`` / ``max_outputs`` 1024: far above real models (wide recommender models have a few
  hundred inputs), far below what a body could list.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

MiB = 2**20
GRPC_MAX_MESSAGE_BYTES = 2**31 - 1  # grpc's own ceiling for a message size option


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_body_bytes: int = 64 * MiB
    max_tensor_elements: int = 2**28
    max_json_depth: int = 100
    max_inputs: int = 1024
    max_outputs: int = 1024

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"request limit {f.name} must be a positive integer, got {value!r}")

    @property
    def grpc_max_receive_bytes(self) -> int:
        """The gRPC server's max receive message size: the body limit, within grpc's own range."""
        return min(self.max_body_bytes, GRPC_MAX_MESSAGE_BYTES)


DEFAULT_LIMITS = RequestLimits()

# The HTTP request head (request line and headers), checked as its bytes arrive, before the app sees it.
# Triton's HTTP server (libevhtp) has its own fixed caps; these are in the range common servers use.
MAX_REQUEST_LINE_BYTES = 64 * 1024  # more: 414
MAX_HEAD_BYTES = 64 * 1024  # request line and headers together; more: 431
MAX_HEADERS = 128  # more: 431
HEAD_TIMEOUT_S = 30.0  # a connection whose request head is not complete this long after it began is closed
