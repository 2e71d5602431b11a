"""Config validation: one test per rule, each checking the message names the field."""

from __future__ import annotations

import re

import pytest

from serve_app.config import normalize_platform, parse_config, validate_config
from serve_app.errors import InvalidConfig
from serve_app.protos import model_config_pb2 as mc

MODEL = "m"
PATH = "/repo/m/config.pbtxt"

ONNX = """
name: "m"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "IN0" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "IN1" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
output [ { name: "OUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""

ENSEMBLE = """
name: "m"
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "RESULT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "pre" model_version: -1
      input_map { key: "IN" value: "RAW" } output_map { key: "OUT" value: "mid" } },
    { model_name: "net" model_version: -1
      input_map { key: "IN" value: "mid" } output_map { key: "OUT" value: "RESULT" } }
  ]
}
"""

TORCH = """
name: "m"
platform: "pytorch_libtorch"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def config(text: str = ONNX, extra: str = "") -> mc.ModelConfig:
    return parse_config(text + extra, model=MODEL, path=PATH)


def validate(cfg: mc.ModelConfig) -> None:
    validate_config(cfg, model=MODEL, path=PATH)


def invalid(cfg: mc.ModelConfig, field: str, detail: str = "") -> str:
    """Validation fails, naming model, file and ``field``; returns the message."""
    with pytest.raises(InvalidConfig) as info:
        validate(cfg)
    message = str(info.value)
    assert message.startswith(f"model '{MODEL}', file '{PATH}': {field}: "), message
    if detail:
        assert re.search(detail, message), message
    return message


def test_valid_configs_pass() -> None:
    validate(config())
    validate(config(ENSEMBLE))
    validate(config(TORCH))


# -- name -------------------------------------------------------------------


def test_name_required() -> None:
    cfg = config()
    cfg.name = ""
    invalid(cfg, "name", "must specify 'name'")


def test_name_must_match_directory() -> None:
    cfg = config()
    cfg.name = "other"
    invalid(cfg, "name", r"must match the model directory name 'm' \(got 'other'\)")


# -- platform / backend -------------------------------------------------------


def test_platform_or_backend_required() -> None:
    cfg = config()
    cfg.ClearField("platform")
    cfg.ClearField("backend")
    invalid(cfg, "platform", "must specify 'platform' or 'backend'")


@pytest.mark.parametrize("platform", ["tensorflow_savedmodel", "tensorflow_graphdef", "custom", "caffe2_netdef"])
def test_unsupported_platform(platform: str) -> None:
    cfg = config()
    cfg.platform = platform
    cfg.ClearField("backend")
    invalid(cfg, "platform", f"unsupported platform '{platform}'")


@pytest.mark.parametrize("backend", ["tensorflow", "openvino", "my_custom"])
def test_unsupported_backend(backend: str) -> None:
    cfg = config()
    cfg.ClearField("platform")
    cfg.backend = backend
    invalid(cfg, "backend", f"unsupported backend '{backend}'")


def test_python_backend_takes_no_platform() -> None:
    cfg = config()
    cfg.ClearField("platform")
    cfg.backend = "python"
    validate(cfg)
    cfg.platform = "onnxruntime_onnx"
    invalid(cfg, "platform", "backend 'python' takes no platform")


def test_decoupled_needs_the_python_backend() -> None:
    cfg = config()
    cfg.model_transaction_policy.decoupled = True
    invalid(cfg, "model_transaction_policy.decoupled", "backend 'python' only")
    cfg.ClearField("platform")
    cfg.backend = "python"
    validate(cfg)


def test_an_ensemble_may_declare_itself_decoupled() -> None:
    """Triton replaces the ensemble's own flag with what its steps are, so the backend check skips it."""
    cfg = config(ENSEMBLE)
    cfg.model_transaction_policy.decoupled = True
    validate(cfg)


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf"])
def test_response_timeout_must_be_positive(value: str) -> None:
    cfg = config()
    cfg.parameters["response_timeout_s"].string_value = value
    invalid(cfg, "parameters", "'response_timeout_s' must be a positive number of seconds")


def test_platform_and_backend_must_agree() -> None:
    cfg = config()
    cfg.backend = "pytorch"
    invalid(cfg, "backend", "backend 'pytorch' does not match platform 'onnxruntime_onnx'")


def test_ensemble_has_no_backend() -> None:
    cfg = config(ENSEMBLE)
    cfg.backend = "onnxruntime"
    invalid(cfg, "backend", "must not specify a backend")


def test_either_half_of_a_pair_is_enough() -> None:
    cfg = config()
    cfg.ClearField("backend")
    validate(cfg)
    cfg = config()
    cfg.ClearField("platform")
    validate(cfg)


@pytest.mark.parametrize(
    ("platform", "backend"),
    [("onnxruntime_onnx", "onnxruntime"), ("pytorch_libtorch", "pytorch"), ("tensorrt_plan", "tensorrt")],
)
def test_normalize_platform_fills_the_missing_half(platform: str, backend: str) -> None:
    cfg = mc.ModelConfig(platform=platform)
    normalize_platform(cfg)
    assert cfg.backend == backend
    cfg = mc.ModelConfig(backend=backend)
    normalize_platform(cfg)
    assert cfg.platform == platform


def test_normalize_platform_leaves_unknown_and_ensemble_alone() -> None:
    for cfg in (mc.ModelConfig(platform="ensemble"), mc.ModelConfig(backend="python"), mc.ModelConfig()):
        before = mc.ModelConfig()
        before.CopyFrom(cfg)
        normalize_platform(cfg)
        assert cfg == before


# -- max_batch_size / version policy ------------------------------------------


def test_max_batch_size_non_negative() -> None:
    cfg = config()
    cfg.max_batch_size = -1
    invalid(cfg, "max_batch_size", r"must be >= 0 \(got -1\)")


def test_specific_versions_positive() -> None:
    invalid(
        config(extra="version_policy { specific { versions: [ 1, 0 ] } }"),
        "version_policy.specific.versions",
        "version 0 is not a positive integer",
    )


def test_specific_versions_not_empty() -> None:
    invalid(config(extra="version_policy { specific { } }"), "version_policy.specific.versions", "at least one")


def test_latest_and_all_policies_pass() -> None:
    validate(config(extra="version_policy { latest { num_versions: 0 } }"))
    validate(config(extra="version_policy { all { } }"))


# -- inputs and outputs -------------------------------------------------------


def test_io_name_required() -> None:
    cfg = config()
    cfg.input[1].name = ""
    invalid(cfg, r"input[1].name", "must specify 'name'")


def test_io_names_unique() -> None:
    cfg = config()
    cfg.input[1].name = "IN0"
    invalid(cfg, "input[1].name", r"duplicate input name 'IN0' \(also input\[0\]\)")


def test_input_and_output_may_share_a_name() -> None:
    cfg = config()
    cfg.output[0].name = "IN0"
    validate(cfg)


def test_data_type_required() -> None:
    cfg = config()
    cfg.output[0].data_type = mc.TYPE_INVALID
    invalid(cfg, "output[0].data_type", "model output 'OUT0' must specify 'data_type'")


def test_dims_required() -> None:
    cfg = config()
    del cfg.input[1].dims[:]
    invalid(cfg, "input[1].dims", "model input 'IN1' must specify 'dims'")


def test_dims_required_even_with_reshape() -> None:
    cfg = config()
    del cfg.input[0].dims[:]
    cfg.input[0].reshape.SetInParent()
    invalid(cfg, "input[0].dims", "must specify 'dims'")


@pytest.mark.parametrize("dim", [0, -2, -100])
def test_dim_must_be_positive_or_wildcard(dim: int) -> None:
    cfg = config()
    cfg.input[1].dims[1] = dim
    invalid(cfg, "input[1].dims", rf"dimension 1 must be an integer >= 1, or -1 .*\(got {dim}\)")


def test_output_dim_checked_too() -> None:
    cfg = config()
    cfg.output[0].dims[0] = 0
    invalid(cfg, "output[0].dims", "model output 'OUT0' dimension 0")


def test_unknown_data_type_value() -> None:
    cfg = config()
    cfg.input[0].data_type = 99  # type: ignore[assignment]
    invalid(cfg, "input[0].data_type", "unknown data type 99")


@pytest.mark.parametrize(
    ("dims", "reshape"),
    [([1], []), ([16], [4, 4]), ([2, 4, -1, 6], [8, -1, 1, 6]), ([-1], [-1]), ([-1, 4], [-1, 2, 2])],
)
def test_valid_reshapes(dims: list[int], reshape: list[int]) -> None:
    cfg = config()
    cfg.input[0].ClearField("dims")
    cfg.input[0].dims.extend(dims)
    cfg.input[0].reshape.shape.extend(reshape)
    cfg.input[0].reshape.SetInParent()
    validate(cfg)


def test_reshape_element_count_must_match() -> None:
    cfg = config(extra='input { name: "R" data_type: TYPE_FP32 dims: [ 16 ] reshape { shape: [ 4, 5 ] } }')
    invalid(cfg, "input[2].reshape", r"different element counts for dims \[16\] and reshape \[4, 5\]")


def test_reshape_wildcard_count_must_match() -> None:
    cfg = config(extra='input { name: "R" data_type: TYPE_FP32 dims: [ -1, -1 ] reshape { shape: [ -1 ] } }')
    invalid(cfg, "input[2].reshape", "different numbers of variable-size dimensions")


def test_reshape_wildcard_runs_must_match() -> None:
    cfg = config(extra='input { name: "R" data_type: TYPE_FP32 dims: [ 2, -1, 3 ] reshape { shape: [ 3, -1, 2 ] } }')
    invalid(cfg, "input[2].reshape", "different element counts")


def test_reshape_runs_between_wildcards_compare_pairwise() -> None:
    # Same -1 count and same fixed product (4), but the runs [1, 4] and [2, 2] differ: Triton rejects.
    cfg = config(extra='input { name: "R" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape { shape: [ 2, -1, 2 ] } }')
    invalid(cfg, "input[2].reshape", "different element counts")


def test_reshape_fixed_against_wildcard() -> None:
    cfg = config(extra='output { name: "R" data_type: TYPE_FP32 dims: [ -1 ] reshape { shape: [ 4 ] } }')
    invalid(cfg, "output[1].reshape", "different element counts")


def test_reshape_dims_positive() -> None:
    cfg = config(extra='input { name: "R" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 0 ] } }')
    invalid(cfg, "input[2].reshape.shape", r"reshape dimension 0 must be an integer >= 1.*\(got 0\)")


def test_empty_reshape_needs_batching() -> None:
    cfg = config(extra='input { name: "R" data_type: TYPE_FP32 dims: [ 1 ] reshape { } }')
    validate(cfg)
    cfg.max_batch_size = 0
    invalid(cfg, "input[2].reshape", "cannot have an empty reshape in a non-batching model")


def test_image_format_needs_three_dims() -> None:
    cfg = config()
    cfg.input[0].format = mc.ModelInput.FORMAT_NCHW
    invalid(cfg, "input[0].format", "format FORMAT_NCHW requires 3 dims")
    cfg.input[0].dims[:] = [3, 224, 224]
    validate(cfg)


def test_shape_tensors_only_for_tensorrt() -> None:
    cfg = config()
    cfg.input[0].is_shape_tensor = True
    invalid(cfg, "input[0].is_shape_tensor", "only supported for TensorRT")
    cfg.platform, cfg.backend = "tensorrt_plan", "tensorrt"
    validate(cfg)


def test_non_linear_format_only_for_tensorrt() -> None:
    cfg = config()
    cfg.output[0].is_non_linear_format_io = True
    invalid(cfg, "output[0].is_non_linear_format_io", "only supported for TensorRT")


# -- PyTorch naming -------------------------------------------------------------


def test_pytorch_outputs_follow_the_convention() -> None:
    cfg = config(TORCH)
    cfg.output[0].name = "logits"
    invalid(cfg, "output[0].name", r"PyTorch output 'logits' must be named '<name>__<index>'")


def test_pytorch_output_indices_unique() -> None:
    cfg = config(TORCH, 'output { name: "OTHER__0" data_type: TYPE_FP32 dims: [ 1 ] }')
    invalid(cfg, "output[1].name", "share index 0")


def test_pytorch_inputs_all_or_none() -> None:
    cfg = config(TORCH)
    cfg.input[1].name = "x"
    invalid(cfg, "input[1].name", r"'x' does not follow the convention but 'INPUT__0' does")
    cfg.input[0].name = "y"
    validate(cfg)  # none follow: matched by forward() argument names


def test_pytorch_input_indices_unique() -> None:
    cfg = config(TORCH)
    cfg.input[1].name = "OTHER__0"
    invalid(cfg, "input[1].name", "share index 0")


def test_naming_convention_only_for_pytorch() -> None:
    cfg = config()
    cfg.output[0].name = "logits"
    validate(cfg)


# -- batch inputs / outputs -----------------------------------------------------


def test_batch_input_source_must_exist() -> None:
    cfg = config(
        extra='batch_input { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_INT32 source_input: "NOPE" }'
    )
    invalid(cfg, "batch_input[0].source_input", "unknown source input name 'NOPE'")


def test_batch_input_data_type() -> None:
    cfg = config(
        extra='batch_input { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_INT64 source_input: "IN0" }'
    )
    invalid(cfg, "batch_input[0].data_type", "TYPE_INT32 or TYPE_FP32")


def test_batch_output_target_must_exist() -> None:
    cfg = config(extra='batch_output { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "X" source_input: "IN0" }')
    invalid(cfg, "batch_output[0].target_name", "unknown target output name 'X'")


# -- ensembles --------------------------------------------------------------------


def test_ensemble_needs_scheduling() -> None:
    cfg = config(ENSEMBLE)
    cfg.ClearField("ensemble_scheduling")
    invalid(cfg, "ensemble_scheduling", "must specify 'ensemble_scheduling'")


def test_ensemble_needs_steps() -> None:
    cfg = config(ENSEMBLE)
    del cfg.ensemble_scheduling.step[:]
    invalid(cfg, "ensemble_scheduling.step", "at least one 'step'")


def test_ensemble_step_needs_model_name() -> None:
    cfg = config(ENSEMBLE)
    cfg.ensemble_scheduling.step[1].model_name = ""
    invalid(cfg, "ensemble_scheduling.step[1].model_name", "must specify 'model_name'")


def test_ensemble_step_needs_maps() -> None:
    cfg = config(ENSEMBLE)
    cfg.ensemble_scheduling.step[0].ClearField("output_map")
    invalid(cfg, "ensemble_scheduling.step[0].output_map", "step 'pre' must specify 'output_map'")


def test_ensemble_scheduling_only_for_ensembles() -> None:
    cfg = config(ENSEMBLE)
    cfg.platform = "onnxruntime_onnx"
    invalid(cfg, "ensemble_scheduling", "only an ensemble")


def test_ensemble_input_must_be_used() -> None:
    cfg = config(ENSEMBLE, 'input { name: "EXTRA" data_type: TYPE_FP32 dims: [ 1 ] }')
    invalid(cfg, "input[1].name", "ensemble input 'EXTRA' is not used")


def test_ensemble_output_must_be_written() -> None:
    cfg = config(ENSEMBLE, 'output { name: "NEVER" data_type: TYPE_FP32 dims: [ 1 ] }')
    invalid(cfg, "output[1].name", "ensemble output 'NEVER' is not written")


def test_ensemble_output_must_be_connected() -> None:
    cfg = config(ENSEMBLE)
    cfg.ensemble_scheduling.step[1].input_map["IN"] = "dangling"
    message = invalid(cfg, "output[0].name", "ensemble output 'RESULT' is never computed")
    assert "'dangling'" in message


def test_ensemble_tensor_written_twice() -> None:
    cfg = config(ENSEMBLE)
    cfg.ensemble_scheduling.step[1].output_map["OUT"] = "mid"
    invalid(cfg, "ensemble_scheduling.step[1].output_map", "'mid' is written by more than one")


def test_ensemble_unused_intermediate() -> None:
    cfg = config(ENSEMBLE)
    cfg.ensemble_scheduling.step[0].output_map["AUX"] = "unused"
    invalid(cfg, "ensemble_scheduling.step", "ensemble tensor 'unused' is unused")


def test_ensemble_rejects_instance_groups() -> None:
    invalid(config(ENSEMBLE, "instance_group { kind: KIND_CPU }"), "instance_group", "not be specified for an ensemble")


# -- scheduling -------------------------------------------------------------------


def test_preferred_batch_size_positive() -> None:
    invalid(
        config(extra="dynamic_batching { preferred_batch_size: [ 0 ] }"),
        "dynamic_batching.preferred_batch_size",
        "preferred batch size 0 must be >= 1",
    )


def test_preferred_batch_size_within_max() -> None:
    invalid(
        config(extra="dynamic_batching { preferred_batch_size: [ 4, 16 ] }"),
        "dynamic_batching.preferred_batch_size",
        r"preferred batch size 16 must be <= max_batch_size \(8\)",
    )


def test_dynamic_batching_without_batching_is_allowed() -> None:
    # Triton accepts it: no batches are formed, the queue settings still apply.
    cfg = config(extra="dynamic_batching { max_queue_delay_microseconds: 100 }")
    cfg.max_batch_size = 0
    validate(cfg)
    cfg.dynamic_batching.preferred_batch_size.append(1)
    invalid(cfg, "dynamic_batching.preferred_batch_size", r"<= max_batch_size \(0\)")


def test_default_priority_level_in_range() -> None:
    invalid(
        config(extra="dynamic_batching { priority_levels: 2 }"),
        "dynamic_batching.default_priority_level",
        r"must be in range \[1, 2\] \(got 0\)",
    )
    validate(config(extra="dynamic_batching { priority_levels: 2 default_priority_level: 2 }"))


def test_priority_queue_policy_level_in_range() -> None:
    cfg = config(
        extra="dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 3 value { max_queue_size: 1 } } }"
    )
    invalid(cfg, "dynamic_batching.priority_queue_policy", "priority level 3 must be in range")


def test_preserve_ordering_conflicts() -> None:
    invalid(
        config(extra="dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }"),
        "dynamic_batching.preserve_ordering",
        "only one priority level",
    )
    invalid(
        config(
            extra="dynamic_batching { preserve_ordering: true "
            "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 10 } }"
        ),
        "dynamic_batching.default_queue_policy.timeout_action",
        "cannot have timeout action DELAY",
    )


SEQUENCE = """
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }
}
"""


def test_valid_sequence_batching() -> None:
    validate(config(extra=SEQUENCE))


def test_sequence_control_needs_two_values() -> None:
    cfg = config(extra=SEQUENCE)
    cfg.sequence_batching.control_input[0].control[0].int32_false_true.append(2)
    invalid(cfg, "sequence_batching.control_input[0].control[0].int32_false_true", "exactly 2 entries")


def test_sequence_control_needs_one_kind_of_value() -> None:
    cfg = config(extra=SEQUENCE)
    cfg.sequence_batching.control_input[0].control[0].fp32_false_true.extend([0.0, 1.0])
    invalid(cfg, "sequence_batching.control_input[0].control[0]", "exactly one of")


def test_sequence_corrid_data_type() -> None:
    cfg = config(extra=SEQUENCE)
    cfg.sequence_batching.control_input[1].control[0].data_type = mc.TYPE_FP32
    invalid(cfg, "sequence_batching.control_input[1].control[0].data_type", "got TYPE_FP32")


def test_sequence_control_kind_once() -> None:
    cfg = config(extra=SEQUENCE)
    cfg.sequence_batching.control_input[1].control.add(
        kind=mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START, int32_false_true=[0, 1]
    )
    invalid(cfg, "sequence_batching.control_input[1].control[1].kind", "CONTROL_SEQUENCE_START is given for both")


def test_sequence_oldest_preferred_within_max() -> None:
    cfg = config(extra=SEQUENCE)
    cfg.sequence_batching.oldest.preferred_batch_size[0] = 9
    invalid(cfg, "sequence_batching.oldest.preferred_batch_size", "must be <= max_batch_size")


def test_sequence_state_names() -> None:
    cfg = config(extra='sequence_batching { state { output_name: "o" data_type: TYPE_FP32 dims: [ 1 ] } }')
    invalid(cfg, "sequence_batching.state[0].input_name", "must specify 'input_name'")


# -- instance groups -----------------------------------------------------------------


def test_instance_count_non_negative() -> None:
    invalid(config(extra="instance_group { count: -1 }"), "instance_group[0].count", "must be >= 0")
    validate(config(extra="instance_group { count: 0 kind: KIND_CPU }"))


def test_gpus_on_cpu_group() -> None:
    invalid(
        config(extra="instance_group [ { kind: KIND_GPU gpus: [ 0 ] }, { kind: KIND_CPU gpus: [ 0 ] } ]"),
        "instance_group[1].gpus",
        "kind KIND_CPU must not list 'gpus'",
    )


def test_gpus_on_model_group() -> None:
    invalid(
        config(extra="instance_group { kind: KIND_MODEL gpus: [ 1 ] }"),
        "instance_group[0].gpus",
        "kind KIND_MODEL must not list 'gpus'",
    )


def test_gpu_ids_non_negative() -> None:
    invalid(config(extra="instance_group { kind: KIND_GPU gpus: [ -1 ] }"), "instance_group[0].gpus", "got -1")


def test_profiles_only_for_tensorrt() -> None:
    invalid(config(extra='instance_group { profile: "0" }'), "instance_group[0].profile", "only supported for TensorRT")


# -- the rest --------------------------------------------------------------------------


def test_warmup_batch_size_within_max() -> None:
    invalid(config(extra="model_warmup { name: 'w' batch_size: 9 }"), "model_warmup[0].batch_size", "got 9")
    cfg = config(extra="model_warmup { name: 'w' batch_size: 2 }")
    cfg.max_batch_size = 0
    invalid(cfg, "model_warmup[0].batch_size", "must be 1 for a model that does not batch")


def test_default_model_filename_is_a_plain_name() -> None:
    for bad in ("../model.onnx", "sub/model.onnx", ".."):
        cfg = config()
        cfg.default_model_filename = bad
        invalid(cfg, "default_model_filename", "plain file name")
    cfg = config()
    cfg.default_model_filename = "my_model.onnx"
    validate(cfg)


def test_response_cache_with_decoupled() -> None:
    invalid(
        config(extra="model_transaction_policy { decoupled: true } response_cache { enable: true }"),
        "response_cache.enable",
        "does not support decoupled",
    )


def test_backend_only_config_is_judged_as_its_platform() -> None:
    cfg = config(TORCH)
    cfg.ClearField("platform")
    cfg.backend = "pytorch"
    cfg.output[0].name = "logits"
    invalid(cfg, "output[0].name", "PyTorch output 'logits'")
    assert cfg.platform == ""  # not modified
