"""Cross-model checks of ensembles: step models served, tensors typed and shaped alike, no cycles."""

from __future__ import annotations

from google.protobuf import text_format

from serve_app.config.ensemble_deps import composing_models, ensemble_problems, load_waves
from serve_app.protos import model_config_pb2 as mc

ADD_SUB = """
name: "add_sub" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def ensemble(name: str = "ens", step: str = "add_sub", version: int = -1, in_type: str = "TYPE_FP32",
             mbs: int = 8, dims: int = 16, out_key: str = "OUTPUT0") -> str:  # fmt: skip
    return f"""
name: "{name}" platform: "ensemble" max_batch_size: {mbs}
input [ {{ name: "A" data_type: {in_type} dims: [ {dims} ] }}, {{ name: "B" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "S" data_type: TYPE_FP32 dims: [ 16 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: {version}
  input_map {{ key: "INPUT0" value: "A" }} input_map {{ key: "INPUT1" value: "B" }}
  output_map {{ key: "{out_key}" value: "S" }} }} ] }}
"""


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def problems(*texts: str, served: dict[str, set[int]] | None = None) -> dict[str, str]:
    configs = {c.name: c for c in map(parse, texts)}
    return ensemble_problems(configs, served or {n: {1} for n in configs})


def test_valid_ensemble_has_no_problem() -> None:
    assert problems(ADD_SUB, ensemble()) == {}
    assert composing_models(parse(ensemble())) == ["add_sub"]


def test_missing_step_model() -> None:
    assert "model 'nope' is not available" in problems(ADD_SUB, ensemble(step="nope"))["ens"]


def test_step_version_not_served() -> None:
    assert "version 3 is not available" in problems(ADD_SUB, ensemble(version=3))["ens"]
    assert problems(ADD_SUB, ensemble(version=1)) == {}


def test_unknown_step_output() -> None:
    assert "has no output 'OUTPUT9'" in problems(ADD_SUB, ensemble(out_key="OUTPUT9"))["ens"]


def test_datatype_mismatch() -> None:
    reason = problems(ADD_SUB, ensemble(in_type="TYPE_INT32"))["ens"]
    assert "tensor 'A' is TYPE_INT32" in reason and "is TYPE_FP32" in reason


def test_shape_mismatch() -> None:
    assert "has shape [-1, 8]" in problems(ADD_SUB, ensemble(dims=8))["ens"]


def test_ensemble_batch_larger_than_step() -> None:
    assert "max_batch_size 8, smaller than the ensemble's 16" in problems(ADD_SUB, ensemble(mbs=16))["ens"]


def test_failure_propagates_to_ensembles_of_ensembles() -> None:
    outer = ensemble(name="outer", step="ens").replace('"INPUT0"', '"A"').replace('"INPUT1"', '"B"')
    outer = outer.replace('key: "OUTPUT0"', 'key: "S"')
    assert problems(ADD_SUB, ensemble(), outer) == {}
    found = problems(ADD_SUB, ensemble(step="nope"), outer)
    assert "step model 'ens' is not available" in found["outer"]


def test_cycle_between_ensembles() -> None:
    a = (
        ensemble(name="ea", step="eb")
        .replace('"INPUT0"', '"A"')
        .replace('"INPUT1"', '"B"')
        .replace('key: "OUTPUT0"', 'key: "S"')
    )
    b = (
        ensemble(name="eb", step="ea")
        .replace('"INPUT0"', '"A"')
        .replace('"INPUT1"', '"B"')
        .replace('key: "OUTPUT0"', 'key: "S"')
    )
    found = problems(a, b)
    assert set(found) == {"ea", "eb"}
    assert any("cycle" in reason for reason in found.values())


def _ensemble(*steps: str) -> mc.ModelConfig:
    text = (
        'platform: "ensemble" ensemble_scheduling { '
        + " ".join(f'step {{ model_name: "{s}" model_version: -1 }}' for s in steps)
        + " }"
    )
    return text_format.Parse(text, mc.ModelConfig())


def test_load_waves_hold_at_most_size_models_and_put_ensembles_after_their_steps() -> None:
    plain = mc.ModelConfig()
    models = {"z_model": plain, "a_ens": _ensemble("z_model", "b_ens"), "b_ens": _ensemble("m_model"), "m_model": plain}
    assert load_waves(models, 0) == [["m_model", "z_model", "b_ens", "a_ens"]]
    assert load_waves(models, 1) == [["m_model"], ["z_model"], ["b_ens"], ["a_ens"]]
    assert load_waves(models, 3) == [["m_model", "z_model", "b_ens"], ["a_ens"]]
    assert load_waves({}, 2) == []


def test_load_waves_survive_an_ensemble_cycle() -> None:
    models = {"a": _ensemble("b"), "b": _ensemble("a")}
    assert sorted(load_waves(models, 1)) == [["a"], ["b"]]  # the cycle is refused later, by ensemble_problems


DECOUPLED = """
name: "dec" backend: "python" max_batch_size: 8 model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def after_decoupled(name: str, second_input: str) -> str:
    """``dec`` on A, then add_sub on dec's output and ``second_input``."""
    return f"""
name: "{name}" platform: "ensemble" max_batch_size: 8
input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 16 ] }}, {{ name: "B" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "S" data_type: TYPE_FP32 dims: [ 16 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "dec" model_version: -1 input_map {{ key: "IN" value: "A" }} output_map {{ key: "OUT" value: "x" }} }},
  {{ model_name: "dec" model_version: -1 input_map {{ key: "IN" value: "B" }} output_map {{ key: "OUT" value: "y" }} }},
  {{ model_name: "add_sub" model_version: -1 input_map {{ key: "INPUT0" value: "x" }}
    input_map {{ key: "INPUT1" value: "{second_input}" }} output_map {{ key: "OUTPUT0" value: "S" }} }} ] }}
"""


def test_a_step_reading_the_responses_of_two_decoupled_steps_is_refused_as_triton_refuses_it() -> None:
    mixed = "in ensemble {}, step of model 'add_sub' receives inputs originated from different decoupled models"
    found = problems(ADD_SUB, DECOUPLED, after_decoupled("two", "y"), after_decoupled("with_input", "B"))
    assert found["two"] == mixed.format("two")
    assert found["with_input"] == mixed.format("with_input")  # the request's own tensor is another stream
    assert problems(ADD_SUB, DECOUPLED, after_decoupled("same", "x")) == {}  # both inputs from one stream
