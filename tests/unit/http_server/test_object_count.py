"""The object count of a JSON infer request, on its raw bytes: a body of many objects is refused before it is
parsed; a valid request, braces in its strings included, never is."""

from __future__ import annotations

import json

import pytest

from serve_app.errors import InvalidArgument
from serve_app.http_server.object_count import check_object_count, max_objects
from serve_app.limits import RequestLimits

LIMITS = RequestLimits(max_inputs=2, max_outputs=1)  # at most 2 + 2 * 3 = 8 objects


def request(inputs: int, outputs: int, text: str = "x") -> bytes:
    tensor = {"name": "I", "shape": [1], "datatype": "BYTES", "data": [text], "parameters": {"p": 1}}
    return json.dumps(
        {
            "id": "{{{",
            "parameters": {"q": "}{"},
            "inputs": [tensor] * inputs,
            "outputs": [{"name": "O", "parameters": {"binary_data": True}}] * outputs,
        }
    ).encode()


def test_the_bound_is_what_the_count_limits_allow() -> None:
    assert max_objects(LIMITS) == 8
    check_object_count(request(2, 1), None, "m", LIMITS)  # exactly 8 objects


def test_braces_in_strings_are_not_objects() -> None:
    braces = '{"a": {"b": [{}]}} \\" {' * 50  # escaped quotes included
    check_object_count(request(2, 1, braces), None, "m", LIMITS)


def test_many_objects_are_refused_before_parsing() -> None:
    body = b'{"inputs":[' + b"{}," * 999 + b"{}]}"
    with pytest.raises(InvalidArgument, match="holds 1001 JSON objects, more than 8") as err:
        check_object_count(body, None, "m", LIMITS)
    assert "--max-inputs" in err.value.message and "model 'm'" in err.value.message


def test_only_the_json_part_of_a_binary_request_is_counted() -> None:
    header = request(1, 1)
    binary = b"{" * 1000  # tensor bytes that happen to be braces
    check_object_count(header + binary, str(len(header)), "m", LIMITS)
    check_object_count(header + binary, "not a number", "m", LIMITS)  # the decoder refuses it itself
