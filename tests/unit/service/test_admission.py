"""admit: which models of a load may be deployed (both servers), and why the others fail, before any instance."""

from __future__ import annotations

import pathlib

import pytest

from scripts import example_models
from serve_app.errors import InvalidArgument
from serve_app.repository import ModelRepository, ModelSource
from serve_app.service.admission import admit

DIMS = 4
LIMITED = 'instance_group [ { kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 3 } ] } } ]'


@pytest.fixture
def repo(tmp_path: pathlib.Path) -> pathlib.Path:
    example_models.add_sub(tmp_path, dims=DIMS)
    example_models.add_sub(tmp_path, name="limited", dims=DIMS, extra_config=LIMITED)
    example_models.add_sub_ensemble(tmp_path, name="ens", dims=DIMS)
    example_models.add_sub_ensemble(tmp_path, name="broken_ens", step_model="missing", dims=DIMS)
    return tmp_path


def sources(repo: pathlib.Path, *names: str) -> dict[str, ModelSource]:
    return {n: ModelRepository(repo).load(n) for n in names}


def test_an_ensemble_fails_without_its_steps_and_passes_over_a_step_already_loaded(repo: pathlib.Path) -> None:
    out = admit(sources(repo, "ens", "broken_ens"), {}, None)
    assert list(out.admitted) == [] and set(out.failures) == {"ens", "broken_ens"}
    assert "'missing'" in out.failures["broken_ens"]
    out = admit(sources(repo, "ens"), sources(repo, "add_sub"), None)
    assert list(out.admitted) == ["ens"] and out.failures == {} and out.scaling == {"ens": None}


def test_a_model_needing_more_of_a_resource_than_declared_fails_with_tritons_message(repo: pathlib.Path) -> None:
    out = admit(sources(repo, "limited", "add_sub"), {}, {"R": 2})
    assert list(out.admitted) == ["add_sub"]
    assert out.failures == {
        "limited": "model 'limited': Resource count for \"R\" is limited to 2 which will prevent scheduling of one "
        "or more model instances, the minimum required count is 3"
    }
    assert list(admit(sources(repo, "limited"), {}, None).admitted) == ["limited"]  # the rate limiter is off


def test_autoscaling_settings_are_read_per_model_and_a_wrong_one_fails_only_its_model(repo: pathlib.Path) -> None:
    def scaling(name: str, source: ModelSource) -> object:
        if name == "limited":
            raise InvalidArgument("autoscaling.max_replicas must be at least 1, got 0")
        return f"spec of {source.name}"

    out = admit(sources(repo, "add_sub", "limited"), {}, None, scaling)
    assert out.scaling == {"add_sub": "spec of add_sub"}
    assert out.failures == {"limited": "autoscaling.max_replicas must be at least 1, got 0"}
