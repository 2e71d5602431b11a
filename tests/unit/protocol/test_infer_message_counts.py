"""A serialized ModelInferRequest's input, output and raw-content counts, checked on its bytes before
protobuf decodes it: refused over the limits, never for a request within them (binary raw contents full of
the tag bytes included), and malformed bytes left to protobuf."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.errors import InvalidArgument
from serve_app.limits import RequestLimits
from serve_app.protocol.grpc_codec import parse_model_infer_request
from serve_app.protocol.limits import check_infer_message_counts
from serve_app.protos import grpc_service_pb2 as pb

LIMITS = RequestLimits(max_inputs=4, max_outputs=3)


def _request(inputs: int, outputs: int, raw: int, raw_bytes: bytes = b"") -> bytes:
    msg = pb.ModelInferRequest(model_name="m", id="r")
    for i in range(inputs):
        msg.inputs.add(name=f"I{i}", datatype="UINT8", shape=[len(raw_bytes)])
    for i in range(outputs):
        msg.outputs.add(name=f"O{i}")
    msg.raw_input_contents.extend([raw_bytes] * raw)
    msg.parameters["p"].int64_param = 2**40  # a varint field inside a map entry
    return msg.SerializeToString()


def test_a_request_at_the_limits_passes() -> None:
    check_infer_message_counts(_request(4, 3, 4), LIMITS)


def test_tag_bytes_inside_raw_contents_are_not_counted() -> None:
    data = _request(4, 3, 4, b"\x2a\x32\x3a" * 1000)  # every tag byte, many times, inside the data
    check_infer_message_counts(data, LIMITS)
    assert len(parse_model_infer_request(data, LIMITS).raw_input_contents) == 4


@pytest.mark.parametrize(
    ("counts", "what", "setting"),
    [((5, 0, 0), "4 inputs", "max_inputs"), ((0, 4, 0), "3 outputs", "max_outputs"),
     ((4, 0, 5), "4 raw_input_contents", "max_inputs")],
)  # fmt: skip
def test_over_a_limit_is_refused_with_its_setting(counts: tuple[int, int, int], what: str, setting: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_model_infer_request(_request(*counts), LIMITS)
    assert info.value.message.startswith(f"request for model 'm' has more than {what}, the maximum allowed value")
    assert setting in info.value.message


def test_empty_inputs_are_refused_at_the_first_one_over() -> None:
    data = pb.ModelInferRequest(model_name="m").SerializeToString() + b"\x2a\x00" * 1_000_000
    with pytest.raises(InvalidArgument, match="more than 1024 inputs"):
        check_infer_message_counts(data, RequestLimits())


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
