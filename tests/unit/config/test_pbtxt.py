"""config.pbtxt parsing: Triton's text format, errors that point at the line."""

from __future__ import annotations

import pytest

from serve_app.config import parse_config
from serve_app.errors import ErrorCode, InvalidArgument, InvalidConfig
from serve_app.protos import model_config_pb2 as mc

PATH = "/r/add_sub/config.pbtxt"

MINIMAL = """
name: "mymodel"
platform: "tensorrt_plan"
max_batch_size: 8
input [
  {
    name: "input0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  },
  {
    name: "input1"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
output [
  {
    name: "output0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
version_policy: { all { }}
"""


def parse(text: str) -> mc.ModelConfig:
    return parse_config(text, model="add_sub", path=PATH)


def test_minimal_config_from_the_spec() -> None:
    config = parse(MINIMAL)
    assert config.name == "mymodel"
    assert config.platform == "tensorrt_plan"
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["input0", "input1"]
    assert list(config.input[0].dims) == [16]
    assert config.input[1].data_type == mc.TYPE_FP32
    assert config.output[0].name == "output0"
    assert config.version_policy.WhichOneof("policy_choice") == "all"


def test_repeated_blocks_merge() -> None:
    text = """
    input [ { name: "a" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output { name: "y" data_type: TYPE_INT32 dims: [ 1 ] }
    input [ { name: "b" data_type: TYPE_INT32 dims: [ 2 ] } ]
    input { name: "c" data_type: TYPE_INT32 dims: [ 3 ] }
    """
    config = parse(text)
    assert [i.name for i in config.input] == ["a", "b", "c"]
    assert [list(i.dims) for i in config.input] == [[1], [2], [3]]


def test_comments_and_empty_text() -> None:
    config = parse('# a comment\nname: "m"  # trailing\n')
    assert config.name == "m"
    assert parse("") == mc.ModelConfig()


def test_nested_messages_and_maps() -> None:
    config = parse(
        """
        dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
        parameters { key: "k" value: { string_value: "v" } }
        instance_group [ { count: 2 kind: KIND_CPU } ]
        """
    )
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert config.parameters["k"].string_value == "v"
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


def test_unknown_field_names_model_file_line_and_field() -> None:
    with pytest.raises(InvalidConfig) as info:
        parse('name: "add_sub"\nbogus: 1\n')
    message = str(info.value)
    assert message.startswith(f"model 'add_sub', file '{PATH}': 2:1 : ")
    assert 'Message type "ModelConfig" has no field named "bogus"' in message
    assert "inference." not in message


def test_unknown_nested_field() -> None:
    with pytest.raises(InvalidConfig, match=r'3:\d+ : Message type "ModelInput" has no field named "shape"'):
        parse('name: "x"\ninput {\n  shape: [1]\n}\n')


def test_syntax_error_names_line() -> None:
    with pytest.raises(InvalidConfig) as info:
        parse('name: "x"\ninput [ { name: "a" \n')
    assert str(info.value) == f"model 'add_sub', file '{PATH}': 2:17 : Expected \"}}\"."


def test_bad_enum_value() -> None:
    with pytest.raises(InvalidConfig, match=r'Enum type "DataType" has no value named TYPE_FLOAT'):
        parse('input { name: "a" data_type: TYPE_FLOAT }')


def test_singular_field_twice_is_an_error() -> None:
    with pytest.raises(InvalidConfig, match=r'should not have multiple "name" fields'):
        parse('name: "a"\nname: "b"\n')


def test_error_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse("max_batch_size: many")
    assert info.value.code is ErrorCode.INVALID_ARG
