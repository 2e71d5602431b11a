"""Counting a JSON infer request's objects on its raw bytes, before ``json.loads`` builds them.

An infer request's objects are the body, its ``parameters``, and each input and requested output
with its own ``parameters``: at most ``2 + 2 * (max_inputs + max_outputs)`` (tensor data holds
numbers, booleans and strings, never objects).  A body of thousands of empty objects, refused by the
input count only once parsed, costs many times its size while ``json.loads`` runs on the event loop
(about 26x for ``{},{},...``).  Counting ``{`` is a pass over bytes; only when that count is over
the bound are the braces inside strings counted and taken off, so a valid request is never refused
here.
"""

from __future__ import annotations

import re

from serve_app.errors import InvalidArgument
from serve_app.limits import RequestLimits

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_FEW_QUOTES = 2 * 4096


def max_objects(limits: RequestLimits) -> int:
    return 2 + 2 * (limits.max_inputs + limits.max_outputs)


def _braces_in_strings(text: bytes) -> int:
    """The ``{`` inside JSON strings.  With few strings (the usual abuse: one key, then bare objects) they are
    counted one by one, with no copy of the body; with many, the strings are taken out in one C pass (a copy)."""
    if text.count(b'"') <= _FEW_QUOTES:
        return sum(match.group().count(b"{") for match in _STRING.finditer(text))
    return text.count(b"{") - _STRING.sub(b"", text).count(b"{")


def check_object_count(body: bytes, header_length: str | None, model: str, limits: RequestLimits) -> None:
    """Refuse (400) a JSON request with more objects than any request within the count limits has."""
    header = body
    if header_length is not None:  # binary tensors follow the JSON: only the JSON is counted
        text = header_length.strip()
        if not text.isascii() or not text.isdigit():
            return  # the decoder refuses it with its own message
        header = body[: int(text)]
    bound = max_objects(limits)
    braces = header.count(b"{")
    if braces <= bound:
        return
    found = braces - _braces_in_strings(header)
    if found > bound:
        raise InvalidArgument(
            f"request for model '{model}' holds {found} JSON objects, more than {bound}, what "
            f"{limits.max_inputs} inputs and {limits.max_outputs} outputs with their parameters can hold "
            "(the server's max_inputs and max_outputs limits; raise them with --max-inputs, --max-outputs)"
        )
