"""The load-on-demand loop over a fake manager: shared loads, answered failures, unknown names, evictions."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import pytest

from serve_app.errors import NotFound, Unavailable
from serve_app.rayserve.on_demand import OnDemand, usage_of
from serve_app.repository import ModelRepository
from serve_app.repository.model_control import ControlMode, ModelControl
from serve_app.repository.residency import Usage
from serve_app.settings import ServerSettings
from tests.unit.repository.test_model_control import add_model


class FakeManager:
    """Deploys instantly (or fails the models in ``broken``); records what it loaded and evicted."""

    def __init__(self, root: Path, on_demand: OnDemand | None = None) -> None:
        self.control = ModelControl(ModelRepository(root), ControlMode.EXPLICIT, on_demand=True)
        self._lock = asyncio.Lock()
        self.loads: list[list[str]] = []
        self.evicted: list[str] = []
        self.broken: set[str] = set()
        self.on_demand = on_demand
        self.nodes: list[str] = []  # the nodes with hosts (none: one node)
        self.placed: dict[str, str] = {}

    @property
    def lock(self) -> asyncio.Lock:
        return self._lock

    async def host_nodes(self) -> list[str]:
        return list(self.nodes)

    async def demand_load(
        self, names: list[str], nodes: Mapping[str, str] | None = None
    ) -> tuple[dict[str, str], list[str]]:
        self.loads.append(list(names))
        self.placed.update(nodes or {})
        await asyncio.sleep(0)
        failures, loaded = {}, []
        for name in names:
            plan = self.control.prepare_demand(name)
            for model, source in plan.sources.items():
                if model in self.broken:
                    self.control.load_failed(model, "it is broken")
                    failures[model] = "it is broken"
                else:
                    self.control.loaded(model, source)
                    assert self.on_demand is not None
                    where = [nodes[name]] if nodes and name in nodes else None
                    self.on_demand.residency.loaded(model, pinned=False, nodes=where)
                    loaded.append(model)
        return failures, loaded

    async def evict(self, names: list[str]) -> None:
        for name in names:
            self.control.unloaded(name)
            assert self.on_demand is not None
            self.on_demand.residency.unloaded(name)
            self.evicted.append(name)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name in ("a", "b", "c"):
        add_model(tmp_path / "models", name)
    return tmp_path / "models"


def loop(root: Path, budget: int = 0, usage: dict[str, Usage] | None = None) -> tuple[OnDemand, FakeManager]:
    settings = ServerSettings(
        model_repository=str(root),
        model_control_mode="explicit",
        load_on_demand=True,
        max_loaded_models_per_node=budget,
        on_demand_min_resident_s=0.0,
    )
    manager = FakeManager(root)

    async def seen() -> dict[str, Usage]:
        return usage or {}

    on_demand = OnDemand(manager, settings, seen)
    manager.on_demand = on_demand
    on_demand.start()
    return on_demand, manager


async def test_concurrent_first_requests_share_one_load(root: Path) -> None:
    on_demand, manager = loop(root)
    await asyncio.gather(*(on_demand.demand("a") for _ in range(5)))
    assert manager.loads == [["a"]]
    assert on_demand.stats.of("a").loads == 1
    await on_demand.demand("a")  # serves: nothing to do
    assert manager.loads == [["a"]]
    on_demand.stop()


async def test_a_failed_load_is_answered_without_loading_again(root: Path) -> None:
    on_demand, manager = loop(root)
    manager.broken.add("b")
    for _ in range(2):
        with pytest.raises(Unavailable, match="'b' has no available versions: it is broken"):
            await on_demand.demand("b")
    assert manager.loads == [["b"]]
    assert on_demand.stats.of("b").load_failures == 1
    on_demand.stop()


async def test_an_unknown_name_loads_nothing(root: Path) -> None:
    on_demand, manager = loop(root)
    with pytest.raises(NotFound, match="Request for unknown model: 'nope' is not found"):
        await on_demand.demand("nope")
    assert manager.loads == []
    on_demand.stop()


async def test_a_full_node_evicts_the_least_recently_used(root: Path) -> None:
    on_demand, manager = loop(root, budget=2, usage={"a": Usage(last_used=2e9), "b": Usage(last_used=1.0)})
    await on_demand.demand("a")
    await on_demand.demand("b")
    await on_demand.demand("c")
    assert manager.evicted == ["b"]
    assert on_demand.stats.of("b").evictions == 1
    on_demand.stop()


async def test_a_request_waits_no_longer_than_its_bound(root: Path) -> None:
    on_demand, manager = loop(root, budget=1, usage={"a": Usage(busy=True)})
    await on_demand.demand("a")
    on_demand._settings = ServerSettings(  # a short bound; the loop keeps retrying behind it
        model_repository=str(root), model_control_mode="explicit", load_on_demand=True, on_demand_wait_s=0.05
    )
    with pytest.raises(Unavailable, match=r"was not loaded within 0\.05s"):
        await on_demand.demand("b")
    assert manager.evicted == []
    on_demand.stop()


def test_usage_adds_up_the_gateways() -> None:
    answers = [{"a": (5.0, False, 1)}, {"a": (7.0, True, 2), "b": (None, False, 0)}, RuntimeError("gone")]
    assert usage_of(answers) == {"a": Usage(7.0, True, 3), "b": Usage(None, False, 0)}


async def test_each_node_has_a_budget_and_loads_go_where_there_is_room(root: Path) -> None:
    on_demand, manager = loop(root, budget=1)
    manager.nodes = ["n1", "n2"]
    await on_demand.demand("a")
    await on_demand.demand("b")
    assert manager.placed == {"a": "n1", "b": "n2"} and manager.evicted == []
    await on_demand.demand("c")  # both nodes full: the least recently used (a) makes room on n1
    assert manager.evicted == ["a"] and manager.placed["c"] == "n1"
    on_demand.stop()


async def test_models_on_a_node_that_left_are_unloaded(root: Path) -> None:
    on_demand, manager = loop(root, budget=1)
    manager.nodes = ["n1", "n2", "n3"]
    await on_demand.demand("a")
    assert manager.placed == {"a": "n1"}
    manager.nodes = ["n2", "n3"]
    on_demand._nodes = (-1e9, [])  # the nodes are asked again
    await on_demand.demand("b")
    assert manager.evicted == ["a"] and manager.placed["b"] == "n2"
    on_demand.stop()
