"""ModelControl under load on demand: what a request for a model not loaded needs, and the plain load it gets."""

from __future__ import annotations

from pathlib import Path

from serve_app.repository import ModelRepository
from serve_app.repository.model_control import ControlMode, Demand, ModelControl, PollChanges
from tests.unit.repository.test_model_control import add_model, deploy, load, root, touch

__all__ = ["root"]  # the fixture


def on_demand(root: Path, mode: ControlMode = ControlMode.EXPLICIT, startup: tuple[str, ...] = ()) -> ModelControl:
    return ModelControl(ModelRepository(root), mode, startup, on_demand=True)


def test_a_request_for_a_model_not_loaded_loads_it(root: Path) -> None:
    ctl = on_demand(root)
    assert ctl.demand("a") is Demand.LOAD
    deploy(ctl, ctl.prepare_demand("a"))
    assert ctl.demand("a") is Demand.SERVES
    assert not ctl.is_explicit("a")  # loaded for a request: not the operator's


def test_a_name_the_repository_lacks_is_unknown(root: Path) -> None:
    ctl = on_demand(root)
    assert ctl.demand("nope") is Demand.UNKNOWN
    assert ctl.demand("../a") is Demand.UNKNOWN
    assert ctl.demand(".hidden") is Demand.UNKNOWN


def test_a_failed_load_answers_until_its_directory_changes(root: Path) -> None:
    ctl = on_demand(root)
    ctl.prepare_demand("a")
    ctl.load_failed("a", "boom")
    assert ctl.demand("a") is Demand.FAILED
    assert ctl.failure("a") == "boom"
    touch(root / "a" / "config.pbtxt")
    assert ctl.demand("a") is Demand.LOAD


def test_an_ensemble_brings_its_steps_and_the_users_are_known(root: Path) -> None:
    ctl = on_demand(root)
    plan = ctl.prepare_demand("ens")
    assert list(plan.sources) == ["a", "b", "ens"]
    deploy(ctl, plan)
    assert ctl.users() == {"a": ["ens"], "b": ["ens"]}
    assert ctl.unload_plan("a") == ["ens", "a"]


def test_the_operator_load_pins_a_model_loaded_on_demand(root: Path) -> None:
    ctl = on_demand(root)
    deploy(ctl, ctl.prepare_demand("a"))
    load(ctl, "a")  # unchanged: nothing to deploy, but now asked for
    assert ctl.is_explicit("a")


def test_poll_mode_starts_with_nothing_and_polls_only_what_is_loaded(root: Path) -> None:
    ctl = on_demand(root, ControlMode.POLL)
    assert ctl.startup() == []
    add_model(root, "new")
    assert ctl.poll() == PollChanges(added=[], removed=[], changed=[])
    deploy(ctl, ctl.prepare_demand("other"))
    touch(root / "other" / "config.pbtxt")
    touch(root / "b" / "config.pbtxt")
    assert ctl.poll() == PollChanges(added=[], removed=[], changed=["other"])


def test_explicit_mode_still_starts_the_load_model_names(root: Path) -> None:
    assert on_demand(root, startup=("b",)).startup() == ["b"]
