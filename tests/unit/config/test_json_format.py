"""Config JSON as Triton's config endpoint writes it, and reading it back."""

from __future__ import annotations

import json

import pytest

from serve_app.config import config_from_json, config_to_json, parse_config
from serve_app.errors import InvalidConfig
from serve_app.protos import model_config_pb2 as mc

TEXT = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] reshape { shape: [ 4, 4 ] } } ]
output [ { name: "OUT" data_type: TYPE_INT64 dims: [ -1 ] } ]
version_policy { specific { versions: [ 1, 3 ] } }
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { default_timeout_microseconds: 7 }
  priority_queue_policy { key: 2 value { default_timeout_microseconds: 5 max_queue_size: 3 } }
}
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "k" value { string_value: "v" } }
optimization { cuda { graph_spec { batch_size: 1 input { key: "IN" value { dim: [ 16 ] } } } } }
model_warmup { name: "w" batch_size: 1
               inputs { key: "IN" value { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } }
"""


@pytest.fixture
def config() -> mc.ModelConfig:
    return parse_config(TEXT, model="m", path="p")


def test_int64_fields_are_numbers(config: mc.ModelConfig) -> None:
    data = config_to_json(config)
    assert data["input"][0]["dims"] == [16]
    assert data["input"][0]["reshape"] == {"shape": [4, 4]}
    assert data["output"][0]["dims"] == [-1]
    assert data["version_policy"] == {"specific": {"versions": [1, 3]}}
    db = data["dynamic_batching"]
    assert db["max_queue_delay_microseconds"] == 100
    assert db["priority_levels"] == 2
    assert db["default_priority_level"] == 1
    assert db["default_queue_policy"]["default_timeout_microseconds"] == 7
    # Map keys stay strings (JSON has no other keys); values are fixed inside.
    assert db["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 5
    assert db["priority_queue_policy"]["2"]["max_queue_size"] == 3
    assert data["optimization"]["cuda"]["graph_spec"][0]["input"]["IN"] == {"dim": [16]}
    assert data["model_warmup"][0]["inputs"]["IN"]["dims"] == [16]
    assert '"dims": [16]' in json.dumps(data)


def test_sequence_and_ensemble_int64_fields() -> None:
    data = config_to_json(
        parse_config(
            """
            sequence_batching { max_sequence_idle_microseconds: 5000000
                                oldest { max_queue_delay_microseconds: 10 }
                                state { input_name: "i" output_name: "o" dims: [ 2 ] } }
            """,
            model="m",
            path="p",
        )
    )
    sb = data["sequence_batching"]
    assert sb["max_sequence_idle_microseconds"] == 5_000_000
    assert sb["oldest"]["max_queue_delay_microseconds"] == 10
    assert sb["state"][0]["dims"] == [2]
    data = config_to_json(
        parse_config('ensemble_scheduling { step { model_name: "a" model_version: -1 } }', model="m", path="p")
    )
    assert data["ensemble_scheduling"]["step"][0]["model_version"] == -1


def test_defaults_are_printed_with_proto_names(config: mc.ModelConfig) -> None:
    data = config_to_json(config)
    assert data["backend"] == ""
    assert data["batch_input"] == []
    assert data["default_model_filename"] == ""
    assert data["input"][0]["is_shape_tensor"] is False
    assert data["input"][0]["allow_ragged_batch"] is False
    assert data["input"][0]["format"] == "FORMAT_NONE"
    assert data["output"][0]["label_filename"] == ""
    assert data["dynamic_batching"]["preserve_ordering"] is False
    assert data["instance_group"][0]["gpus"] == []
    assert data["instance_group"][0]["kind"] == "KIND_CPU"
    assert data["input"][0]["data_type"] == "TYPE_FP32"
    assert data["parameters"] == {"k": {"string_value": "v"}}
    assert data["metric_tags"] == {}


def test_unset_messages_and_oneofs_are_left_out() -> None:
    data = config_to_json(mc.ModelConfig(name="m"))
    assert data["name"] == "m"
    assert data["max_batch_size"] == 0
    for absent in ("version_policy", "dynamic_batching", "sequence_batching", "optimization", "response_cache"):
        assert absent not in data


def test_fields_in_declaration_order(config: mc.ModelConfig) -> None:
    keys = list(config_to_json(config))
    declared = [f.name for f in mc.ModelConfig.DESCRIPTOR.fields]
    assert keys == [k for k in declared if k in keys]
    assert keys[:3] == ["name", "platform", "backend"]


def test_round_trip(config: mc.ModelConfig) -> None:
    data = config_to_json(config)
    assert config_from_json(data, model="m") == config
    assert config_from_json(json.dumps(data), model="m") == config


def test_from_json_accepts_strings_for_int64() -> None:
    config = config_from_json({"input": [{"name": "a", "dims": ["3", 4]}]}, model="m")
    assert list(config.input[0].dims) == [3, 4]


def test_from_json_unknown_field() -> None:
    with pytest.raises(InvalidConfig) as info:
        config_from_json({"name": "m", "bogus": 1}, model="m")
    message = str(info.value)
    assert message.startswith("model 'm': invalid config JSON:")
    assert "bogus" in message
    assert "inference." not in message


def test_from_json_bad_enum() -> None:
    with pytest.raises(InvalidConfig, match="TYPE_FLOAT"):
        config_from_json({"input": [{"name": "a", "data_type": "TYPE_FLOAT"}]}, model="m")


def test_from_json_not_json() -> None:
    with pytest.raises(InvalidConfig, match="model 'm': config is not valid JSON"):
        config_from_json("{name:", model="m")


def test_from_json_not_an_object() -> None:
    with pytest.raises(InvalidConfig, match="must be an object, got list"):
        config_from_json("[]", model="m")
