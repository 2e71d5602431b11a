"""``pb_utils.ModelConfig``: the setters a model's ``auto_complete_config`` calls, with Triton's checks and messages.

A setter may fill in what the config leaves out, never contradict what it says; the messages are the
ones Triton's ``triton_python_backend_utils.py`` raises, since users read them in load errors.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from serve_app.backends.python.model_config import ModelConfig
from serve_app.config import config_to_json, parse_config


def model_config(extra: str = "") -> ModelConfig:
    """A ModelConfig as the backend hands it over: the config's full JSON (every field, defaults included)."""
    text = f'name: "m"\nbackend: "python"\n{extra}'
    return ModelConfig(json.dumps(config_to_json(parse_config(text, model="m", path="config.pbtxt"))))


def value_error(call: Any, *args: Any) -> str:
    with pytest.raises(ValueError) as err:
        call(*args)
    return str(err.value)


def test_as_dict_is_the_live_config() -> None:
    """Triton returns its own dict: what a hook reads reflects the setters it called before."""
    config = model_config()
    assert config.as_dict()["name"] == "m"
    config.set_max_batch_size(4)
    assert config.as_dict()["max_batch_size"] == 4


def test_accepts_a_dict_as_well_as_json_text() -> None:
    assert ModelConfig({"name": "m", "max_batch_size": 2}).as_dict() == {"name": "m", "max_batch_size": 2}


def test_set_max_batch_size_raises_it_but_never_lowers_it() -> None:
    config = model_config("max_batch_size: 8")
    config.set_max_batch_size(8)
    config.set_max_batch_size(16)
    assert config.as_dict()["max_batch_size"] == 16
    assert value_error(config.set_max_batch_size, 4) == (
        "configuration specified max_batch_size 16, but in auto-complete-config function for model 'm' "
        "specified max_batch_size 4"
    )
    assert config.as_dict()["max_batch_size"] == 16


def test_set_dynamic_batching_adds_an_empty_one_and_keeps_an_existing_one() -> None:
    config = model_config()
    config.set_dynamic_batching()
    assert config.as_dict()["dynamic_batching"] == {}
    configured = model_config("max_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 100 }")
    configured.set_dynamic_batching()
    assert configured.as_dict()["dynamic_batching"]["max_queue_delay_microseconds"] == 100


@pytest.mark.parametrize(
    ("extra", "found"),
    [
        ("sequence_batching { }", "sequence_batching"),
        (
            'platform: "ensemble"\nensemble_scheduling { step [ { model_name: "a" model_version: -1 } ] }',
            "ensemble_scheduling",
        ),
    ],
)
def test_set_dynamic_batching_refuses_another_scheduler(extra: str, found: str) -> None:
    config = model_config(extra)
    assert value_error(config.set_dynamic_batching) == (
        f"Configuration specified scheduling_choice as '{found}', but auto-complete-config function for model 'm' "
        "tries to set scheduling_choice as 'dynamic_batching'"
    )
    assert "dynamic_batching" not in config.as_dict()


def test_add_input_and_output_append_new_tensors() -> None:
    config = model_config()
    config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "INPUT1", "data_type": "TYPE_STRING", "dims": [-1], "optional": True})
    config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
    assert [i["name"] for i in config.as_dict()["input"]] == ["INPUT0", "INPUT1"]
    assert config.as_dict()["input"][1]["optional"] is True
    assert config.as_dict()["output"] == [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]


def test_add_input_unknown_key() -> None:
    config = model_config()
    assert value_error(config.add_input, {"name": "x", "data_type": "TYPE_FP32", "dims": [1], "format": "NCHW"}) == (
        "input 'x' in auto-complete-config function for model 'm' contains property other than 'name', 'data_type', "
        "'dims' and 'optional'."
    )


def test_add_output_takes_no_optional() -> None:
    """Outputs have no 'optional': Triton lists only three properties for them."""
    config = model_config()
    assert value_error(config.add_output, {"name": "y", "data_type": "TYPE_FP32", "dims": [1], "optional": True}) == (
        "output 'y' in auto-complete-config function for model 'm' contains property other than 'name', "
        "'data_type' and 'dims'."
    )


@pytest.mark.parametrize("kind", ["input", "output"])
def test_missing_properties_are_named_in_order(kind: str) -> None:
    config = model_config()
    add = config.add_input if kind == "input" else config.add_output
    assert value_error(add, {"data_type": "TYPE_FP32", "dims": [1]}) == (
        f"{kind} in auto-complete-config function for model 'm' is missing 'name' property."
    )
    assert value_error(add, {"name": "t", "dims": [1]}) == (
        f"{kind} 't' in auto-complete-config function for model 'm' is missing 'data_type' property."
    )
    assert value_error(add, {"name": "t", "data_type": "TYPE_FP32"}) == (
        f"{kind} 't' in auto-complete-config function for model 'm' is missing 'dims' property."
    )
    assert config.as_dict()[kind] == []


def test_add_input_merges_with_the_configured_entry() -> None:
    """A config that names the input but leaves its type and dims out gets them from the hook (no duplicate)."""
    config = model_config('input [ { name: "x" } ]\noutput [ { name: "y" data_type: TYPE_FP32 dims: [2] } ]')
    config.add_input({"name": "x", "data_type": "TYPE_INT32", "dims": [3]})
    config.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [2]})
    (x,) = config.as_dict()["input"]
    assert (x["data_type"], x["dims"]) == ("TYPE_INT32", [3])
    assert len(config.as_dict()["output"]) == 1


def test_add_input_sets_optional_where_the_entry_has_none() -> None:
    """Only a config entry that says nothing about 'optional' takes the hook's (the full JSON always says False)."""
    config = ModelConfig({"name": "m", "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}]})
    config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [2], "optional": True})
    assert config.as_dict()["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [2], "optional": True}]


@pytest.mark.parametrize("kind", ["input", "output"])
def test_datatype_conflict(kind: str) -> None:
    config = model_config(f'{kind} [ {{ name: "t" data_type: TYPE_FP32 dims: [2] }} ]')
    add = config.add_input if kind == "input" else config.add_output
    assert value_error(add, {"name": "t", "data_type": "TYPE_INT64", "dims": [2]}) == (
        f"unable to load model 'm', configuration expects datatype TYPE_FP32 for {kind} 't', model provides TYPE_INT64"
    )


@pytest.mark.parametrize("kind", ["input", "output"])
def test_dims_conflict(kind: str) -> None:
    config = model_config(f'{kind} [ {{ name: "t" data_type: TYPE_FP32 dims: [2] }} ]')
    add = config.add_input if kind == "input" else config.add_output
    assert value_error(add, {"name": "t", "data_type": "TYPE_FP32", "dims": [3, 2]}) == (
        "model 'm', tensor 't': the model expects dims [3, 2] but the model configuration specifies dims [2]"
    )


def test_optional_conflict() -> None:
    config = model_config('input [ { name: "t" data_type: TYPE_FP32 dims: [2] optional: true } ]')
    assert value_error(config.add_input, {"name": "t", "data_type": "TYPE_FP32", "dims": [2], "optional": False}) == (
        "model 'm', tensor 't': the model expects optional False but the model configuration specifies optional True"
    )


def test_set_model_transaction_policy() -> None:
    config = model_config()
    config.set_model_transaction_policy({"decoupled": True})
    assert config.as_dict()["model_transaction_policy"] == {"decoupled": True}
    config.set_model_transaction_policy({"decoupled": True})  # the same value again is fine
    assert value_error(config.set_model_transaction_policy, {"decoupled": False}) == (
        "trying to change decoupled property in auto-complete-config for model 'm', which is already set to 'True'."
    )
    assert value_error(config.set_model_transaction_policy, {"decoupled": True, "other": 1}) == (
        "model transaction property in auto-complete-config function for model 'm' contains property other than "
        "'decoupled'."
    )
