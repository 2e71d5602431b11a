"""What a request asks of its scheduler, read from its parameters once, with Triton's messages.

Both protocols carry these in the request's ``parameters`` (tritonclient sends
``priority`` as uint64 and ``timeout``, in microseconds, as int64 over gRPC;
numbers over HTTP; ``sequence_id`` as an unsigned integer or a string) and in
its outputs' (``classification``).  :func:`strip_reserved` runs in the codecs,
as the parameters are decoded; :meth:`RequestOptions.parse` runs in the
service with the rest of the request's checks, before it is queued, so a bad
value is a 400 / INVALID_ARGUMENT that counts nowhere, whatever the model's
scheduler.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass

from serve_app.errors import InvalidArgument
from serve_app.inference.classification import classification_count
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, ParamValue

_UINT64_MAX = 2**64 - 1
CorrId = int | str

RESERVED_PREFIX = "triton_"
# The one reserved key Triton's gRPC front end accepts (its streams read it); HTTP accepts none.
EMPTY_FINAL = "triton_enable_empty_final_response"
GRPC_ALLOWED_RESERVED = frozenset({EMPTY_FINAL})


def strip_reserved(params: MutableMapping[str, ParamValue], allowed: frozenset[str] = frozenset()) -> None:
    """Drop the reserved keys in ``allowed`` (the front end read them); reject the others as Triton does."""
    for key in [k for k in params if k.startswith(RESERVED_PREFIX)]:
        if key not in allowed:
            if allowed:
                raise InvalidArgument(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
                    f"starting with 'triton_' are allowed: {', '.join(sorted(allowed))}"
                )
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        del params[key]


def _unsigned(request: InferRequest, key: str) -> int:
    value = request.parameters.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT64_MAX:
        raise InvalidArgument(
            f"parameter '{key}' of the request for model '{request.model_name}' must be an unsigned integer, "
            f"got {value!r}"
        )
    return value


def request_priority(request: InferRequest) -> int:
    """0 (the default) or the requested priority level; levels out of range mean the default."""
    return _unsigned(request, "priority")


def request_timeout_us(request: InferRequest) -> int:
    """The request's queue timeout in microseconds; 0 means none."""
    return _unsigned(request, "timeout")


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    corr_id: CorrId
    start: bool
    end: bool


def _flag(request: InferRequest, key: str) -> bool:
    value = request.parameters.get(key, False)
    if not isinstance(value, bool):
        raise InvalidArgument(
            f"parameter '{key}' of the request for model '{request.model_name}' must be a boolean, got {value!r}"
        )
    return value


def sequence_flags(request: InferRequest) -> SequenceFlags:
    """The sequence parameters of a request to a sequence model, checked as Triton checks them."""
    corr = request.parameters.get("sequence_id", 0)
    if isinstance(corr, bool) or not isinstance(corr, (int, str)):
        raise InvalidArgument(
            f"parameter 'sequence_id' of the request for model '{request.model_name}' must be an unsigned integer "
            f"or a string, got {corr!r}"
        )
    if isinstance(corr, int) and not 0 <= corr <= _UINT64_MAX:
        raise InvalidArgument(
            f"parameter 'sequence_id' of the request for model '{request.model_name}' must be an unsigned 64-bit "
            f"integer, got {corr}"
        )
    start, end = _flag(request, "sequence_start"), _flag(request, "sequence_end")
    if corr == 0 or corr == "":
        raise InvalidArgument(
            f"inference request to model '{request.model_name}' must specify a non-zero or non-empty correlation ID"
        )
    return SequenceFlags(corr, start, end)


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """A validated request's options, as its scheduler and the service read them."""

    batch_size: int = 0  # as validated: 0 when the model does not batch
    priority: int = 0  # 0: the model's default level
    timeout_us: int = 0  # 0: none
    sequence: SequenceFlags | None = None  # for sequence models
    classification: dict[str, int] | None = None  # outputs asked for as classes, with their k

    @classmethod
    def parse(
        cls, request: InferRequest, signature: ModelSignature, *, batch_size: int, sequence_model: bool = False
    ) -> RequestOptions:
        """Read and check every option of ``request`` (its inputs already validated: ``batch_size``)."""
        flags = None
        if sequence_model:
            if batch_size > 1:
                raise InvalidArgument(
                    f"inference request to model '{signature.name}' must specify batch-size 1 due to requirements "
                    "of sequence batcher"
                )
            flags = sequence_flags(request)
        return cls(
            batch_size=batch_size,
            priority=request_priority(request),
            timeout_us=request_timeout_us(request),
            sequence=flags,
            classification=classification_count(request, signature) if request.outputs else None,
        )
