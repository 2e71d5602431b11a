"""Autoscaling settings: from config parameters and the override file, validated, and as Serve takes them."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from ray.serve.config import AutoscalingConfig

from serve_app.autoscale import (
    POLICY_IMPORT_PATH,
    AutoscalingSpec,
    InstanceLoadPolicy,
    autoscaling_spec,
    load_override_file,
    serve_autoscaling_config,
)
from serve_app.config import parse_config
from serve_app.errors import InvalidConfig

# metrics_interval_s is still the knob Serve 2.60 reads (the env vars it names are not used yet).
pytestmark = pytest.mark.filterwarnings("ignore:The `metrics_interval_s` field:DeprecationWarning")

PATH = "/repo/m/config.pbtxt"
OVERRIDE = "/etc/serve_app/autoscaling.yaml"


def config(params: dict[str, str] | None = None, extra: str = "") -> Any:
    text = 'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n' + extra
    for key, value in (params or {}).items():
        text += f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
    return parse_config(text, model="m", path=PATH)


def spec(params: dict[str, str] | None = None, override: dict[str, Any] | None = None, extra: str = "") -> Any:
    return autoscaling_spec(config(params, extra), override, path=PATH, override_path=OVERRIDE)


def error(params: dict[str, str] | None = None, override: dict[str, Any] | None = None, extra: str = "") -> str:
    with pytest.raises(InvalidConfig) as exc:
        spec(params, override, extra)
    return str(exc.value)


# --- when a model autoscales -------------------------------------------------------------------


def test_no_autoscaling_parameters_means_no_autoscaling() -> None:
    assert spec() is None
    assert spec({"intra_op_thread_count": "2"}) is None  # other parameters belong to the backend


def test_max_replicas_enables_it_with_the_defaults() -> None:
    assert spec({"autoscaling.max_replicas": "4"}) == AutoscalingSpec(max_replicas=4)


def test_the_defaults_suit_a_batching_server() -> None:
    d = AutoscalingSpec()
    assert (d.min_replicas, d.initial_replicas, d.target_utilization, d.target_slot_utilization) == (1, None, 0.7, 0.8)
    assert (d.upscale_delay_s, d.downscale_delay_s, d.metrics_interval_s, d.look_back_period_s) == (3, 30, 1, 5)
    assert d.target_queue_delay_us is None


def test_every_parameter_is_read() -> None:
    params = {
        "autoscaling.enabled": "true",
        "autoscaling.min_replicas": "2",
        "autoscaling.max_replicas": "6",
        "autoscaling.initial_replicas": "3",
        "autoscaling.target_utilization": "0.6",
        "autoscaling.target_queue_delay_us": "5000",
        "autoscaling.target_slot_utilization": "0.75",
        "autoscaling.upscale_delay_s": "1.5",
        "autoscaling.downscale_delay_s": "120",
        "autoscaling.metrics_interval_s": "0.5",
        "autoscaling.look_back_period_s": " 10 ",
    }
    assert spec(params) == AutoscalingSpec(2, 6, 3, 0.6, 5000.0, 0.75, 1.5, 120.0, 0.5, 10.0)


def test_enabled_false_turns_it_off() -> None:
    assert spec({"autoscaling.enabled": "False", "autoscaling.max_replicas": "4"}) is None


def test_enabled_true_without_max_replicas_is_an_error() -> None:
    msg = error({"autoscaling.enabled": "true"})
    assert msg.startswith(f"model 'm', file '{PATH}': parameter 'autoscaling.enabled' is given without")
    assert "'autoscaling.max_replicas'" in msg


def test_other_keys_without_max_replicas_are_an_error_not_a_silent_no_op() -> None:
    assert "autoscaling.max_replicas" in error({"autoscaling.min_replicas": "2"})


def test_unknown_autoscaling_parameter_is_an_error() -> None:
    msg = error({"autoscaling.max_replica": "4"})
    assert msg.startswith(f"model 'm', file '{PATH}': parameters: unknown key 'autoscaling.max_replica'")
    assert "autoscaling.max_replicas" in msg  # lists the known ones


# --- the override ------------------------------------------------------------------------------


def test_override_wins_key_by_key() -> None:
    s = spec({"autoscaling.max_replicas": "4", "autoscaling.min_replicas": "2"}, {"max_replicas": 8})
    assert (s.min_replicas, s.max_replicas) == (2, 8)


def test_override_alone_enables_it() -> None:
    assert spec(None, {"max_replicas": 3, "target_utilization": 0.5}) == AutoscalingSpec(
        max_replicas=3, target_utilization=0.5
    )


def test_override_disables_it() -> None:
    assert spec({"autoscaling.max_replicas": "4"}, {"enabled": False}) is None


def test_override_enables_what_the_config_disabled() -> None:
    assert spec({"autoscaling.enabled": "false", "autoscaling.max_replicas": "4"}, {"enabled": True}) is not None


def test_override_takes_strings_and_integral_floats() -> None:
    assert spec(None, {"max_replicas": "5", "min_replicas": 2.0}) == AutoscalingSpec(min_replicas=2, max_replicas=5)


def test_unknown_override_key_is_an_error_naming_the_file() -> None:
    msg = error(None, {"max_replicas": 2, "targt_utilization": 0.5})
    assert msg.startswith(f"model 'm', file '{OVERRIDE}': unknown autoscaling key 'targt_utilization'")


def test_errors_in_override_values_name_the_override_file_and_its_key() -> None:
    msg = error({"autoscaling.max_replicas": "4"}, {"min_replicas": "two"})
    assert msg == f"model 'm', file '{OVERRIDE}': 'min_replicas' must be an integer, got 'two'"


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("max_replicas", "four", "must be an integer, got 'four'"),
        ("max_replicas", "2.5", "must be an integer"),
        ("min_replicas", "", "must be an integer"),
        ("target_utilization", "high", "must be a number, got 'high'"),
        ("target_utilization", "nan", "must be a number"),
        ("upscale_delay_s", "inf", "must be a number"),
        ("enabled", "yes", "must be true or false, got 'yes'"),
    ],
)
def test_values_of_the_wrong_kind(key: str, value: str, words: str) -> None:
    params = {"autoscaling.max_replicas": "4", f"autoscaling.{key}": value}
    msg = error(params)
    assert msg.startswith(f"model 'm', file '{PATH}': parameter 'autoscaling.{key}' {words}")


@pytest.mark.parametrize("value", [True, [1], {"a": 1}, 2.5])
def test_override_values_of_the_wrong_kind(value: Any) -> None:
    assert f"file '{OVERRIDE}': 'max_replicas' must be an integer" in error(None, {"max_replicas": value})


@pytest.mark.parametrize(
    ("params", "key", "words"),
    [
        ({"max_replicas": "0"}, "max_replicas", "must be at least 1, got 0"),
        ({"max_replicas": "-2"}, "max_replicas", "must be at least 1"),
        ({"max_replicas": "4", "min_replicas": "-1"}, "min_replicas", "must be at least 1, got -1"),
        ({"max_replicas": "4", "min_replicas": "0"}, "min_replicas", "scaling to zero is not supported"),
        ({"max_replicas": "2", "min_replicas": "3"}, "min_replicas", "(3) must not exceed"),
        ({"max_replicas": "4", "min_replicas": "2", "initial_replicas": "1"}, "initial_replicas", "must lie between"),
        ({"max_replicas": "4", "initial_replicas": "5"}, "initial_replicas", "(5) must lie between"),
        ({"max_replicas": "4", "target_utilization": "0"}, "target_utilization", "must be in (0, 1], got 0"),
        ({"max_replicas": "4", "target_utilization": "1.2"}, "target_utilization", "must be in (0, 1]"),
        ({"max_replicas": "4", "target_slot_utilization": "-0.5"}, "target_slot_utilization", "must be in (0, 1]"),
        ({"max_replicas": "4", "target_queue_delay_us": "0"}, "target_queue_delay_us", "must be positive"),
        ({"max_replicas": "4", "upscale_delay_s": "-1"}, "upscale_delay_s", "must not be negative"),
        ({"max_replicas": "4", "downscale_delay_s": "-1"}, "downscale_delay_s", "must not be negative"),
        ({"max_replicas": "4", "metrics_interval_s": "0"}, "metrics_interval_s", "must be positive"),
        ({"max_replicas": "4", "look_back_period_s": "1"}, "look_back_period_s", "must be longer than"),
        (
            {"max_replicas": "4", "metrics_interval_s": "10", "look_back_period_s": "5"},
            "look_back_period_s",
            "(5) must be longer than metrics_interval_s (10)",
        ),
    ],
)
def test_impossible_values(params: dict[str, str], key: str, words: str) -> None:
    msg = error({f"autoscaling.{k}": v for k, v in params.items()})
    assert msg.startswith(f"model 'm', file '{PATH}': parameter 'autoscaling.{key}' ")
    assert words in msg


def test_a_cross_check_names_the_other_file_when_the_values_come_from_two() -> None:
    msg = error({"autoscaling.min_replicas": "3"}, {"max_replicas": 2})
    assert msg == (
        f"model 'm', file '{PATH}': parameter 'autoscaling.min_replicas' (3) must not exceed "
        f"'max_replicas' (in '{OVERRIDE}') (2)"
    )


def test_queue_delay_target_must_exceed_the_batchers_own_delay() -> None:
    batching = "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
    msg = error({"autoscaling.max_replicas": "4", "autoscaling.target_queue_delay_us": "500"}, extra=batching)
    assert "parameter 'autoscaling.target_queue_delay_us' (500) must exceed the batcher's" in msg
    assert spec({"autoscaling.max_replicas": "4", "autoscaling.target_queue_delay_us": "501"}, extra=batching)


def test_queue_delay_target_checks_the_sequence_batchers_delay_too() -> None:
    oldest = "sequence_batching { oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 900 } }\n"
    assert "must exceed" in error(
        {"autoscaling.max_replicas": "4", "autoscaling.target_queue_delay_us": "800"}, None, oldest
    )
    direct = "sequence_batching { direct { max_queue_delay_microseconds: 900 } }\n"
    assert "must exceed" in error(
        {"autoscaling.max_replicas": "4", "autoscaling.target_queue_delay_us": "900"}, None, direct
    )


# --- Serve's autoscaling_config ------------------------------------------------------------------


def test_serve_accepts_the_config() -> None:
    s = AutoscalingSpec(2, 6, 3, 0.6, 5000.0, 0.75, 1.5, 120.0, 0.5, 10.0)
    result = serve_autoscaling_config(s, sequence=False)
    json.dumps(result)  # goes into deployment options and Serve's config files
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # look_back_period_s <= metrics_interval_s warns
        cfg = AutoscalingConfig(**result)
    assert (cfg.min_replicas, cfg.max_replicas, cfg.initial_replicas) == (2, 6, 3)
    assert (cfg.upscale_delay_s, cfg.downscale_delay_s, cfg.metrics_interval_s, cfg.look_back_period_s) == (
        1.5,
        120.0,
        0.5,
        10.0,
    )
    assert cfg.aggregation_function.value == "mean"
    assert cfg.policy.policy_function == POLICY_IMPORT_PATH == "serve_app.autoscale.policy:InstanceLoadPolicy"
    assert cfg.policy.policy_kwargs == {
        "target_utilization": 0.6,
        "target_queue_delay_us": 5000.0,
        "target_slot_utilization": 0.75,
        "sequence": False,
    }
    assert cfg.policy.get_policy() is InstanceLoadPolicy


def test_serve_config_without_initial_replicas_starts_at_min() -> None:
    result = serve_autoscaling_config(AutoscalingSpec(min_replicas=2, max_replicas=4), sequence=True)
    assert "initial_replicas" not in result
    cfg = AutoscalingConfig(**result)
    assert cfg.initial_replicas is None and cfg.policy.policy_kwargs["sequence"] is True


def test_sample_interval_follows_serves_record_interval() -> None:
    assert AutoscalingSpec().sample_interval_s == 1.0  # min(5 * 0.2, 1)
    assert AutoscalingSpec(metrics_interval_s=2.0, look_back_period_s=5.0).sample_interval_s == 1.0
    assert AutoscalingSpec(metrics_interval_s=0.5, look_back_period_s=10.0).sample_interval_s == 0.5


# --- the override file -------------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_yaml_override_file(tmp_path: Path) -> None:
    path = write(tmp_path, "a.yaml", "m:\n  min_replicas: 1\n  max_replicas: 4\nother: {enabled: false}\nidle:\n")
    assert load_override_file(path) == {
        "m": {"min_replicas": 1, "max_replicas": 4},
        "other": {"enabled": False},
        "idle": {},
    }


def test_json_override_file(tmp_path: Path) -> None:
    path = write(tmp_path, "a.json", json.dumps({"m": {"max_replicas": 4, "target_utilization": 0.5}}))
    assert load_override_file(Path(path)) == {"m": {"max_replicas": 4, "target_utilization": 0.5}}


def test_empty_override_file(tmp_path: Path) -> None:
    assert load_override_file(write(tmp_path, "a.yaml", "")) == {}


def test_override_file_values_feed_the_spec(tmp_path: Path) -> None:
    path = write(tmp_path, "a.yaml", "m: {max_replicas: 3, upscale_delay_s: 0}\n")
    s = autoscaling_spec(config(), load_override_file(path)["m"], override_path=path)
    assert s == AutoscalingSpec(max_replicas=3, upscale_delay_s=0.0)


def test_unknown_key_in_the_file_names_file_model_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "a.yaml", "m:\n  autoscaling.max_replicas: 4\n")
    with pytest.raises(InvalidConfig) as exc:
        load_override_file(path)
    assert str(exc.value).startswith(f"model 'm', file '{path}': unknown key 'autoscaling.max_replicas' (known: ")


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("a.yaml", "- m\n- n\n", "expected a mapping of model name to settings, got list"),
        ("a.yaml", "m: 4\n", "model 'm', file"),
        ("a.yaml", "1: {max_replicas: 2}\n", "model names must be strings"),
        ("a.yaml", "m: [unclosed\n", "not valid YAML"),
        ("a.json", "{'m': 1}", "not valid JSON"),
    ],
)
def test_malformed_override_files(tmp_path: Path, name: str, text: str, words: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(InvalidConfig) as exc:
        load_override_file(path)
    assert path in str(exc.value) and words in str(exc.value)


def test_missing_override_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.yaml")
    with pytest.raises(InvalidConfig, match="cannot read the autoscaling file"):
        load_override_file(path)
