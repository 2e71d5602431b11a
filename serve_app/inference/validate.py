"""The one request validation both front ends share, with Triton's messages.

Decoding (HTTP or gRPC) only checks that the wire message is well formed;
whether it fits the model is decided here, once, against the
:class:`~serve_app.inference.signature.ModelSignature` computed at load time.
"""

from __future__ import annotations

from collections.abc import Sequence

from serve_app.errors import InvalidArgument
from serve_app.inference.signature import ModelSignature, all_ints, format_dims
from serve_app.inference.types import InferRequest


def _names(names: list[str] | tuple[str, ...]) -> str:
    # Triton prints name lists as ['A','B'] (no space after the comma).
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def _count_error(request: InferRequest, sig: ModelSignature, missing: list[str]) -> InvalidArgument:
    """Triton's message for a request whose inputs don't cover the model's (``ValidateRequestInputs``).

    As Triton prints it, an empty missing list reads ``]`` (its code drops the last character of
    ``[`` when there is no comma to drop)."""
    total, required, got = len(sig.inputs), len(sig.required_inputs), len(request.inputs)
    if total == required:
        head = f"expected {total} inputs but got {got} inputs for model '{sig.name}'"
    else:
        head = f"expected number of inputs between {required} and {total} but got {got} inputs for model '{sig.name}'"
    absent = _names(missing) if missing else "]"
    return InvalidArgument(
        f"{head}. Got input(s) {_names([t.name for t in request.inputs])}, but missing required "
        f"input(s) {absent}. Please provide all required input(s)."
    )


def declared_shape(model: str, name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """An input's shape as sent, checked before its data is decoded (the decode needs it whole).

    Both codecs call this, so a negative dimension gets Triton's message over HTTP and gRPC alike.
    """
    dims = tuple(shape) if all_ints(shape) else tuple(int(d) for d in shape)
    if dims and min(dims) < 0:
        raise InvalidArgument(
            f"All input dimensions should be specified for input '{name}' for model '{model}', got {format_dims(dims)}"
        )
    return dims


def validate_request(request: InferRequest, sig: ModelSignature) -> int:
    """Check ``request`` against ``sig``; return its batch size.

    The batch size is the shared first dimension of the inputs when the model
    batches (``max_batch_size > 0``).  It is ``0`` when the model does not
    batch, as in Triton, and also when a batching model gets no batched input
    (no inputs, or only shape tensors); callers that count inferences use
    ``max(1, batch_size)``.  Inputs and requested outputs must be unique by
    name.  A reshape does not change what is checked: the request's shape is
    compared with the config's ``dims``.
    """
    model = sig.name
    seen: set[str] = set()
    for t in request.inputs:
        if t.name in seen:
            raise InvalidArgument(f"input '{t.name}' already exists in request")
        seen.add(t.name)

    requested: set[str] = set()
    for out in request.outputs:
        if out.name in requested:
            raise InvalidArgument(f"output '{out.name}' already exists in request")
        requested.add(out.name)
        if out.name not in sig.outputs:
            raise InvalidArgument(f"unexpected inference output '{out.name}' for model '{model}'")

    # Triton's InferenceRequest::ValidateRequestInputs: the count first (too many, or fewer than the
    # required ones), then each name.
    missing = [n for n in sig.required_inputs if n not in seen]
    if len(request.inputs) > len(sig.inputs) or len(request.inputs) < len(sig.required_inputs):
        raise _count_error(request, sig, missing)
    for t in request.inputs:
        if t.name not in sig.inputs:
            raise InvalidArgument(f"unexpected inference input '{t.name}' for model '{model}'")
    if missing:
        raise _count_error(request, sig, missing)

    batching = sig.max_batch_size > 0
    batch: int | None = None
    for t in request.inputs:
        shape = declared_shape(model, t.name, t.shape)
        if tuple(t.data.shape) != shape:
            raise InvalidArgument(
                f"input '{t.name}' for model '{model}' has data of shape {format_dims(t.data.shape)}, "
                f"but its declared shape is {format_dims(shape)}"
            )
        if batching and not sig.inputs[t.name].is_shape_tensor:
            if not shape:
                raise InvalidArgument(f"input '{t.name}' has no shape but model requires batch dimension for '{model}'")
            if batch is None:
                batch = shape[0]
            elif shape[0] != batch:
                raise InvalidArgument(f"input '{t.name}' batch size does not match other inputs for '{model}'")
    if batch == 0:  # Triton's core refuses an empty batch; batchers and backends assume one row at least
        raise InvalidArgument(f"inference request batch-size must be >= 1 for '{model}'")
    batch_size = batch or 0
    if batching and batch_size > sig.max_batch_size:
        raise InvalidArgument(f"inference request batch-size must be <= {sig.max_batch_size} for '{model}'")

    for t in request.inputs:
        spec = sig.inputs[t.name]
        if t.datatype != spec.datatype.wire_name:
            raise InvalidArgument(
                f"inference input '{t.name}' data-type is '{t.datatype}', but model '{model}' expects "
                f"'{spec.datatype.wire_name}'"
            )
        shape = tuple(t.shape)
        batched = batching and not spec.is_shape_tensor
        if not spec.matches(shape[1:] if batched else shape):
            expected = sig.full_dims(spec) if batched else spec.dims
            raise InvalidArgument(
                f"unexpected shape for input '{t.name}' for model '{model}'. Expected "
                f"{format_dims(expected)}, got {format_dims(shape)}"
            )
    return batch_size
