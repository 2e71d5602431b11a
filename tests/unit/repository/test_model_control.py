"""ModelControl: Triton's control modes, load/unload decisions, poll and the repository index.

Models here have complete configs, so loading them never opens the (dummy)
model files: every test is plain file-system work.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from serve_app.errors import (
    ErrorCode,
    InternalError,
    InvalidArgument,
    InvalidConfig,
    NotFound,
    ServeError,
    Unavailable,
)
from serve_app.keys import ModelKey
from serve_app.repository import ModelRepository, ModelSource
from serve_app.repository.api import IndexEntry
from serve_app.repository.model_control import (
    ControlMode,
    LoadPlan,
    ModelControl,
    PollChanges,
    parse_control_mode,
)

NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"


def config_text(name: str, *, max_batch_size: int = 8, dtype: str = "TYPE_FP32", extra: str = "") -> str:
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        f'input [ {{ name: "x" data_type: {dtype} dims: [ 4 ] }} ]\n'
        f'output [ {{ name: "y" data_type: {dtype} dims: [ 4 ] }} ]\n{extra}'
    )


def config_json(name: str = "", *, max_batch_size: int = 8) -> str:
    obj = {
        "backend": "onnxruntime",
        "max_batch_size": max_batch_size,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
    }
    if name:
        obj["name"] = name
    return json.dumps(obj)


def add_model(root: Path, name: str, versions: Sequence[int] = (1,), dtype: str = "TYPE_FP32") -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(config_text(name, dtype=dtype))
    for v in versions:
        (d / str(v)).mkdir(exist_ok=True)
        (d / str(v) / "model.onnx").write_bytes(b"not read: the config is complete")
    return d


def add_ensemble(root: Path, name: str, steps: Sequence[str], ensembles: Sequence[str] = ()) -> Path:
    """IN -> steps[0] -> ... -> steps[-1] -> OUT; each step an x -> y model, or IN -> OUT if in ``ensembles``."""
    d = root / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    parts = []
    for i, step in enumerate(steps):
        src = "IN" if i == 0 else f"t{i - 1}"
        dst = "OUT" if i == len(steps) - 1 else f"t{i}"
        x, y = ("IN", "OUT") if step in ensembles else ("x", "y")
        parts.append(
            f'{{ model_name: "{step}" model_version: -1 input_map {{ key: "{x}" value: "{src}" }} '
            f'output_map {{ key: "{y}" value: "{dst}" }} }}'
        )
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f"ensemble_scheduling {{ step [ {', '.join(parts)} ] }}\n"
    )
    return d


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """a, b: plain models; ens: a then b; other: a model nothing uses."""
    repo = tmp_path / "models"
    add_model(repo, "a")
    add_model(repo, "b")
    add_model(repo, "other")
    add_ensemble(repo, "ens", ["a", "b"])
    return repo


@pytest.fixture
def staging(tmp_path: Path) -> Path:
    return tmp_path / "staging"


def control(
    root: Path, mode: ControlMode = ControlMode.EXPLICIT, startup: Sequence[str] = (), staging: Path | None = None
) -> ModelControl:
    return ModelControl(ModelRepository(root), mode, startup, staging_root=staging)


def deploy(ctl: ModelControl, plan: LoadPlan) -> None:
    """What a manager does when every deployment comes up."""
    for name, source in plan.sources.items():
        ctl.loaded(name, source)
    for name in plan.unload:
        ctl.unloaded(name)


def load(ctl: ModelControl, name: str, config: str | None = None, files: dict[str, bytes] | None = None) -> LoadPlan:
    plan = ctl.prepare_load(name, config, files or {})
    deploy(ctl, plan)
    return plan


def touch(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def rows(
    ctl: ModelControl, ready_only: bool = False, states: Mapping[ModelKey, tuple[str, str]] | None = None
) -> list[tuple[str, str, str, str]]:
    return [(e.name, e.version, e.state, e.reason) for e in ctl.index(ready_only, states or {})]


# -- modes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mode"),
    [("none", ControlMode.NONE), ("POLL", ControlMode.POLL), (" Explicit ", ControlMode.EXPLICIT)],
)
def test_parse_control_mode(text: str, mode: ControlMode) -> None:
    assert parse_control_mode(text) is mode


def test_parse_control_mode_rejects_others() -> None:
    with pytest.raises(InvalidArgument, match="invalid argument for --model-control-mode: 'auto'"):
        parse_control_mode("auto")


@pytest.mark.parametrize("mode", [ControlMode.NONE, ControlMode.POLL])
def test_every_model_loads_at_start_and_load_model_is_ignored(root: Path, mode: ControlMode) -> None:
    ctl = control(root, mode, ["a", "nope", "*"])
    assert ctl.startup() == ["a", "b", "ens", "other"]  # composing models before the ensemble


@pytest.mark.parametrize("mode", [ControlMode.NONE, ControlMode.POLL])
def test_load_and_unload_refused_outside_explicit(root: Path, mode: ControlMode) -> None:
    ctl = control(root, mode)
    for call in (lambda: ctl.prepare_load("a", None, {}), lambda: ctl.prepare_unload("a", False)):
        with pytest.raises(Unavailable) as info:
            call()
        assert str(info.value) == NOT_EXPLICIT
        assert info.value.code is ErrorCode.UNAVAILABLE


@pytest.mark.parametrize("mode", [ControlMode.NONE, ControlMode.EXPLICIT])
def test_poll_only_in_poll_mode(root: Path, mode: ControlMode) -> None:
    with pytest.raises(Unavailable, match="polling is disabled"):
        control(root, mode).poll()


def test_explicit_startup_loads_named_models_and_their_steps(root: Path) -> None:
    assert control(root).startup() == []
    assert control(root, startup=["other"]).startup() == ["other"]
    assert control(root, startup=["ens", "other", "ens"]).startup() == ["a", "b", "ens", "other"]
    assert control(root, startup=["*"]).startup() == ["a", "b", "ens", "other"]


def test_explicit_startup_wildcard_must_be_alone(root: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"Wildcard model name '\*' must be the ONLY startup model"):
        control(root, startup=["*", "a"])


def test_explicit_startup_with_unknown_model_fails(root: Path) -> None:
    with pytest.raises(InternalError, match="failed to load all models") as info:
        control(root, startup=["a", "nope"]).startup()
    assert "failed to poll model 'nope': model not found in any model repository" in str(info.value)


def test_startup_models_are_explicit_their_steps_are_not(root: Path) -> None:
    ctl = control(root, startup=["ens", "a"])
    repo = ctl.repository
    for name in ctl.startup():
        ctl.loaded(name, repo.load(name))
    assert ctl.loaded_names() == ["a", "b", "ens"]
    # 'a' was asked for, 'b' came with the ensemble
    assert ctl.prepare_unload("ens", unload_dependents=True) == ["ens", "b"]


# -- load -------------------------------------------------------------------------------------


def test_load_unknown_model(root: Path) -> None:
    with pytest.raises(InternalError) as info:
        control(root).prepare_load("nope", None, {})
    assert str(info.value) == "failed to load 'nope', failed to poll from model repository"
    assert info.value.code is ErrorCode.INTERNAL


@pytest.mark.parametrize("name", ["", "..", "a/b", "../models/a", "a\x00"])
def test_load_invalid_name(root: Path, name: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid model name"):
        control(root).prepare_load(name, None, {})


def test_plain_load(root: Path) -> None:
    ctl = control(root)
    plan = ctl.prepare_load("a", None, {})
    assert list(plan.sources) == ["a"] and plan.unload == {}
    source = plan.sources["a"]
    assert isinstance(source, ModelSource) and source.directory == root / "a"
    assert ctl.loaded_names() == [] and ctl.source("a") is None  # nothing serves until the manager says so
    ctl.loaded("a", source)
    assert ctl.loaded_names() == ["a"] and ctl.source("a") is source


def test_reload_only_when_the_directory_changed(root: Path) -> None:
    ctl = control(root)
    load(ctl, "a")
    assert ctl.prepare_load("a", None, {}).sources == {}  # Triton: nothing changed, no reload
    (root / "a" / "2").mkdir()
    (root / "a" / "2" / "model.onnx").write_bytes(b"v2")
    plan = load(ctl, "a")
    assert list(plan.sources["a"].versions) == [2]
    assert ctl.prepare_load("a", None, {}).sources == {}
    touch(root / "a" / "2" / "model.onnx")  # a replaced model file
    assert list(ctl.prepare_load("a", None, {}).sources) == ["a"]


def test_config_override_is_completed_and_validated(root: Path) -> None:
    ctl = control(root)
    plan = ctl.prepare_load("a", config_json(max_batch_size=4), {})
    config = plan.sources["a"].config
    assert config.name == "a"  # an override without a name gets the model's
    assert config.max_batch_size == 4
    assert config.platform == "onnxruntime_onnx"  # completed like config.pbtxt
    assert plan.sources["a"].directory == root / "a"


def test_config_override_errors(root: Path) -> None:
    ctl = control(root)
    with pytest.raises(InvalidConfig, match="must match the model directory name 'a' \\(got 'zz'\\)") as info:
        ctl.prepare_load("a", config_json("zz"), {})
    assert str(info.value).startswith("model 'a', file 'config override': name: ")
    with pytest.raises(InvalidConfig, match="max_batch_size: must be >= 0"):
        ctl.prepare_load("a", config_json(max_batch_size=-1), {})
    # JSON that is no model config fails the poll, with Triton's "failed to load" message and the detail
    poll_failed = "failed to load 'a', failed to poll from model repository: model 'a': "
    with pytest.raises(InternalError, match=f"^{poll_failed}config is not valid JSON"):
        ctl.prepare_load("a", "{not json", {})
    with pytest.raises(InternalError, match=f"^{poll_failed}invalid config JSON"):
        ctl.prepare_load("a", '{"bogus": 1}', {})


def test_plain_load_keeps_an_earlier_override(root: Path) -> None:
    ctl = control(root)
    load(ctl, "a", config_json(max_batch_size=4))
    assert ctl.prepare_load("a", None, {}).sources == {}  # the override stays in force
    assert ctl.source("a").config.max_batch_size == 4
    # a load with a new config replaces it
    plan = load(ctl, "a", config_json(max_batch_size=2))
    assert plan.sources["a"].config.max_batch_size == 2
    assert ctl.source("a").config.max_batch_size == 2


def test_changed_directory_drops_the_override(root: Path) -> None:
    """As Triton: once the directory is newer than the override, a plain load reads config.pbtxt again."""
    ctl = control(root)
    load(ctl, "a", config_json(max_batch_size=4))
    touch(root / "a" / "config.pbtxt")
    plan = load(ctl, "a")
    assert plan.sources["a"].config.max_batch_size == 8


def test_override_load_of_a_model_not_in_the_repository(root: Path) -> None:
    with pytest.raises(InternalError, match="failed to load 'nope', failed to poll from model repository"):
        control(root).prepare_load("nope", config_json(), {})


def test_files_need_config(root: Path, staging: Path) -> None:
    with pytest.raises(InternalError) as info:
        control(root, staging=staging).prepare_load("a", None, {"1/model.onnx": b"x"})
    assert str(info.value) == (
        "failed to load 'a', failed to poll from model repository: "
        "Load parameter 'config' must be specified for model file override"
    )
    assert not staging.exists()


def test_files_are_staged_and_loaded_from_there(root: Path, staging: Path) -> None:
    ctl = control(root, staging=staging)
    plan = ctl.prepare_load("a", config_json(), {"3/model.onnx": b"v3", "labels.txt": b"l"})
    source = plan.sources["a"]
    assert source.directory.parent == staging.resolve()
    assert source.versions == {3: source.directory / "3" / "model.onnx"}
    assert (source.directory / "3" / "model.onnx").read_bytes() == b"v3"
    assert not (root / "a" / "3").exists()  # the repository is untouched


def test_files_for_a_model_the_repository_lacks(root: Path, staging: Path) -> None:
    ctl = control(root, staging=staging)
    load(ctl, "fresh", config_json(), {"1/model.onnx": b"v1"})
    assert ctl.loaded_names() == ["fresh"]
    assert "fresh" not in [e.name for e in ctl.index(False, {})]  # Triton's index lists repository directories
    # a plain load of it has no repository directory to poll
    with pytest.raises(InternalError, match="failed to poll from model repository"):
        ctl.prepare_load("fresh", None, {})
    assert ctl.loaded_names() == ["fresh"]


def test_plain_load_after_files_goes_back_to_the_repository(root: Path, staging: Path) -> None:
    ctl = control(root, staging=staging)
    load(ctl, "a")
    staged = load(ctl, "a", config_json(), {"3/model.onnx": b"v3"}).sources["a"].directory
    plan = load(ctl, "a")  # the directory didn't change, yet the staged files are undone
    assert plan.sources["a"].directory == root / "a"
    assert not staged.exists()  # the superseded staged directory is removed


def test_staged_directory_removed_on_unload_and_on_failure(root: Path, staging: Path) -> None:
    ctl = control(root, staging=staging)
    staged = load(ctl, "a", config_json(), {"1/model.onnx": b"x"}).sources["a"].directory
    assert ctl.prepare_unload("a", False) == ["a"]
    ctl.unloaded("a")
    assert not staged.exists()
    plan = ctl.prepare_load("a", config_json(), {"1/model.onnx": b"x"})
    ctl.load_failed("a", "instances did not start")
    assert not plan.sources["a"].directory.exists()
    # a config the staged files don't fit: nothing is left behind either
    with pytest.raises(InvalidConfig, match="no version directories"):
        ctl.prepare_load("a", config_json(), {"model.onnx": b"x"})
    assert list(staging.iterdir()) == []


@pytest.mark.parametrize(
    "path", ["../escape", "/tmp/escape", "1/../../escape", "1\\..\\..\\escape", "1/x\x00", "", "1//m", "./1/m"]
)
def test_staged_paths_cannot_escape(root: Path, staging: Path, tmp_path: Path, path: str) -> None:
    ctl = control(root, staging=staging)
    with pytest.raises(InternalError, match="failed to load 'a', failed to poll from model repository") as info:
        ctl.prepare_load("a", config_json(), {"1/model.onnx": b"ok", path: b"evil"})
    assert "must stay within model directory" in str(info.value)
    assert not (tmp_path / "escape").exists()
    assert not staging.exists() or list(staging.iterdir()) == []
    assert ctl.loaded_names() == []


def test_default_staging_root_is_a_temp_dir(root: Path) -> None:
    ctl = control(root)
    source = ctl.prepare_load("a", config_json(), {"1/model.onnx": b"x"}).sources["a"]
    assert source.directory.parent.name.startswith("serve_app-staging-")
    ctl.load_failed("a", "no")
    assert not source.directory.exists()


def test_failed_reload_keeps_the_model(root: Path) -> None:
    ctl = control(root)
    source = load(ctl, "a").sources["a"]
    (root / "a" / "config.pbtxt").write_text(config_text("a") + "bogus: 1\n")
    with pytest.raises(InvalidConfig, match=r"model 'a', file '.*config.pbtxt': 6:1 : "):
        ctl.prepare_load("a", None, {})
    assert ctl.source("a") is source
    assert rows(ctl) == [
        ("a", "1", "READY", ""),
        ("b", "", "", ""),
        ("ens", "", "", ""),
        ("other", "", "", ""),
    ]
    # a failure reported by the manager (instances didn't start) keeps it too
    (root / "a" / "config.pbtxt").write_text(config_text("a", max_batch_size=4))
    ctl.prepare_load("a", None, {})
    ctl.load_failed("a", "its instances failed to start")
    assert ctl.source("a") is source
    # ... and the next load tries again: the serving version is still the old directory
    assert list(ctl.prepare_load("a", None, {}).sources) == ["a"]


def test_failed_first_load_is_listed_with_its_reason(root: Path) -> None:
    ctl = control(root)
    (root / "b" / "config.pbtxt").write_text("bogus: 1")
    with pytest.raises(InvalidConfig) as info:
        ctl.prepare_load("b", None, {})
    assert ("b", "", "UNAVAILABLE", str(info.value)) in rows(ctl)
    ctl.load_failed("other", "its instances failed to start")
    assert ("other", "", "UNAVAILABLE", "its instances failed to start") in rows(ctl)
    assert rows(ctl, ready_only=True) == []


# -- ensembles ----------------------------------------------------------------------------------


def test_loading_an_ensemble_loads_its_steps_first(root: Path) -> None:
    ctl = control(root)
    plan = load(ctl, "ens")
    assert list(plan.sources) == ["a", "b", "ens"]
    assert ctl.loaded_names() == ["a", "b", "ens"]
    assert ctl.prepare_load("ens", None, {}).sources == {}


def test_loaded_steps_are_not_reloaded(root: Path) -> None:
    ctl = control(root)
    load(ctl, "a")
    assert list(ctl.prepare_load("ens", None, {}).sources) == ["b", "ens"]


def test_changed_step_is_reloaded_with_the_ensemble(root: Path) -> None:
    ctl = control(root)
    load(ctl, "ens")
    touch(root / "b" / "1" / "model.onnx")
    assert list(ctl.prepare_load("ens", None, {}).sources) == ["b", "ens"]


def test_nested_ensembles(root: Path) -> None:
    add_ensemble(root, "outer", ["ens", "other"], ensembles=["ens"])
    ctl = control(root)
    assert list(load(ctl, "outer").sources) == ["a", "b", "ens", "other", "outer"]
    assert ctl.prepare_unload("outer", unload_dependents=True) == ["outer", "ens", "a", "b", "other"]


def test_ensemble_with_a_missing_step(root: Path) -> None:
    add_ensemble(root, "broken", ["a", "ghost"])
    ctl = control(root)
    with pytest.raises(InternalError) as info:
        ctl.prepare_load("broken", None, {})
    assert "failed to load 'broken', failed to poll from model repository" in str(info.value)
    assert "ensemble 'broken' contains models that are not available: ghost" in str(info.value)
    assert ctl.loaded_names() == []


def test_ensemble_with_an_invalid_step(root: Path) -> None:
    (root / "b" / "config.pbtxt").write_text("bogus: 1")
    ctl = control(root)
    with pytest.raises(InvalidConfig) as info:
        ctl.prepare_load("ens", None, {})
    assert "ensemble 'ens' depends on 'b' which is not valid. Model 'b' failed with error: model 'b', file" in str(
        info.value
    )
    listed = {e.name: e for e in ctl.index(False, {})}
    assert listed["b"].state == listed["ens"].state == "UNAVAILABLE"


def test_ensemble_whose_steps_do_not_fit(root: Path) -> None:
    add_model(root, "ints", dtype="TYPE_INT32")
    add_ensemble(root, "mismatch", ["a", "ints"])
    with pytest.raises(InvalidConfig, match=r"model 'mismatch', file '.*config\.pbtxt': ensemble_scheduling\.step"):
        control(root).prepare_load("mismatch", None, {})


def test_reloaded_step_reloads_the_ensembles_using_it(root: Path) -> None:
    ctl = control(root)
    load(ctl, "ens")
    touch(root / "a" / "config.pbtxt")
    plan = ctl.prepare_load("a", None, {})
    assert list(plan.sources) == ["a", "ens"] and plan.unload == {}
    assert plan.sources["ens"] is ctl.source("ens")  # the ensemble as it serves, with the new step
    deploy(ctl, plan)
    assert ctl.prepare_load("a", None, {}).sources == {}


def test_reloaded_step_that_no_longer_fits_unloads_the_ensemble(root: Path) -> None:
    ctl = control(root)
    load(ctl, "ens")
    plan = ctl.prepare_load("a", config_json(max_batch_size=4), {})
    assert list(plan.sources) == ["a"]
    assert "max_batch_size 4, smaller than the ensemble's 8" in plan.unload["ens"]
    deploy(ctl, plan)
    assert ctl.loaded_names() == ["a", "b"]
    assert ("ens", "1", "UNAVAILABLE", "unloaded") in rows(ctl)


# -- unload -----------------------------------------------------------------------------------


def test_unload_unknown_or_not_loaded_is_a_no_op(root: Path) -> None:
    ctl = control(root)
    assert ctl.prepare_unload("nope", False) == []
    assert ctl.prepare_unload("a", True) == []
    assert ctl.prepare_unload("../x", False) == []


def test_unload_ensemble_keeps_its_steps(root: Path) -> None:
    ctl = control(root)
    load(ctl, "ens")
    assert ctl.prepare_unload("ens", unload_dependents=False) == ["ens"]


def test_unload_dependents_releases_steps_loaded_for_the_ensemble(root: Path) -> None:
    ctl = control(root)
    load(ctl, "ens")
    assert ctl.prepare_unload("ens", unload_dependents=True) == ["ens", "a", "b"]


def test_unload_dependents_keeps_explicitly_loaded_steps(root: Path) -> None:
    ctl = control(root)
    load(ctl, "a")
    load(ctl, "ens")  # 'a' stays explicitly loaded although the ensemble polled it again
    assert ctl.prepare_unload("ens", unload_dependents=True) == ["ens", "b"]


def test_unload_dependents_keeps_steps_another_ensemble_uses(root: Path) -> None:
    add_ensemble(root, "ens2", ["b"])
    ctl = control(root)
    load(ctl, "ens")
    load(ctl, "ens2")
    assert ctl.prepare_unload("ens", unload_dependents=True) == ["ens", "a"]


def test_unloading_a_step_takes_its_ensembles_with_it(root: Path) -> None:
    add_ensemble(root, "outer", ["ens"], ensembles=["ens"])
    ctl = control(root)
    load(ctl, "outer")
    assert ctl.prepare_unload("a", unload_dependents=False) == ["outer", "ens", "a"]
    # with unload_dependents, what only those ensembles used goes too (a deliberate extension of Triton's rule)
    assert ctl.prepare_unload("a", unload_dependents=True) == ["outer", "ens", "a", "b"]


def test_unloaded_models_are_listed_unloaded(root: Path) -> None:
    ctl = control(root)
    (root / "a" / "2").mkdir()
    (root / "a" / "2" / "model.onnx").write_bytes(b"v2")
    (root / "a" / "config.pbtxt").write_text(config_text("a", extra="version_policy { all { } }"))
    load(ctl, "ens")
    for name in ctl.prepare_unload("ens", True):
        ctl.unloaded(name)
    assert ctl.loaded_names() == []
    assert rows(ctl) == [
        ("a", "1", "UNAVAILABLE", "unloaded"),
        ("a", "2", "UNAVAILABLE", "unloaded"),
        ("b", "1", "UNAVAILABLE", "unloaded"),
        ("ens", "1", "UNAVAILABLE", "unloaded"),
        ("other", "", "", ""),
    ]
    assert list(load(ctl, "a").sources) == ["a"]  # loads again
    assert rows(ctl, ready_only=True) == [("a", "1", "READY", ""), ("a", "2", "READY", "")]


# -- index ------------------------------------------------------------------------------------


def test_index_of_a_fresh_repository(root: Path) -> None:
    ctl = control(root)
    entries = ctl.index(False, {})
    assert entries == [IndexEntry(n, "", "", "") for n in ("a", "b", "ens", "other")]
    assert ctl.index(True, {}) == []


def test_index_takes_states_from_the_manager(root: Path) -> None:
    ctl = control(root)
    load(ctl, "a")
    load(ctl, "other")
    states = {
        ModelKey("a", 1): ("READY", ""),
        ModelKey("a", 2): ("LOADING", ""),
        ModelKey("b", 1): ("UNLOADING", "going"),
    }
    assert rows(ctl, states=states) == [
        ("a", "1", "READY", ""),
        ("a", "2", "LOADING", ""),
        ("b", "1", "UNLOADING", "going"),
        ("ens", "", "", ""),
        ("other", "1", "READY", ""),  # nothing said about it: what was reported
    ]
    assert rows(ctl, ready_only=True, states=states) == [("a", "1", "READY", ""), ("other", "1", "READY", "")]
    ghost = {ModelKey("ghost", 1): ("READY", "")}
    assert rows(ctl, states=ghost)[0] == ("a", "1", "READY", "")  # not a directory: unlisted


# -- poll -------------------------------------------------------------------------------------


def started(root: Path) -> ModelControl:
    """A poll-mode control after a start where every model loaded."""
    ctl = control(root, ControlMode.POLL)
    repo = ctl.repository
    for name in ctl.startup():
        ctl.loaded(name, repo.load(name))
    return ctl


def test_poll_sees_nothing_when_nothing_changed(root: Path) -> None:
    ctl = started(root)
    assert ctl.poll() == PollChanges(added=[], removed=[], changed=[])


def test_poll_added_and_removed(root: Path) -> None:
    import shutil

    ctl = started(root)
    add_model(root, "new")
    shutil.rmtree(root / "other")
    (root / ".hidden").mkdir()
    changes = ctl.poll()
    assert changes == PollChanges(added=["new"], removed=["other"], changed=[])
    ctl.loaded("new", ctl.repository.load("new"))
    ctl.unloaded("other")
    assert ctl.poll() == PollChanges(added=[], removed=[], changed=[])
    assert [e.name for e in ctl.index(False, {})] == ["a", "b", "ens", "new"]
    add_model(root, "other")  # back again: added again
    assert ctl.poll().added == ["other"]


@pytest.mark.parametrize("change", ["new version", "removed version", "edited config", "replaced file", "label file"])
def test_poll_changed(root: Path, change: str) -> None:
    (root / "other" / "2").mkdir()
    (root / "other" / "2" / "model.onnx").write_bytes(b"v2")
    ctl = started(root)
    d = root / "other"
    if change == "new version":
        (d / "3").mkdir()
        (d / "3" / "model.onnx").write_bytes(b"v3")
    elif change == "removed version":
        (d / "2" / "model.onnx").unlink()
        (d / "2").rmdir()
    elif change == "edited config":
        (d / "config.pbtxt").write_text(config_text("other", max_batch_size=4))
    elif change == "replaced file":
        touch(d / "2" / "model.onnx")
    else:
        (d / "labels.txt").write_text("cat\n")
    assert ctl.poll() == PollChanges(added=[], removed=[], changed=["other"])
    ctl.loaded("other", ctl.repository.load("other"))
    assert ctl.poll() == PollChanges(added=[], removed=[], changed=[])


def test_poll_reevaluates_ensembles_using_a_changed_model(root: Path) -> None:
    ctl = started(root)
    touch(root / "a" / "config.pbtxt")
    assert ctl.poll().changed == ["a", "ens"]


def test_poll_does_not_retry_a_failed_load_until_it_changes(root: Path) -> None:
    ctl = started(root)
    (root / "other" / "config.pbtxt").write_text("bogus: 1")
    assert ctl.poll().changed == ["other"]
    ctl.load_failed("other", "bad config")
    assert ctl.source("other") is not None  # the old one keeps serving
    assert ctl.poll().changed == []
    (root / "other" / "config.pbtxt").write_text(config_text("other"))
    assert ctl.poll().changed == ["other"]


def test_poll_sees_a_change_made_while_loading(root: Path) -> None:
    ctl = started(root)
    touch(root / "other" / "config.pbtxt")
    assert ctl.poll().changed == ["other"]
    source = ctl.repository.load("other")
    touch(root / "other" / "1" / "model.onnx")  # the copy finishes while the instances start
    ctl.loaded("other", source)
    assert ctl.poll().changed == ["other"]


def test_poll_model_failed_at_start_is_known(root: Path) -> None:
    (root / "b" / "config.pbtxt").write_text("bogus: 1")
    ctl = control(root, ControlMode.POLL)
    for name in ctl.startup():
        try:
            ctl.loaded(name, ctl.repository.load(name))
        except ServeError as err:
            ctl.load_failed(name, err.message)
    assert ctl.poll() == PollChanges(added=[], removed=[], changed=[])
    assert rows(ctl)[1][:3] == ("b", "", "UNAVAILABLE")


def test_asking_for_a_composing_model_makes_it_explicit(root: Path) -> None:
    ctl = control(root)
    load(ctl, "ens")
    assert ctl.prepare_load("a", None, {}).sources == {}  # serves unchanged: nothing to deploy ...
    assert ctl.prepare_unload("ens", unload_dependents=True) == ["ens", "b"]  # ... but 'a' is now wanted


# -- the repository's load with an override and another directory --------------------------------


def test_repository_load_from_another_directory(root: Path, tmp_path: Path) -> None:
    repo = ModelRepository(root)
    elsewhere = tmp_path / "elsewhere"
    add_model(elsewhere, "copy", versions=(5,))
    source = repo.load("a", directory=elsewhere / "copy", config_override=repo.load("a").config)
    assert source.name == "a" and source.directory == elsewhere / "copy"
    assert list(source.versions) == [5]
    with pytest.raises(InvalidConfig, match="must match the model directory name 'a' \\(got 'copy'\\)"):
        repo.load("a", directory=elsewhere / "copy")  # its config.pbtxt names another model
    with pytest.raises(NotFound, match="does not exist"):
        repo.load("a", directory=tmp_path / "nope")
    with pytest.raises(InvalidArgument, match="invalid model name"):
        repo.load("../a", directory=elsewhere / "copy")


def test_repository_has_model(root: Path) -> None:
    repo = ModelRepository(root)
    (root / ".hidden").mkdir()
    assert repo.has_model("a") and repo.model_dir("a") == root / "a"
    assert not repo.has_model("nope") and not repo.has_model(".hidden") and not repo.has_model("../models")


def test_a_load_that_failed_for_known_versions_lists_each_version(root: Path) -> None:
    """Triton's index: a model whose version failed to load (its instances, not its config) names the version."""
    ctl = control(root)
    ctl.load_failed("other", "initialize raised", versions=(2, 1))
    assert [r for r in rows(ctl) if r[0] == "other"] == [
        ("other", "1", "UNAVAILABLE", "initialize raised"),
        ("other", "2", "UNAVAILABLE", "initialize raised"),
    ]
    ctl.load_failed("other", "bad config")
    assert [r for r in rows(ctl) if r[0] == "other"] == [("other", "", "UNAVAILABLE", "bad config")]
