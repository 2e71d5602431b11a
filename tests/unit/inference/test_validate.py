"""Request vs model signature (serve_app.inference.validate) with Triton's messages."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.errors import InvalidArgument, InvalidConfig
from serve_app.inference.signature import ModelSignature, TensorSpec, format_dims
from serve_app.inference.types import InferRequest, InferTensor, RequestedOutput
from serve_app.inference.validate import declared_shape, validate_request
from serve_app.protos import model_config_pb2 as mc


def add_sub(max_batch_size: int = 8) -> ModelSignature:
    cfg = mc.ModelConfig(name="add_sub", max_batch_size=max_batch_size)
    for name in ("INPUT0", "INPUT1"):
        cfg.input.add(name=name, data_type=mc.TYPE_FP32, dims=[16])
    for name in ("OUTPUT0", "OUTPUT1"):
        cfg.output.add(name=name, data_type=mc.TYPE_FP32, dims=[16])
    return ModelSignature.from_config(cfg, "1")


def tensor(name: str, shape: tuple[int, ...], datatype: str = "FP32") -> InferTensor:
    dtype = {"FP32": np.float32, "INT32": np.int32}[datatype]
    return InferTensor(name=name, datatype=datatype, shape=shape, data=np.zeros(shape, dtype=dtype))


def request(*inputs: InferTensor, outputs: tuple[str, ...] = ()) -> InferRequest:
    return InferRequest(
        model_name="add_sub",
        inputs=list(inputs),
        outputs=[RequestedOutput(n) for n in outputs],
    )


def message(req: InferRequest, sig: ModelSignature) -> str:
    with pytest.raises(InvalidArgument) as e:
        validate_request(req, sig)
    return str(e.value)


# --------------------------------------------------------------------------- signature


def test_signature_from_config() -> None:
    cfg = mc.ModelConfig(name="m", max_batch_size=4)
    cfg.input.add(name="A", data_type=mc.TYPE_STRING, dims=[-1], optional=True)
    cfg.input.add(name="B", data_type=mc.TYPE_BF16, dims=[2, 3], reshape=mc.ModelTensorReshape(shape=[6]))
    cfg.input.add(name="S", data_type=mc.TYPE_INT32, dims=[2], is_shape_tensor=True)
    cfg.output.add(name="O", data_type=mc.TYPE_FP16, dims=[1], reshape=mc.ModelTensorReshape(shape=[]))
    sig = ModelSignature.from_config(cfg, 3)  # type: ignore[arg-type]
    assert sig.version == "3" and sig.max_batch_size == 4 and sig.batching
    assert list(sig.inputs) == ["A", "B", "S"]
    a, b, s = sig.inputs.values()
    assert a == TensorSpec("A", a.datatype, (-1,), None, optional=True)
    assert a.wire_datatype == "BYTES" and a.datatype.numpy == np.dtype(object)
    assert b.wire_datatype == "BF16" and b.reshape == (6,)
    assert s.is_shape_tensor
    assert sig.outputs["O"].reshape == ()  # empty reshape is a scalar, not "no reshape"
    assert sig.required_inputs == ("B", "S")
    assert sig.full_dims(b) == (-1, 2, 3)
    assert sig.format_full_dims(b) == "[-1,2,3]"
    assert sig.full_shape(b) == [-1, 2, 3] and sig.full_shape(s) == [-1, 2]
    assert format_dims([]) == "[]"


def test_signature_non_batching_dims() -> None:
    sig = add_sub(0)
    assert sig.format_full_dims(sig.inputs["INPUT0"]) == "[16]"


def test_signature_rejects_invalid_datatype() -> None:
    cfg = mc.ModelConfig(name="m")
    cfg.input.add(name="A", data_type=mc.TYPE_INVALID, dims=[1])
    with pytest.raises(InvalidConfig, match=r"input 'A'.*TYPE_INVALID"):
        ModelSignature.from_config(cfg, "1")


# --------------------------------------------------------------------------- happy paths


def test_valid_batched_request_returns_batch_size() -> None:
    sig = add_sub()
    req = request(tensor("INPUT0", (3, 16)), tensor("INPUT1", (3, 16)), outputs=("OUTPUT1",))
    assert validate_request(req, sig) == 3


def test_non_batching_model_returns_zero() -> None:
    sig = add_sub(0)
    assert validate_request(request(tensor("INPUT0", (16,)), tensor("INPUT1", (16,))), sig) == 0


def test_wildcard_dims_accept_any_size() -> None:
    cfg = mc.ModelConfig(name="m", max_batch_size=2)
    cfg.input.add(name="A", data_type=mc.TYPE_FP32, dims=[-1, 3])
    sig = ModelSignature.from_config(cfg, "1")
    assert validate_request(InferRequest("m", inputs=[tensor("A", (2, 7, 3))]), sig) == 2


def test_optional_input_may_be_absent() -> None:
    cfg = mc.ModelConfig(name="m")
    cfg.input.add(name="A", data_type=mc.TYPE_FP32, dims=[1])
    cfg.input.add(name="B", data_type=mc.TYPE_FP32, dims=[1], optional=True)
    sig = ModelSignature.from_config(cfg, "1")
    assert validate_request(InferRequest("m", inputs=[tensor("A", (1,))]), sig) == 0


def test_reshape_checks_request_against_dims() -> None:
    cfg = mc.ModelConfig(name="m", max_batch_size=8)
    cfg.input.add(name="A", data_type=mc.TYPE_FP32, dims=[4], reshape=mc.ModelTensorReshape(shape=[2, 2]))
    sig = ModelSignature.from_config(cfg, "1")
    assert validate_request(InferRequest("m", inputs=[tensor("A", (5, 4))]), sig) == 5
    msg = message(InferRequest("m", inputs=[tensor("A", (5, 2, 2))]), sig)
    assert msg == "unexpected shape for input 'A' for model 'm'. Expected [-1,4], got [5,2,2]"


def test_shape_tensor_has_no_batch_dim() -> None:
    cfg = mc.ModelConfig(name="m", max_batch_size=8)
    cfg.input.add(name="X", data_type=mc.TYPE_FP32, dims=[3])
    cfg.input.add(name="S", data_type=mc.TYPE_INT32, dims=[2], is_shape_tensor=True)
    sig = ModelSignature.from_config(cfg, "1")
    req = InferRequest("m", inputs=[tensor("X", (4, 3)), tensor("S", (2,), "INT32")])
    assert validate_request(req, sig) == 4


# --------------------------------------------------------------------------- errors


def test_unknown_input() -> None:
    msg = message(request(tensor("INPUT0", (1, 16)), tensor("X", (1, 16))), add_sub())
    assert msg == "unexpected inference input 'X' for model 'add_sub'"


def test_missing_input() -> None:
    msg = message(request(tensor("INPUT0", (1, 16))), add_sub())
    assert msg == (
        "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], but missing "
        "required input(s) ['INPUT1']. Please provide all required input(s)."
    )


def test_missing_input_with_optional_inputs() -> None:
    cfg = mc.ModelConfig(name="m")
    for n, opt in (("A", False), ("B", False), ("C", False), ("D", True)):
        cfg.input.add(name=n, data_type=mc.TYPE_FP32, dims=[1], optional=opt)
    msg = message(InferRequest("m", inputs=[tensor("A", (1,))]), ModelSignature.from_config(cfg, "1"))
    assert msg == (
        "expected number of inputs between 3 and 4 but got 1 inputs for model 'm'. Got input(s) ['A'], "
        "but missing required input(s) ['B','C']. Please provide all required input(s)."
    )


def test_no_inputs_at_all() -> None:
    msg = message(request(), add_sub())
    assert "Got input(s) [], but missing required input(s) ['INPUT0','INPUT1']" in msg


def test_duplicate_input() -> None:
    msg = message(request(tensor("INPUT0", (1, 16)), tensor("INPUT0", (1, 16))), add_sub())
    assert msg == "input 'INPUT0' already exists in request"


def test_duplicate_requested_output() -> None:
    req = request(tensor("INPUT0", (1, 16)), tensor("INPUT1", (1, 16)), outputs=("OUTPUT0", "OUTPUT0"))
    assert message(req, add_sub()) == "output 'OUTPUT0' already exists in request"


def test_wrong_datatype() -> None:
    msg = message(request(tensor("INPUT0", (1, 16), "INT32"), tensor("INPUT1", (1, 16))), add_sub())
    assert msg == "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'"


def test_wrong_shape() -> None:
    msg = message(request(tensor("INPUT0", (1, 8)), tensor("INPUT1", (1, 16))), add_sub())
    assert msg == "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,8]"


def test_wrong_rank_non_batching() -> None:
    msg = message(request(tensor("INPUT0", (1, 16)), tensor("INPUT1", (16,))), add_sub(0))
    assert msg == "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [16], got [1,16]"


def test_batch_too_large() -> None:
    msg = message(request(tensor("INPUT0", (9, 16)), tensor("INPUT1", (9, 16))), add_sub())
    assert msg == "inference request batch-size must be <= 8 for 'add_sub'"


def test_batch_mismatch_between_inputs() -> None:
    msg = message(request(tensor("INPUT0", (2, 16)), tensor("INPUT1", (3, 16))), add_sub())
    assert msg == "input 'INPUT1' batch size does not match other inputs for 'add_sub'"


def test_batch_mismatch_with_zero_batch() -> None:
    msg = message(request(tensor("INPUT0", (0, 16)), tensor("INPUT1", (3, 16))), add_sub())
    assert "batch size does not match" in msg


def test_scalar_input_for_batching_model() -> None:
    msg = message(request(tensor("INPUT0", ()), tensor("INPUT1", (1, 16))), add_sub())
    assert msg == "input 'INPUT0' has no shape but model requires batch dimension for 'add_sub'"


def test_unknown_requested_output() -> None:
    req = request(tensor("INPUT0", (1, 16)), tensor("INPUT1", (1, 16)), outputs=("X",))
    assert message(req, add_sub()) == "unexpected inference output 'X' for model 'add_sub'"


def test_negative_dim_in_request() -> None:
    t = InferTensor("INPUT0", "FP32", (-1, 16), np.zeros((1, 16), np.float32))
    assert "All input dimensions should be specified" in message(request(t, tensor("INPUT1", (1, 16))), add_sub())


def test_data_shape_must_match_declared_shape() -> None:
    t = InferTensor("INPUT0", "FP32", (1, 16), np.zeros((2, 8), np.float32))
    assert "has data of shape [2,8]" in message(request(t, tensor("INPUT1", (1, 16))), add_sub())


# --------------------------------------------------------------------------- found by fuzzing (scripts/fuzz)


def test_empty_batch_is_refused_as_triton_does() -> None:
    """An empty batch crashed the sequence batcher (500); Triton's core refuses it."""
    req = request(tensor("INPUT0", (0, 16)), tensor("INPUT1", (0, 16)))
    assert message(req, add_sub()) == "inference request batch-size must be >= 1 for 'add_sub'"


def test_a_model_that_does_not_batch_may_take_an_empty_tensor() -> None:
    req = request(tensor("INPUT0", (0,)), tensor("INPUT1", (0,)))
    cfg = mc.ModelConfig(name="add_sub", max_batch_size=0)
    for name in ("INPUT0", "INPUT1"):
        cfg.input.add(name=name, data_type=mc.TYPE_FP32, dims=[-1])
    assert validate_request(req, ModelSignature.from_config(cfg, "1")) == 0


def test_declared_shape_is_checked_once_for_both_codecs() -> None:
    assert declared_shape("m", "X", [2, np.int64(3)]) == (2, 3)
    with pytest.raises(InvalidArgument) as exc:
        declared_shape("m", "X", [1, -4])
    assert str(exc.value) == "All input dimensions should be specified for input 'X' for model 'm', got [1,-4]"


# --------------------------------------------------------------------------- input count, as Triton checks it


def test_more_inputs_than_the_model_has_is_the_count_error_before_any_name() -> None:
    """A client feeding an implicit-state input: Triton refuses the count, nothing is missing (its ``]``)."""
    req = request(tensor("INPUT0", (1, 16)), tensor("INPUT1", (1, 16)), tensor("INPUT_STATE", (1, 16)))
    assert message(req, add_sub()) == (
        "expected 2 inputs but got 3 inputs for model 'add_sub'. Got input(s) ['INPUT0','INPUT1','INPUT_STATE'], "
        "but missing required input(s) ]. Please provide all required input(s)."
    )


def test_fewer_inputs_than_required_lists_the_missing_ones_even_with_an_unknown_name() -> None:
    req = request(tensor("BOGUS", (1, 16)))
    assert message(req, add_sub()) == (
        "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['BOGUS'], but missing required "
        "input(s) ['INPUT0','INPUT1']. Please provide all required input(s)."
    )


def test_right_count_with_an_unknown_name_names_it() -> None:
    req = request(tensor("INPUT0", (1, 16)), tensor("BOGUS", (1, 16)))
    assert message(req, add_sub()) == "unexpected inference input 'BOGUS' for model 'add_sub'"


def test_requested_outputs_are_checked_before_the_inputs() -> None:
    req = request(tensor("INPUT0", (1, 16)), outputs=("NOPE",))
    assert message(req, add_sub()) == "unexpected inference output 'NOPE' for model 'add_sub'"
