"""Request parameters both protocols treat alike."""

from __future__ import annotations

from collections.abc import MutableMapping

from serve_app.errors import InvalidArgument

RESERVED_PREFIX = "triton_"
# Keys a stock client may send that Triton accepts (and we ignore).
ALLOWED_RESERVED = frozenset({"triton_enable_empty_final_response"})


def strip_reserved(params: MutableMapping[str, object]) -> None:
    """Drop the reserved keys Triton tolerates; reject the others as Triton does."""
    for key in [k for k in params if k.startswith(RESERVED_PREFIX)]:
        if key not in ALLOWED_RESERVED:
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        del params[key]
