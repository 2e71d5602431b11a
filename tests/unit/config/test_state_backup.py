"""Sequence state backup policy: which models back up their implicit state, and the errors of its parameter."""

from __future__ import annotations

import pytest

from serve_app.config import parse_config, validate_config
from serve_app.config.state_backup import AUTO_MAX_BYTES, PARAMETER, declared_state_bytes, state_backup_enabled
from serve_app.errors import InvalidConfig
from serve_app.protos import model_config_pb2 as mc

MODEL = "m"
PATH = "/repo/m/config.pbtxt"

BASE = """
name: "m"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""


def state(dims: str = "[ 4 ]", data_type: str = "TYPE_FP32") -> str:
    return f'state [ {{ input_name: "IN_STATE" output_name: "OUT_STATE" data_type: {data_type} dims: {dims} }} ]'


def config(*, sequence: bool = True, states: str = state(), backup: str | None = None) -> mc.ModelConfig:
    text = BASE
    if sequence:
        text += f"sequence_batching {{ {CONTROLS} {states} }}\n"
    if backup is not None:
        text += f'parameters {{ key: "{PARAMETER}" value: {{ string_value: "{backup}" }} }}\n'
    return parse_config(text, model=MODEL, path=PATH)


def enabled(cfg: mc.ModelConfig) -> bool:
    return state_backup_enabled(cfg, path=PATH)


def invalid(cfg: mc.ModelConfig, detail: str) -> None:
    """Both the policy and validate_config reject ``cfg``, naming the model, the file and the parameter."""
    with pytest.raises(InvalidConfig) as info:
        enabled(cfg)
    message = str(info.value)
    assert message.startswith(f"model '{MODEL}', file '{PATH}': "), message
    assert PARAMETER in message and detail in message, message
    with pytest.raises(InvalidConfig) as again:
        validate_config(cfg, model=MODEL, path=PATH)
    assert str(again.value) == message


# -- the declared size ----------------------------------------------------------------


def test_declared_state_bytes() -> None:
    assert declared_state_bytes(config(states=state("[ 4 ]", "TYPE_FP32"))) == 16
    assert declared_state_bytes(config(states=state("[ 2, 3 ]", "TYPE_INT64"))) == 48
    assert declared_state_bytes(config(states=state("[ -1, 8 ]", "TYPE_INT16"))) == 16  # variable dims count as 1
    assert declared_state_bytes(config(states="")) == 0
    two = (
        'state [ { input_name: "A" output_name: "B" data_type: TYPE_INT32 dims: [ 2 ] },'
        ' { input_name: "C" output_name: "D" data_type: TYPE_UINT8 dims: [ 5 ] } ]'
    )
    assert declared_state_bytes(config(states=two)) == 13


# -- auto ---------------------------------------------------------------------------


def test_auto_on_for_a_small_implicit_state() -> None:
    cfg = config()
    assert enabled(cfg)
    validate_config(cfg, model=MODEL, path=PATH)


@pytest.mark.parametrize("value", ["auto", "AUTO", " Auto "])
def test_auto_spelled_out(value: str) -> None:
    assert enabled(config(backup=value))


def test_auto_off_without_implicit_state() -> None:
    assert not enabled(config(states=""))
    assert not enabled(config(states="", backup="auto"))


def test_off_for_a_model_without_sequence_batching() -> None:
    assert not enabled(config(sequence=False))


def test_auto_at_the_limit() -> None:
    at_limit = config(states=state(f"[ {AUTO_MAX_BYTES // 4} ]", "TYPE_FP32"))
    assert declared_state_bytes(at_limit) == AUTO_MAX_BYTES
    assert enabled(at_limit)


def test_auto_off_for_a_large_state_unless_true() -> None:
    large = state(f"[ {AUTO_MAX_BYTES // 4 + 1} ]", "TYPE_FP32")
    assert declared_state_bytes(config(states=large)) > AUTO_MAX_BYTES
    assert not enabled(config(states=large))
    assert not enabled(config(states=large, backup="auto"))
    assert enabled(config(states=large, backup="true"))
    validate_config(config(states=large, backup="true"), model=MODEL, path=PATH)


@pytest.mark.parametrize("value", ["false", "FALSE", "False"])
def test_false_turns_it_off(value: str) -> None:
    cfg = config(backup=value)
    assert not enabled(cfg)
    validate_config(cfg, model=MODEL, path=PATH)


def test_false_without_implicit_state_is_fine() -> None:
    assert not enabled(config(states="", backup="false"))


@pytest.mark.parametrize("value", ["true", "TRUE", "True"])
def test_true_turns_it_on(value: str) -> None:
    assert enabled(config(backup=value))


# -- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["yes", "1", "", "on"])
def test_bad_value(value: str) -> None:
    invalid(config(backup=value), "must be one of auto, true, false")


def test_true_without_implicit_state() -> None:
    invalid(config(states="", backup="true"), "no implicit state")


@pytest.mark.parametrize("value", ["auto", "true", "false"])
def test_parameter_on_a_model_without_sequence_batching(value: str) -> None:
    invalid(config(sequence=False, backup=value), "needs sequence_batching")


def test_default_path_in_the_message() -> None:
    with pytest.raises(InvalidConfig, match=f"model 'm', file 'config.pbtxt': parameters: '{PARAMETER}'"):
        state_backup_enabled(config(backup="maybe"))
