"""A serialized ModelInferRequest's input, output and raw-content counts, checked on its bytes before
protobuf decodes it: refused far over the limits, left to the decoded checks (exact counts) near them, never
misled by raw contents full of the tag bytes, and malformed bytes left to protobuf."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.errors import InvalidArgument
from serve_app.limits import RequestLimits
from serve_app.protocol.grpc_codec import parse_model_infer_request
from serve_app.protocol.limits import check_infer_message_counts
from serve_app.protos import grpc_service_pb2 as pb

LIMITS = RequestLimits(max_inputs=4, max_outputs=3)
OVER = 65536  # fields of a kind protobuf may decode before the bytes are walked


def _request(inputs: int, outputs: int, raw: int, raw_bytes: bytes = b"") -> bytes:
    msg = pb.ModelInferRequest(model_name="m", id="r")
    for i in range(inputs):
        msg.inputs.add(name=f"I{i}", datatype="UINT8", shape=[len(raw_bytes)])
    for i in range(outputs):
        msg.outputs.add(name=f"O{i}")
    msg.raw_input_contents.extend([raw_bytes] * raw)
    msg.parameters["p"].int64_param = 2**40  # a varint field inside a map entry
    return msg.SerializeToString()


def _empties(tag: bytes, n: int) -> bytes:
    return pb.ModelInferRequest(model_name="m").SerializeToString() + tag * n


def test_a_request_within_the_threshold_is_left_to_the_decoded_checks() -> None:
    check_infer_message_counts(_request(40, 30, 40), LIMITS)  # over the limits: refused once decoded, exactly
    check_infer_message_counts(_empties(b"\x2a\x00", OVER), LIMITS)


def test_tag_bytes_inside_raw_contents_are_not_counted() -> None:
    data = _request(4, 3, 4, b"\x2a\x32\x3a" * 100_000)  # every tag byte, many times, inside the data
    check_infer_message_counts(data, LIMITS)
    assert len(parse_model_infer_request(data, LIMITS).raw_input_contents) == 4


@pytest.mark.parametrize(
    ("tag", "what", "setting"),
    [(b"\x2a\x00", "inputs, more than the maximum allowed value of 4", "max_inputs"),
     (b"\x32\x00", "outputs, more than the maximum allowed value of 3", "max_outputs"),
     (b"\x3a\x00", "raw_input_contents, more than the maximum allowed value of 4", "max_inputs")],
)  # fmt: skip
def test_far_over_a_limit_is_refused_from_the_bytes(tag: bytes, what: str, setting: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_model_infer_request(_empties(tag, OVER + 1), LIMITS)
    assert info.value.message.startswith(f"request for model 'm' has over {OVER} {what}")
    assert setting in info.value.message


def test_sixteen_mib_of_empty_inputs_are_refused_at_once() -> None:
    with pytest.raises(InvalidArgument, match=f"has over {OVER} inputs"):
        check_infer_message_counts(_empties(b"\x2a\x00", 8 * 2**20), RequestLimits())


@pytest.mark.parametrize("data", [b"\x2a" * 100, b"\x2a\xff", b"\x0f" + b"\x2a" * 10, b"\xff" * 20 + b"\x2a" * 10])
def test_malformed_bytes_are_left_to_protobuf(data: bytes) -> None:
    check_infer_message_counts(data, LIMITS)  # truncated, bad wire type, endless varint: no opinion


def test_random_bytes_never_raise_anything_else() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        data = rng.integers(0, 256, int(rng.integers(1, 400)), dtype=np.uint8).tobytes()
        try:
            check_infer_message_counts(data, LIMITS)
        except InvalidArgument:
            pass
