"""Request limits (serve_app.protocol.limits): the checks both front ends make before allocating."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from serve_app.errors import ErrorCode, InvalidArgument, ResourceExhausted
from serve_app.limits import DEFAULT_LIMITS, GRPC_MAX_MESSAGE_BYTES, RequestLimits
from serve_app.protocol.limits import (
    ElementBudget,
    body_too_large,
    check_body_size,
    check_counts,
    check_json_depth,
    json_depth,
)
from serve_app.protocol.status import grpc_status, http_status


def test_defaults() -> None:
    assert dataclasses.asdict(DEFAULT_LIMITS) == {
        "max_body_bytes": 64 * 2**20,  # Triton's --http-max-input-size
        "max_tensor_elements": 2**28,
        "max_json_depth": 100,  # Triton's HTTP_MAX_JSON_NESTING_DEPTH
        "max_inputs": 1024,
        "max_outputs": 1024,
    }
    # What a default body can carry in one-byte elements: the element limit never refuses what fits the body.
    assert DEFAULT_LIMITS.max_tensor_elements >= DEFAULT_LIMITS.max_body_bytes


@pytest.mark.parametrize("field", ["max_body_bytes", "max_tensor_elements", "max_json_depth", "max_inputs"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "8"])
def test_limits_must_be_positive_integers(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        RequestLimits(**{field: value})  # type: ignore[arg-type]


def test_limits_are_frozen() -> None:
    with pytest.raises(AttributeError):
        DEFAULT_LIMITS.max_inputs = 3  # type: ignore[misc]


def test_grpc_receive_size_follows_the_body_limit_within_grpc_range() -> None:
    assert RequestLimits(max_body_bytes=1000).grpc_max_receive_bytes == 1000
    assert RequestLimits(max_body_bytes=2**40).grpc_max_receive_bytes == GRPC_MAX_MESSAGE_BYTES


def test_too_large_is_413_and_resource_exhausted() -> None:
    assert http_status(ErrorCode.RESOURCE_EXHAUSTED) == 413
    assert grpc_status(ErrorCode.RESOURCE_EXHAUSTED).name == "RESOURCE_EXHAUSTED"
    limits = RequestLimits(max_body_bytes=100)
    check_body_size(100, limits)
    with pytest.raises(ResourceExhausted) as exc:
        check_body_size(101, limits)
    assert str(exc.value) == (
        "request body size of 101 bytes exceeds the maximum allowed value of 100 bytes, the server's "
        "max_body_bytes limit (raise it with --max-body-bytes)"
    )
    assert str(body_too_large(None, limits)).startswith("request body size exceeds the maximum allowed value of 100")


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b"1", 0),
        (b"[]", 1),
        (b'{"a":[1,{"b":[[]]}]}', 5),
        (b'["[[[[", "]]", "{"]', 1),  # brackets in strings are text
        (b'["\\"[[[", "\\\\", [2]]', 2),  # escaped quotes and backslashes end (or don't end) strings rightly
        (b"[" * 100_000, 100_000),  # unbalanced: the deepest point still counts
        (b"[[]]" * 10 + b"[[[]]]", 3),
    ],
)
def test_json_depth(text: bytes, depth: int) -> None:
    assert json_depth(text) == depth


def test_json_depth_matches_the_parser() -> None:
    doc = {"inputs": [{"name": "x", "data": [[[1, 2]], [[3, 4]]], "parameters": {"s": "[{"}}]}
    assert json_depth(json.dumps(doc).encode()) == 6  # {, [, {, [, [, [


def test_json_depth_limit() -> None:
    """The limit is on a tensor's data: the body may nest four levels more (body, inputs, an input, data)."""
    limits = RequestLimits(max_json_depth=3)
    check_json_depth(b"[[[[[[[1]]]]]]]", limits)
    check_json_depth(b'["[[[[[[[[[[[[["]', limits)
    with pytest.raises(InvalidArgument) as exc:
        check_json_depth(b"[[[[[[[[1]]]]]]]]", limits)
    assert str(exc.value) == (
        "JSON nesting depth exceeds maximum allowed limit (3), the server's max_json_depth limit (raise it with "
        "--max-json-depth)"
    )


def test_deep_and_large_bodies_are_checked_quickly() -> None:
    """100,000 levels (which would make json.loads recurse) and 10 MB of nested data: milliseconds."""
    deep = b"[" * 100_000 + b"]" * 100_000
    rows = json.dumps({"inputs": [{"name": "x", "data": [[i, i] for i in range(1_000_000)]}]}).encode()
    start = time.perf_counter()
    with pytest.raises(InvalidArgument):
        check_json_depth(deep, DEFAULT_LIMITS)
    check_json_depth(rows, DEFAULT_LIMITS)
    assert time.perf_counter() - start < 1.0  # about 0.1 s here; json.loads of rows alone takes 0.8 s


def test_counts() -> None:
    limits = RequestLimits(max_inputs=2, max_outputs=1)
    check_counts("m", 2, 1, limits)
    with pytest.raises(InvalidArgument) as exc:
        check_counts("m", 3, 0, limits)
    assert str(exc.value) == (
        "request for model 'm' has 3 inputs, more than the maximum allowed value of 2, the server's max_inputs "
        "limit (raise it with --max-inputs)"
    )
    with pytest.raises(InvalidArgument, match="requests 2 outputs, more than the maximum allowed value of 1"):
        check_counts("m", 0, 2, limits)


def test_element_budget_counts_the_whole_request() -> None:
    budget = ElementBudget("m", RequestLimits(max_tensor_elements=100))
    budget.add("A", (2, 25))
    budget.add("B", (0, 2**62))  # an empty tensor takes nothing
    budget.add("C", ())  # a scalar is one element
    assert budget.total == 51
    with pytest.raises(InvalidArgument) as exc:
        budget.add("D", (2**31, 2**31))
    assert str(exc.value).startswith(
        f"input 'D' brings the request for model 'm' to {51 + 2**62} tensor elements, more than the maximum "
        "allowed value of 100, the server's max_tensor_elements limit (raise it with --max-tensor-elements)"
    )


def test_element_count_and_byte_size_overflow_get_tritons_messages() -> None:
    """Triton counts in int64; its QA pins both overflow messages, which come before any limit."""
    budget = ElementBudget("m", RequestLimits(max_tensor_elements=2**63))
    with pytest.raises(InvalidArgument) as exc:
        budget.add("INPUT0", (2**4, 2**60 + 2), "FP32")
    assert str(exc.value) == (
        "shape [16,1152921504606846978] of input 'INPUT0' for model 'm' causes total element count to exceed "
        "maximum size of 9223372036854775807"
    )
    with pytest.raises(InvalidArgument, match=r"^byte size overflow for input 'INPUT0' for model 'm'"):
        budget.add("INPUT0", (2**2, 2**60 + 2), "FP32")
    budget.add("S", (2**2, 2**60 + 2), "BYTES")  # no fixed element size: only the count is checked
    assert budget.total == 2**62 + 8
