"""Triton's restricted API categories: some endpoints answer only requests that carry a header.

Triton's flags, repeatable, one group of categories per flag (``src/command_line_parser.cc``)::

    --http-restricted-api=<category>[,<category>...]:<key>=<value>
    --grpc-restricted-protocol=<category>[,<category>...]:<key>=<value>

Categories (``src/restricted_features.h``): health, metadata, inference, shared-memory,
model-config, model-repository, statistics, trace, logging.  A category may appear in one group
only.  Over HTTP the header is ``<key>`` itself (names compare without case, as HTTP's do); over
gRPC it is the metadata key ``triton-grpc-protocol-<key>`` (gRPC keys are lower case).  The value
must match exactly.  A refused request gets, as from Triton:

- HTTP: 403 ``{"error": "This API is restricted, expecting header '<key>'"}``
  (``HTTPAPIServer::RespondIfRestricted`` in ``src/http_server.cc``), before the method or the
  body is looked at;
- gRPC: UNAVAILABLE ``This protocol is restricted, expecting header 'triton-grpc-protocol-<key>'``
  (``CommonCallData::Execute`` in ``src/grpc/grpc_server.cc``, ``InferHandler`` for ModelInfer and
  ModelStreamInfer, whose stream ends with that status).

Unrestricted categories, unknown paths (404) and the metrics port are never checked.  This module is
the policy (which category a path or method is in, and whether a request may go on); the front ends
apply it: ``http_server/restricted.py`` (an ASGI wrapper) and ``grpc_server/restricted.py`` (an
interceptor).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from serve_app.errors import InvalidArgument

CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
HTTP_OPTION = "http-restricted-api"
GRPC_OPTION = "grpc-restricted-protocol"


@dataclass(frozen=True)
class Restriction:
    """The header a restricted category's requests must carry, and its value."""

    header: str  # as checked: the HTTP header name, or the gRPC metadata key with its prefix
    value: str = field(repr=False)  # a secret: never in a log line or traceback


class RestrictedApis:
    """Which categories need which header; answers whether a request may go on.  Pure and immutable."""

    def __init__(self, restrictions: Mapping[str, Restriction] | None = None) -> None:
        self._by_category: dict[str, Restriction] = dict(restrictions or {})
        unknown = set(self._by_category) - set(CATEGORIES)
        if unknown:
            raise InvalidArgument(f"unknown restricted categories {sorted(unknown)}; known are {list(CATEGORIES)}")

    @classmethod
    def parse(cls, options: Iterable[str], *, grpc: bool = False) -> RestrictedApis:
        """From Triton's flag values (``--http-restricted-api`` or, with ``grpc``, ``--grpc-restricted-protocol``)."""
        option, feature = (GRPC_OPTION, "protocol") if grpc else (HTTP_OPTION, "api")
        restrictions: dict[str, Restriction] = {}
        for arg in options:
            categories, key, value = _split_option(arg, option)
            header = GRPC_HEADER_PREFIX + key.lower() if grpc else key
            for category in categories.split(","):
                if category not in CATEGORIES:
                    raise InvalidArgument(f"unknown restricted {feature} '{category}'")
                if category in restrictions:
                    raise InvalidArgument(
                        f"restricted {feature} '{category}' can not be specified in multiple config groups"
                    )
                restrictions[category] = Restriction(header, value)
        return cls(restrictions)

    def __bool__(self) -> bool:
        return bool(self._by_category)

    def __repr__(self) -> str:  # never the values: they are secrets
        headers = {c: r.header for c, r in self._by_category.items()}
        return f"RestrictedApis({headers})"

    def restriction(self, category: str) -> Restriction | None:
        return self._by_category.get(category)

    def refusal(self, category: str | None, header: Callable[[str], str | None]) -> Restriction | None:
        """The restriction a request of ``category`` fails, or None when it may go on.

        ``header(name)`` returns the request's (first) value of a header, ``name`` as the
        restriction spells it; the caller decides how names compare (HTTP: without case).
        """
        if category is None:
            return None
        r = self._by_category.get(category)
        if r is None:
            return None
        got = header(r.header)
        if got is not None and hmac.compare_digest(got.encode("utf-8", "surrogateescape"), r.value.encode("utf-8")):
            return None
        return r


def _split_option(arg: str, option: str) -> tuple[str, str, str]:
    """``<categories>:<key>=<value>`` as Triton's ``ParseGenericConfigOption`` splits it (the value may hold '=')."""
    categories, colon, rest = arg.partition(":")
    key, equals, value = rest.partition("=")
    if not colon or not equals or not categories or not key or not value:
        raise InvalidArgument(f"--{option} option format is '<config name>:<setting>=<value>'. Got {arg}")
    return categories, key, value


# -- HTTP ---------------------------------------------------------------------------------------

_MODEL_PATH = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([^/]+))?(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?"
)
_MODEL_KINDS = {
    "": "metadata",
    "ready": "health",
    "infer": "inference",
    "generate": "inference",
    "generate_stream": "inference",
    "config": "model-config",
    "stats": "statistics",
    "trace/setting": "trace",
}
_PATHS = (
    (re.compile(r"/v2"), "metadata"),
    (re.compile(r"/v2/health/(?:live|ready)"), "health"),
    (re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(?:status|register|unregister)"), "shared-memory"),
    (re.compile(r"/v2/repository(?:/[^/]+)?/(?:index|models/[^/]+/(?:load|unload))"), "model-repository"),
    (re.compile(r"/v2/trace/setting"), "trace"),
)


def http_category(path: str) -> str | None:
    """The category of a v2 HTTP path, as Triton's ``HTTPAPIServer::Handle`` routes it; None if none.

    Versions match any segment (Triton's ``[0-9]+``), so a path that our router would take with an
    odd version is still checked.
    """
    if path == "/v2/models/stats":
        return "statistics"
    if path == "/v2/logging":
        return "logging"
    m = _MODEL_PATH.fullmatch(path)
    if m is not None:
        return _MODEL_KINDS[m.group(3) or ""]
    for pattern, category in _PATHS:
        if pattern.fullmatch(path):
            return category
    return None


# -- gRPC ---------------------------------------------------------------------------------------

_GRPC_METHODS = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}
_GRPC_SERVICES = {"inference.GRPCInferenceService": _GRPC_METHODS, "grpc.health.v1.Health": {"Check": "health"}}


def grpc_category(method: str) -> str | None:
    """The category of a full gRPC method name (``/inference.GRPCInferenceService/ModelInfer``); None if none."""
    service, _, name = method.lstrip("/").partition("/")
    return _GRPC_SERVICES.get(service, {}).get(name)
