"""ModelManager without Ray: a manager built without its async __init__ over a real ModelControl and
ModelRepository (models from scripts/example_models.py); _checked (ensemble and autoscaling problems per
model), _deploy's bookkeeping with the Ray calls faked (reloads, failed reloads, kept failed instances),
_snapshot and index; and plan_model_apps (Serve applications bound, not run).  The books' own rules:
tests/unit/service/test_model_books.py."""

from __future__ import annotations

import asyncio
import logging
import pathlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from scripts import example_models
from serve_app.autoscale import AutoscalingSpec
from serve_app.errors import InvalidArgument
from serve_app.keys import ModelKey
from serve_app.placement import ClusterGpus, app_name, deployment_name
from serve_app.rayserve.console import MODELS_LOGGER
from serve_app.rayserve.model_apps import ModelApps, plan_model_apps
from serve_app.rayserve.model_manager import ModelManager, _load_error
from serve_app.rayserve.on_demand import OnDemand
from serve_app.repository import ModelRepository, ModelSource
from serve_app.repository.api import IndexEntry
from serve_app.repository.model_control import ControlMode, ModelControl
from serve_app.repository.residency import Usage
from serve_app.service.model_books import ModelBooks
from serve_app.service.serving_state import ServedVersion
from serve_app.settings import ServerSettings

DIMS = 4
MISSING_STEP = "ensemble_scheduling.step[0]: model 'missing' is not available"


def autoscaling(**params: object) -> str:
    return "\n".join(
        f'parameters {{ key: "autoscaling.{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()
    )


class _Manager(ModelManager):
    def __del__(self) -> None:  # type: ignore[override]
        pass  # built without __init__: nothing to stop when collected


class Manager:
    """A ModelManager built with object.__new__ and the attributes its pure parts use; Ray calls faked."""

    def __init__(
        self,
        repo: pathlib.Path,
        *,
        mode: ControlMode = ControlMode.NONE,
        overrides: dict[str, dict[str, Any]] | None = None,
        **settings: Any,
    ) -> None:
        mgr: ModelManager = object.__new__(_Manager)
        mgr.settings = ServerSettings(str(repo), shared_hosts=False, **settings)
        mgr._token = b"token"
        mgr._repo = ModelRepository(repo)
        mgr.mode = mode
        mgr.control = ModelControl(mgr._repo, mode)
        mgr._scaling_overrides = overrides or {}
        mgr._lock = asyncio.Lock()
        mgr._revision = 100
        mgr._books = ModelBooks()
        mgr._pools = SimpleNamespace(  # type: ignore[assignment]
            deployed={}, app_name=lambda pool: pool.deployment, awaiting=set()
        )
        mgr._next_generation = 1000
        mgr._gpus = ClusterGpus(total=0)
        mgr._on_demand = None
        mgr._demanding = False
        mgr._placing = {}
        self.mgr = mgr
        self.run: list[list[str]] = []  # applications started, per deploy
        self.bad: dict[str, str] = {}  # model -> the load error its instances report
        self.published: list[list[str]] = []  # stale applications, per publish
        mgr._run_apps = self._run_apps  # type: ignore[method-assign]
        mgr._instance_states = self._instance_states  # type: ignore[method-assign]
        mgr._publish = self._publish  # type: ignore[method-assign]

    def _run_apps(self, apps: dict[str, Any]) -> dict[str, str]:
        self.run.append(sorted(apps))
        return {}

    async def _instance_states(self, plan: ModelApps) -> dict[ModelKey, str]:
        return {sv.key.version_key: self.bad[sv.name] for sv in plan.served if sv.name in self.bad}

    async def _publish(self, stale: list[str], stale_groups: set[str] | None = None, unloading: bool = False) -> None:
        self.mgr._revision += 1
        self.published.append(sorted(stale))

    def sources(self, *names: str) -> dict[str, ModelSource]:
        return {n: self.mgr._repo.load(n) for n in names}


@pytest.fixture
def repo(tmp_path: pathlib.Path) -> pathlib.Path:
    example_models.add_sub(tmp_path, dims=DIMS)
    example_models.add_sub_ensemble(tmp_path, name="ens", dims=DIMS)
    example_models.add_sub_ensemble(tmp_path, name="broken_ens", step_model="missing", dims=DIMS)
    return tmp_path


# -- _checked ---------------------------------------------------------------------------------------
def test_checked_drops_an_ensemble_whose_step_is_missing(repo: pathlib.Path) -> None:
    m = Manager(repo)
    kept, scaling, failures = m.mgr._checked(m.sources("add_sub", "ens", "broken_ens"))
    assert sorted(kept) == ["add_sub", "ens"]
    assert failures == {"broken_ens": MISSING_STEP}
    assert scaling == {"add_sub": None, "ens": None}


def test_checked_accepts_an_ensemble_over_a_model_already_loaded(repo: pathlib.Path) -> None:
    m = Manager(repo)
    m.mgr.control.loaded("add_sub", m.mgr._repo.load("add_sub"))
    kept, _, failures = m.mgr._checked(m.sources("ens"))
    assert list(kept) == ["ens"] and failures == {}


def test_checked_reports_autoscaling_errors_per_model(tmp_path: pathlib.Path) -> None:
    example_models.add_sub(tmp_path, name="bad", dims=DIMS, extra_config=autoscaling(min_replicas=2))
    example_models.add_sub(tmp_path, name="good", dims=DIMS, extra_config=autoscaling(max_replicas=3))
    m = Manager(tmp_path)
    kept, scaling, failures = m.mgr._checked(m.sources("bad", "good"))
    assert list(kept) == ["good"] and scaling["good"] == AutoscalingSpec(max_replicas=3)
    assert "parameter 'autoscaling.min_replicas'" in failures["bad"]
    assert str(tmp_path / "bad" / "config.pbtxt") in failures["bad"] and "max_replicas" in failures["bad"]


def test_checked_names_the_override_file_in_its_errors(repo: pathlib.Path) -> None:
    m = Manager(repo, overrides={"add_sub": {"max_replicas": 0}}, autoscaling_file="/etc/scaling.yaml")
    kept, _, failures = m.mgr._checked(m.sources("add_sub"))
    assert kept == {}
    assert "/etc/scaling.yaml" in failures["add_sub"] and "must be at least 1, got 0" in failures["add_sub"]


def test_checked_override_wins_over_the_config(tmp_path: pathlib.Path) -> None:
    example_models.add_sub(tmp_path, dims=DIMS, extra_config=autoscaling(max_replicas=3))
    m = Manager(tmp_path, overrides={"add_sub": {"enabled": False}})
    kept, scaling, failures = m.mgr._checked(m.sources("add_sub"))
    assert list(kept) == ["add_sub"] and scaling == {"add_sub": None} and failures == {}


# -- _deploy bookkeeping ----------------------------------------------------------------------------
async def test_deploy_serves_what_came_up_and_records_what_failed(repo: pathlib.Path) -> None:
    m = Manager(repo)
    failures = await m.mgr._deploy(m.sources("add_sub", "ens", "broken_ens"))
    assert failures == {"broken_ens": MISSING_STEP}
    assert m.run == [["serve_app--add_sub.v1.g0--1001"]] and m.published == [[]]
    state = m.mgr._snapshot()
    assert state.revision == 101 and state.failed == (("broken_ens", MISSING_STEP),)
    assert [(v.name, v.version, v.generation, v.state) for v in state.served] == [
        ("add_sub", 1, 1001, "READY"),
        ("ens", 1, 1002, "READY"),
    ]
    assert m.mgr.control.loaded_names() == ["add_sub", "ens"]


async def test_reload_makes_the_old_generations_applications_stale(repo: pathlib.Path) -> None:
    m = Manager(repo)
    await m.mgr._deploy(m.sources("add_sub"))
    await m.mgr._deploy(m.sources("add_sub"))
    assert m.published == [[], ["serve_app--add_sub.v1.g0--1001"]]
    assert m.mgr._books.apps == {"add_sub": ["serve_app--add_sub.v1.g0--1002"]}
    assert [v.generation for v in m.mgr._snapshot().served] == [1002]


async def test_failed_reload_keeps_the_served_generation(repo: pathlib.Path) -> None:
    m = Manager(repo)
    await m.mgr._deploy(m.sources("add_sub"))
    m.bad["add_sub"] = "onnxruntime could not load it"
    failures = await m.mgr._deploy(m.sources("add_sub"))
    assert failures == {"add_sub": "onnxruntime could not load it"}
    assert m.published[-1] == ["serve_app--add_sub.v1.g0--1002"]  # the new instances go
    state = m.mgr._snapshot()
    assert [(v.generation, v.state) for v in state.served] == [(1001, "READY")] and state.failed == ()


async def test_a_first_load_that_fails_is_listed_failed(repo: pathlib.Path) -> None:
    m = Manager(repo)
    m.bad["add_sub"] = "onnxruntime could not load it"
    await m.mgr._deploy(m.sources("add_sub"))
    state = m.mgr._snapshot()
    assert state.served == () and state.failed == (("add_sub", "onnxruntime could not load it"),)
    index = await m.mgr.index()
    assert IndexEntry("add_sub", "1", "UNAVAILABLE", "onnxruntime could not load it") in index


async def test_kept_failed_instances_serve_unavailable_with_the_reason(repo: pathlib.Path) -> None:
    m = Manager(repo, keep_failed_instances=True)
    m.bad["add_sub"] = "no CUDA here"
    assert await m.mgr._deploy(m.sources("add_sub")) == {}
    [sv] = m.mgr._snapshot().served
    assert (sv.state, sv.reason) == ("UNAVAILABLE", "no CUDA here")
    assert IndexEntry("add_sub", "1", "UNAVAILABLE", "no CUDA here") in await m.mgr.index()


async def test_a_failed_explicit_load_raises_tritons_load_error(repo: pathlib.Path) -> None:
    m = Manager(repo, mode=ControlMode.EXPLICIT, model_control_mode="explicit")
    m.bad["add_sub"] = "bad weights"
    with pytest.raises(InvalidArgument, match=r"^load failed for model 'add_sub': bad weights$"):
        await m.mgr.load("add_sub")


STEP_FAILURES = {
    "autoscaling": autoscaling(min_replicas=2),
    "placement": "instance_group [ { kind: KIND_GPU } ]",
    "instances": "",
}


@pytest.mark.parametrize("cause", sorted(STEP_FAILURES))
async def test_an_ensemble_whose_step_fails_to_load_fails_too(tmp_path: pathlib.Path, cause: str) -> None:
    example_models.add_sub(tmp_path, dims=DIMS, extra_config=STEP_FAILURES[cause])
    example_models.add_sub_ensemble(tmp_path, name="ens", dims=DIMS)
    m = Manager(tmp_path, mode=ControlMode.EXPLICIT, model_control_mode="explicit")
    if cause == "instances":
        m.bad["add_sub"] = "instances died"
    with pytest.raises(InvalidArgument, match=r"^load failed for model 'ens': "):
        await m.mgr.load("ens")
    assert [v.name for v in m.mgr._snapshot().served] == []


async def test_unload_publishes_the_model_as_unloaded(repo: pathlib.Path) -> None:
    m = Manager(repo, mode=ControlMode.EXPLICIT, model_control_mode="explicit")
    await m.mgr.load("ens")
    await m.mgr.unload("add_sub")  # takes the ensemble using it along
    state = m.mgr._snapshot()
    assert state.served == () and state.failed == (("add_sub", "unloaded"), ("ens", "unloaded"))
    assert m.published[-1] == ["serve_app--add_sub.v1.g0--1001"]


async def test_models_loaded_on_demand_can_be_evicted_and_the_operators_cannot(repo: pathlib.Path) -> None:
    m = Manager(
        repo,
        mode=ControlMode.EXPLICIT,
        model_control_mode="explicit",
        load_on_demand=True,
        max_loaded_models_per_node=2,
    )
    m.mgr.control = ModelControl(m.mgr._repo, ControlMode.EXPLICIT, on_demand=True)

    async def no_usage() -> dict[str, Usage]:
        return {}

    on_demand = m.mgr._on_demand = OnDemand(m.mgr, m.mgr.settings, no_usage)
    failures, loaded = await m.mgr.demand_load(["ens"])
    assert failures == {} and sorted(loaded) == ["add_sub", "ens"]
    assert on_demand.residency.counted() == 2
    await m.mgr.load("add_sub")  # unchanged: nothing deployed, but the operator's now
    on_demand.residency.clock = lambda: 1e12
    admission = on_demand.residency.admit([("other", 2)], {})
    assert admission.load == [] and admission.evict == []  # add_sub is pinned, so ens is all that could go
    await m.mgr.evict(["ens"])
    assert [v.name for v in m.mgr._snapshot().served] == ["add_sub"]
    assert on_demand.residency.counted() == 1


async def test_a_load_on_demand_that_fails_is_reported(repo: pathlib.Path) -> None:
    m = Manager(repo, mode=ControlMode.EXPLICIT, model_control_mode="explicit", load_on_demand=True)
    m.mgr.control = ModelControl(m.mgr._repo, ControlMode.EXPLICIT, on_demand=True)
    m.bad["add_sub"] = "bad weights"
    failures, loaded = await m.mgr.demand_load(["add_sub", "broken_ens"])
    assert failures["add_sub"] == "bad weights" and "missing" in failures["broken_ens"] and loaded == []


# -- _snapshot and index ----------------------------------------------------------------------------
def served(name: str, version: int, state: str = "READY", reason: str = "") -> ServedVersion:
    return ServedVersion(name, version, b"", (), (), 1, state, reason)


def test_snapshot_lists_served_versions_by_model_and_failures_of_models_not_served(repo: pathlib.Path) -> None:
    mgr = Manager(repo).mgr
    mgr._books.served = {"b": [served("b", 1)], "a": [served("a", 1), served("a", 2)]}
    mgr._books.failed = {"z": "broken", "a": "reload failed", "c": "unloaded"}
    state = mgr._snapshot()
    assert state.revision == 100
    assert [(v.name, v.version) for v in state.served] == [("a", 1), ("a", 2), ("b", 1)]
    assert state.failed == (("c", "unloaded"), ("z", "broken"))


async def test_index_shows_served_states_over_what_the_control_knows(repo: pathlib.Path) -> None:
    mgr = Manager(repo).mgr
    mgr._books.served = {"add_sub": [served("add_sub", 1, "LOADING")]}
    assert await mgr.index() == [
        IndexEntry("add_sub", "1", "LOADING", ""),
        IndexEntry("broken_ens", "", "", ""),
        IndexEntry("ens", "", "", ""),
    ]
    assert await mgr.index(ready_only=True) == []


def test_load_error_helper() -> None:
    assert _load_error("m", "why").message == "load failed for model 'm': why"


# -- plan_model_apps --------------------------------------------------------------------------------
def plan(repo: pathlib.Path, names: list[str], scaling: dict[str, AutoscalingSpec | None] | None = None) -> ModelApps:
    sources = {n: ModelRepository(repo).load(n) for n in names}
    generations = {n: 10 + i for i, n in enumerate(names)}
    settings = ServerSettings(str(repo), shared_hosts=False)
    return plan_model_apps(sources, generations, settings, ClusterGpus(total=0), b"t", scaling or {})


def test_plan_gives_each_group_of_each_version_its_own_application(tmp_path: pathlib.Path) -> None:
    groups = "instance_group [ { kind: KIND_CPU count: 2 }, { kind: KIND_CPU count: 1 } ]\n"
    extra = groups + "version_policy { all { } }"
    example_models.add_sub(tmp_path, dims=DIMS, versions=(1, 2), extra_config=extra)
    out = plan(tmp_path, ["add_sub"])
    assert sorted(out.apps) == [
        app_name("serve_app", deployment_name("add_sub", v, g), 10) for v in (1, 2) for g in (0, 1)
    ]
    assert [(v.version, v.generation, v.state) for v in out.served] == [(1, 10, "LOADING"), (2, 10, "LOADING")]
    assert [(r.name, r.replicas, r.autoscaled) for r in out.served[0].deployments] == [
        ("add_sub.v1.g0", 2, False),
        ("add_sub.v1.g1", 1, False),
    ]
    assert out.sequence_models == [] and out.failed == {}


def test_plan_serves_an_ensemble_without_applications(repo: pathlib.Path) -> None:
    out = plan(repo, ["ens"])
    assert out.apps == {} and [(v.name, v.deployments) for v in out.served] == [("ens", ())]
    assert out.messages == ["model 'ens' version 1: ensemble of add_sub"]


def test_models_loaded_on_demand_run_on_one_node(repo: pathlib.Path) -> None:
    cpu = "instance_group [ { kind: KIND_CPU } ]\n"
    own = 'parameters { key: "dedicated_process" value: { string_value: "true" } }'
    example_models.add_sub(repo, name="cpu", dims=DIMS, extra_config=cpu)
    example_models.add_sub(repo, name="own", dims=DIMS, extra_config=cpu + own)
    example_models.add_sub(repo, name="gpu", dims=DIMS, extra_config="instance_group [ { kind: KIND_GPU } ]")
    names = ("cpu", "ens", "own", "gpu")
    sources = {n: ModelRepository(repo).load(n) for n in names}
    generations = {n: i for i, n in enumerate(names)}
    nodes = {"cpu": "10.0.0.2", "ens": "10.0.0.2", "own": "10.0.0.3", "gpu": "10.0.0.3"}
    out = plan_model_apps(sources, generations, ServerSettings(str(repo)), ClusterGpus(total=1), b"t", {}, nodes=nodes)
    # a GPU instance stays where its GPU is
    assert out.on_node == {"cpu": "10.0.0.2", "ens": "10.0.0.2", "own": "10.0.0.3"}
    assert [(load.key.name, load.nodes) for load in out.hosted["cpu"]] == [("cpu", ("10.0.0.2",))]
    assert out.hosted["cpu"][0].held_on("10.0.0.2") and not out.hosted["cpu"][0].held_on("10.0.0.1")
    assert [load.nodes for load in out.hosted["gpu"]] == [()]
    (own_app,) = [a for a in out.apps if "own" in a]
    options = out.apps[own_app]._bound_deployment.ray_actor_options
    assert options["resources"] == {"node:10.0.0.3": 0.001}


def test_plan_fails_a_model_that_cannot_be_placed_and_plans_the_others(tmp_path: pathlib.Path) -> None:
    example_models.add_sub(tmp_path, name="gpu", dims=DIMS, extra_config="instance_group [ { kind: KIND_GPU } ]")
    example_models.add_sub(tmp_path, dims=DIMS)
    out = plan(tmp_path, ["gpu", "add_sub"])
    assert list(out.failed) == ["gpu"] and [v.name for v in out.served] == ["add_sub"]


def test_plan_starts_an_autoscaled_group_at_its_initial_replicas(repo: pathlib.Path) -> None:
    out = plan(repo, ["add_sub"], {"add_sub": AutoscalingSpec(min_replicas=1, max_replicas=4, initial_replicas=2)})
    [ref] = out.served[0].deployments
    assert (ref.replicas, ref.autoscaled) == (2, True)
    assert out.messages == ["model 'add_sub' version 1: deploying (1x KIND_CPU, autoscaling 1..4)"]


def test_plan_lists_sequence_models_for_the_router(tmp_path: pathlib.Path) -> None:
    example_models.add_sub(
        tmp_path, name="seq", dims=DIMS, extra_config="sequence_batching { max_sequence_idle_microseconds: 5000000 }"
    )
    out = plan(tmp_path, ["seq"])
    [spec] = out.sequence_models
    assert (spec.key, spec.name, spec.generation) == ("seq:1", "seq", 10)
    assert spec.deployments == (("serve_app--seq.v1.g0--10", "seq.v1.g0", 1),)


# -- shared hosts -------------------------------------------------------------------------------------
class FakePools:
    """PoolContent with the gateways as the CPU pool: pushes find no gateway yet (the server is starting)."""

    def __init__(self) -> None:
        self.deployed: dict[str, Any] = {}
        self.content: dict[str, Any] = {}
        self.removed: set[str] = set()
        self.awaiting: set[str] = set()

    def app_name(self, pool: Any) -> str:
        return pool.in_deployment[1] if pool.in_deployment else pool.deployment

    async def add(self, loads: dict[str, list[Any]], timeout_s: float) -> dict[str, str]:
        from serve_app.hosting import InstanceHost

        for group in loads.values():
            for load in group:
                self.content[InstanceHost.group_id(load)] = load
        self.awaiting |= set(self.content)
        return dict.fromkeys(self.content, "")  # pending: nothing failed yet

    async def remove(self, group_ids: set[str], timeout_s: float) -> None:
        self.removed |= group_ids

    def models_of(self, pool: str, group_ids: set[str]) -> dict[str, str]:
        return {g: load.key.name for g, load in self.content.items() if g in group_ids}


async def test_a_group_a_gateway_failed_to_load_as_it_started_fails_its_model(repo: pathlib.Path) -> None:
    m = Manager(repo, mode=ControlMode.EXPLICIT, model_control_mode="explicit")
    m.mgr.settings = ServerSettings(str(repo))  # shared hosts, CPU instances in the gateways
    pools = FakePools()
    m.mgr._pools = pools  # type: ignore[assignment]
    published: list[set[str]] = []

    async def publish(stale: list[str], stale_groups: set[str] | None = None, unloading: bool = False) -> None:
        m.mgr._revision += 1
        published.append(set(stale_groups or ()))

    m.mgr._publish = publish  # type: ignore[method-assign]
    await m.mgr.load("add_sub")
    assert m.run == [] and "add_sub" in m.mgr._books.served  # no application to deploy: the gateways hold it
    (group,) = pools.content
    revision = await m.mgr.hosting_failed("cpu", {group: "warmup sample 'x' failed"})
    assert revision == m.mgr._revision and published[-1] == {group}
    assert m.mgr._snapshot().served == ()
    assert m.mgr._snapshot().failed == (("add_sub", "warmup sample 'x' failed"),)
    (entry,) = [e for e in await m.mgr.index() if e.name == "add_sub"]
    assert (entry.state, entry.reason) == ("UNAVAILABLE", "warmup sample 'x' failed")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def model_lines() -> Iterator[list[str]]:
    """The lines the manager prints per model (its own logger, which does not propagate)."""
    log, handler = logging.getLogger(MODELS_LOGGER), _Lines()
    log.addHandler(handler)
    try:
        yield handler.lines
    finally:
        log.removeHandler(handler)


async def test_a_model_gets_its_line_once_it_loads(repo: pathlib.Path, model_lines: list[str]) -> None:
    example_models.identity(repo, "FP32", name="broken")
    m = Manager(repo, mode=ControlMode.EXPLICIT, model_control_mode="explicit")
    await m.mgr.load("add_sub")
    m.bad["broken"] = "model.py raised"
    with pytest.raises(InvalidArgument):
        await m.mgr.load("broken")
    await m.mgr.unload("add_sub")
    assert model_lines == [
        "successfully loaded 'add_sub' version 1",
        "failed to load 'broken': model.py raised",
        "successfully unloaded 'add_sub'",
    ]


async def test_a_model_the_starting_gateways_hold_gets_its_line_when_they_loaded_it(
    repo: pathlib.Path, model_lines: list[str]
) -> None:
    example_models.identity(repo, "FP32", name="identity_fp32")
    m = Manager(repo, mode=ControlMode.EXPLICIT, model_control_mode="explicit")
    m.mgr.settings = ServerSettings(str(repo))  # shared hosts, CPU instances in the gateways
    pools = FakePools()
    m.mgr._pools = pools  # type: ignore[assignment]
    await m.mgr.load("add_sub")
    await m.mgr.load("identity_fp32")
    assert model_lines == []  # no gateway runs yet: not loaded anywhere
    ok, bad = sorted(pools.content, key=lambda g: "add_sub" not in g)
    await m.mgr.hosting_taken("cpu", {ok: "", bad: "warmup sample 'x' failed"})
    assert model_lines == [
        "failed to load 'identity_fp32': warmup sample 'x' failed",
        "successfully loaded 'add_sub' version 1",
    ]
    assert pools.awaiting == set()
    await m.mgr.hosting_taken("cpu", {ok: ""})  # a second gateway: the line is said once
    assert len(model_lines) == 2


# -- --model-load-thread-count and --model-load-retry-count -----------------------------------------------------
def record_deploys(m: Manager) -> list[list[str]]:
    deploys: list[list[str]] = []
    deploy = m.mgr._deploy

    async def recorded(sources: dict[str, ModelSource], *, final: bool = True) -> dict[str, str]:
        deploys.append(sorted(sources))
        return await deploy(sources, final=final)

    m.mgr._deploy = recorded  # type: ignore[method-assign]
    return deploys


async def test_a_load_thread_count_of_one_deploys_one_model_at_a_time(repo: pathlib.Path) -> None:
    example_models.add_sub(repo, name="other", dims=DIMS)
    m = Manager(repo, model_load_thread_count=1)
    deploys = record_deploys(m)
    failures = await m.mgr._load_models(m.sources("ens", "other", "add_sub"))
    assert failures == {}
    assert deploys == [["add_sub"], ["other"], ["ens"]]  # the ensemble after its step
    assert m.mgr.control.loaded_names() == ["add_sub", "ens", "other"]


async def test_a_model_that_fails_is_deployed_again_up_to_the_retry_count(repo: pathlib.Path) -> None:
    m = Manager(repo, model_load_retry_count=2)
    deploys = record_deploys(m)
    attempts = {"add_sub": 0}

    async def flaky(plan: ModelApps) -> dict[ModelKey, str]:
        attempts["add_sub"] += 1
        return {ModelKey("add_sub", 1): "not yet"} if attempts["add_sub"] < 3 else {}

    m.mgr._instance_states = flaky  # type: ignore[method-assign]
    assert await m.mgr._load_models(m.sources("add_sub", "ens")) == {}
    assert deploys == [["add_sub", "ens"], ["add_sub", "ens"], ["add_sub", "ens"]]  # the ensemble waits on its step
    assert m.mgr._snapshot().failed == ()
    assert [v.state for v in m.mgr._snapshot().served] == ["READY", "READY"]
    assert len(m.published) == 3  # each failed attempt's instances were cleaned up


async def test_a_model_that_keeps_failing_fails_once_its_retries_are_spent(repo: pathlib.Path) -> None:
    m = Manager(repo, model_load_retry_count=1)
    deploys = record_deploys(m)
    m.bad["add_sub"] = "bad weights"
    assert await m.mgr._load_models(m.sources("add_sub")) == {"add_sub": "bad weights"}
    assert deploys == [["add_sub"], ["add_sub"]]
    assert m.mgr._snapshot().failed == (("add_sub", "bad weights"),)


def test_checked_fails_a_model_that_needs_more_of_a_resource_than_the_rate_limiter_has(tmp_path: pathlib.Path) -> None:
    limited = 'instance_group [ { kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 2 } ] } } ]'
    example_models.add_sub(tmp_path, name="greedy", dims=DIMS, extra_config=limited)
    example_models.add_sub(tmp_path, name="plain", dims=DIMS)
    m = Manager(tmp_path, rate_limit="execution_count", rate_limit_resource=("R:1",))
    kept, _, failures = m.mgr._checked(m.sources("greedy", "plain"))
    assert list(kept) == ["plain"]
    assert 'Resource count for "R" is limited to 1' in failures["greedy"]
    assert "the minimum required count is 2" in failures["greedy"]
    without = Manager(tmp_path, rate_limit_resource=("R:1",))  # --rate-limit off: not checked
    assert without.mgr._checked(without.sources("greedy"))[2] == {}
