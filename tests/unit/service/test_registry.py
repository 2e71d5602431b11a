"""ModelRegistry: the pure plan/apply steps that follow the model manager's ServingState (added, reloaded,
updated, retired, failed, revision), ensemble readiness, and resolution with Triton's messages."""

from __future__ import annotations

import re

import pytest
from google.protobuf import text_format

from serve_app.errors import InvalidArgument, NotFound, Unavailable
from serve_app.keys import ModelKey
from serve_app.protos import model_config_pb2 as mc
from serve_app.service.registry import (
    FailedModel,
    ModelRegistry,
    ModelState,
    RegistryChanges,
    ServedModel,
    ensemble_readiness,
)
from serve_app.service.serving_state import DeploymentRef, ServedVersion, ServingState

REF = DeploymentRef("app--m.v1.g0--1", "m.v1.g0", 2)


def config(name: str = "m") -> mc.ModelConfig:
    return text_format.Parse(
        f"""
        name: "{name}"
        max_batch_size: 8
        input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }}]
        output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }}]
        """,
        mc.ModelConfig(),
    )


def ensemble(name: str = "e", step: str = "m", step_version: int = -1) -> mc.ModelConfig:
    return text_format.Parse(
        f"""
        name: "{name}"
        platform: "ensemble"
        max_batch_size: 8
        input [{{ name: "IN" data_type: TYPE_FP32 dims: [2] }}]
        output [{{ name: "OUT" data_type: TYPE_FP32 dims: [2] }}]
        ensemble_scheduling {{ step [{{
          model_name: "{step}" model_version: {step_version}
          input_map {{ key: "INPUT0" value: "IN" }} output_map {{ key: "OUTPUT0" value: "OUT" }}
        }}] }}
        """,
        mc.ModelConfig(),
    )


def served(
    name: str = "m",
    version: int = 1,
    *,
    generation: int = 1,
    state: str = "READY",
    reason: str = "",
    cfg: mc.ModelConfig | None = None,
) -> ServedVersion:
    cfg = cfg if cfg is not None else config(name)
    refs = () if cfg.platform == "ensemble" else (REF,)
    return ServedVersion(name, version, cfg.SerializeToString(), refs, (), generation, state, reason)


def applied(registry: ModelRegistry, state: ServingState) -> RegistryChanges:
    changes = registry.plan(state)
    registry.apply(changes)
    return changes


def keys(models: list[ServedModel]) -> list[ModelKey]:
    return [m.key for m in models]


# -- plan / apply ------------------------------------------------------------------------------
def test_plan_lists_new_versions_with_their_deployments_and_changes_nothing() -> None:
    registry = ModelRegistry()
    changes = registry.plan(ServingState(3, (served(version=1), served(version=2))))
    assert [(m.key, refs) for m, refs in changes.added] == [
        (ModelKey("m", 1, 1), (REF,)),
        (ModelKey("m", 2, 1), (REF,)),
    ]
    assert changes.retired == [] and changes.updated == [] and changes.revision == 3
    assert registry.names() == [] and registry.revision == -1


def test_apply_serves_the_added_versions_and_takes_the_revision() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(3, (served(version=1), served(version=2))))
    assert registry.revision == 3
    assert keys(registry.versions("m")) == [ModelKey("m", 1, 1), ModelKey("m", 2, 1)]
    assert registry.resolve("m").version == 2


def test_reload_retires_the_old_generation_and_serves_the_new() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(1, (served(generation=1),)))
    old = registry.resolve("m")
    changes = applied(registry, ServingState(2, (served(generation=2),)))
    assert changes.retired == [old] and keys([m for m, _ in changes.added]) == [ModelKey("m", 1, 2)]
    assert changes.updated == []
    assert keys(registry.versions("m")) == [ModelKey("m", 1, 2)]


def test_same_generation_with_a_new_state_is_updated_in_place_and_not_retired() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(1, (served(state="LOADING"),)))
    model = registry.resolve("m")
    changes = applied(registry, ServingState(2, (served(state="UNAVAILABLE", reason="instances died"),)))
    assert changes.added == [] and changes.retired == []
    assert changes.updated == [(model, ModelState.UNAVAILABLE, "instances died")]
    assert registry.resolve("m") is model
    assert (model.state, model.reason) == (ModelState.UNAVAILABLE, "instances died")


def test_update_keeps_the_versions_scheduler() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(1, (served(state="LOADING"),)))
    sentinel = object()
    registry.resolve("m").scheduler = sentinel  # type: ignore[assignment]
    applied(registry, ServingState(2, (served(state="READY"),)))
    assert registry.resolve("m").scheduler is sentinel


def test_versions_no_longer_served_are_retired_and_dropped() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(1, (served(version=1), served(version=2), served("other"))))
    v1 = registry.resolve("m", "1")
    other = registry.resolve("other")
    changes = applied(registry, ServingState(2, (served(version=2),)))
    assert changes.retired == [v1, other]
    assert keys(registry.versions("m")) == [ModelKey("m", 2, 1)]
    assert registry.names() == ["m"]


def test_failed_model_with_nothing_served_is_listed_with_its_reason() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(1, (served(),), failed=(("broken", "bad config"),)))
    assert registry.names() == ["broken", "m"]
    assert registry.failed("broken") == FailedModel("broken", "bad config")
    assert registry.versions("broken") == []


def test_failed_reload_of_a_served_model_is_not_listed_as_failed() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(1, (served(),), failed=(("m", "reload failed"),)))
    assert registry.failed("m") is None
    assert registry.resolve("m").state is ModelState.READY


def test_unloaded_model_becomes_failed_and_a_later_load_clears_it() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(1, (served(),)))
    applied(registry, ServingState(2, (), failed=(("m", "unloaded"),)))
    assert registry.versions("m") == [] and registry.failed("m") == FailedModel("m", "unloaded")
    applied(registry, ServingState(3, (served(generation=2),)))
    assert registry.failed("m") is None and registry.resolve("m").key.generation == 2


def test_a_failure_the_manager_no_longer_reports_is_forgotten() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(1, (), failed=(("broken", "bad config"),)))
    applied(registry, ServingState(2, ()))
    assert registry.failed("broken") is None and registry.names() == []


def test_revision_is_the_last_applied_one() -> None:
    registry = ModelRegistry()
    changes = registry.plan(ServingState(41, (served(),)))
    assert registry.revision == -1
    registry.apply(changes)
    assert registry.revision == 41
    registry.apply(registry.plan(ServingState(42, (served(),))))
    assert registry.revision == 42


def test_from_served_keeps_labels_generation_state_and_reason() -> None:
    sv = ServedVersion("m", 3, config().SerializeToString(), (REF,), (("OUTPUT0", ("a", "b")),), 9, "LOADING", "why")
    model = ServedModel.from_served(sv)
    assert model.key == ModelKey("m", 3, 9) and model.labels == {"OUTPUT0": ("a", "b")}
    assert (model.state, model.reason) == (ModelState.LOADING, "why")
    assert not model.is_ensemble and not model.is_sequence
    assert model.signature.name == "m"


# -- ensemble readiness ---------------------------------------------------------------------
def test_ensemble_is_unavailable_while_its_step_is_not_ready() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(1, (served(state="LOADING"), served("e", cfg=ensemble()))))
    e = registry.resolve("e")
    assert (e.state, e.reason) == (ModelState.UNAVAILABLE, "composing model 'm' is not ready")


def test_ensemble_becomes_ready_with_its_step() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(1, (served(state="LOADING"), served("e", cfg=ensemble()))))
    applied(registry, ServingState(2, (served(state="READY"), served("e", cfg=ensemble()))))
    assert (registry.resolve("e").state, registry.resolve("e").reason) == (ModelState.READY, "")


def test_ensemble_whose_step_is_missing_is_unavailable() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(1, (served("e", cfg=ensemble(step="missing")),)))
    assert registry.resolve("e").reason == "composing model 'missing' is not ready"


def test_ensemble_step_version_must_be_served() -> None:
    registry = ModelRegistry()
    applied(registry, ServingState(1, (served(version=1), served("e", cfg=ensemble(step_version=2)))))
    assert registry.resolve("e").state is ModelState.UNAVAILABLE
    applied(registry, ServingState(2, (served(version=2), served("e", cfg=ensemble(step_version=2)))))
    assert registry.resolve("e").state is ModelState.READY


def test_unavailability_propagates_through_nested_ensembles() -> None:
    registry = ModelRegistry()
    outer = ensemble("outer", step="inner")
    inner = ensemble("inner", step="m")
    for model in (ServedModel.create("outer", 1, outer), ServedModel.create("inner", 1, inner)):
        registry.add(model)
    registry.add(ServedModel.create("m", 1, config(), state=ModelState.LOADING))
    ensemble_readiness(registry)
    assert registry.resolve("inner").reason == "composing model 'm' is not ready"
    assert registry.resolve("outer").reason == "composing model 'inner' is not ready"


def test_an_ensemble_with_a_decoupled_step_is_decoupled_and_so_are_those_including_it() -> None:
    registry = ModelRegistry()
    step = config()
    step.model_transaction_policy.decoupled = True
    registry.add(ServedModel.create("m", 1, step))
    registry.add(ServedModel.create("other", 1, config("other")))
    registry.add(ServedModel.create("outer", 1, ensemble("outer", step="inner")))
    registry.add(ServedModel.create("inner", 1, ensemble("inner", step="m")))
    plain = ensemble("plain", step="other")
    plain.model_transaction_policy.decoupled = True  # Triton sets it from the steps, whatever the config says
    registry.add(ServedModel.create("plain", 1, plain))
    ensemble_readiness(registry)
    assert registry.resolve("inner").is_decoupled and registry.resolve("outer").is_decoupled
    assert not registry.resolve("plain").is_decoupled


# -- resolution -------------------------------------------------------------------------------
@pytest.fixture
def registry() -> ModelRegistry:
    registry = ModelRegistry()
    applied(
        registry,
        ServingState(
            1,
            (served(version=1), served(version=3), served("slow", state="LOADING")),
            failed=(("broken", "bad config"),),
        ),
    )
    return registry


def test_empty_version_is_the_newest(registry: ModelRegistry) -> None:
    assert registry.resolve("m").version == 3 and registry.resolve("m", "1").version == 1


def test_unknown_model_is_not_found(registry: ModelRegistry) -> None:
    with pytest.raises(NotFound, match=r"^Request for unknown model: 'x' is not found$"):
        registry.resolve("x")


def test_failed_model_is_unavailable_with_its_reason(registry: ModelRegistry) -> None:
    with pytest.raises(
        Unavailable, match=r"^Request for unknown model: 'broken' has no available versions: bad config$"
    ):
        registry.resolve("broken", "1")


def test_unparsable_version_is_an_invalid_argument(registry: ModelRegistry) -> None:
    expected = "failed to get model version from specified version string 'v1' (details: stol), version should be"
    with pytest.raises(InvalidArgument, match=re.escape(expected)):
        registry.resolve("m", "v1")


def test_version_not_served_is_not_found(registry: ModelRegistry) -> None:
    with pytest.raises(NotFound, match=r"^Request for unknown model: 'm' version 2 is not found$"):
        registry.resolve("m", "2")


def test_resolve_ready_refuses_a_version_not_ready(registry: ModelRegistry) -> None:
    assert registry.resolve("slow").state is ModelState.LOADING
    with pytest.raises(Unavailable, match=r"^Request for unknown model: 'slow' version 1 is not at ready state$"):
        registry.resolve_ready("slow")
    assert registry.resolve_ready("m", "1").version == 1


def test_remove_of_the_last_version_drops_the_model(registry: ModelRegistry) -> None:
    assert registry.remove("slow", 1) is not None
    assert registry.remove("slow", 1) is None and registry.remove("nope", 1) is None
    assert registry.names() == ["broken", "m"]
