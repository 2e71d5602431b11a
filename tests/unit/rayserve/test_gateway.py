"""Gateway.apply_state and _retire without Ray: a Gateway built without its async __init__, over a fake
executor (channels opened and removed), fake Serve handles (warmup figures) and fake schedulers (drained)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from google.protobuf import text_format

from serve_app.errors import NotFound
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.keys import ModelKey
from serve_app.protos import model_config_pb2 as mc
from serve_app.rayserve import gateway as gateway_module
from serve_app.rayserve.gateway import Gateway
from serve_app.service import InferenceService, ModelRegistry
from serve_app.service.serving_state import DeploymentRef, ServedVersion, ServingState
from serve_app.settings import ServerSettings
from serve_app.stats import ModelStats

REF = DeploymentRef("app--m.v1.g0--1", "m.v1.g0", 2)


def config(name: str = "m", platform: str = "") -> mc.ModelConfig:
    text = f"""
        name: "{name}"
        max_batch_size: 8
        input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }}]
        output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }}]
    """
    if platform == "ensemble":
        text += """
        platform: "ensemble"
        ensemble_scheduling { step [{ model_name: "m" model_version: -1
          input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }] }
        """
    return text_format.Parse(text, mc.ModelConfig())


def served(name: str = "m", version: int = 1, generation: int = 1, ensemble: bool = False) -> ServedVersion:
    cfg = config(name, "ensemble" if ensemble else "")
    return ServedVersion(name, version, cfg.SerializeToString(), () if ensemble else (REF,), (), generation)


class FakeHandle:
    """A Serve handle whose ``broadcast(method).results_async()`` answers ``answers``."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.broadcasts: list[str] = []

    def broadcast(self, method: str, *args: Any) -> Any:
        self.broadcasts.append(method)

        async def results_async(return_exceptions: bool = False) -> list[Any]:
            assert return_exceptions
            return list(self.answers)

        return SimpleNamespace(results_async=results_async)


class FakeExecutor:
    """What apply_state asks of RayModelExecutor; ``gate`` holds add_version (opening channels)."""

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self.gate = asyncio.Event()
        self.gate.set()
        self.added: list[tuple[ModelKey, tuple[DeploymentRef, ...]]] = []
        self.served_while_adding: list[bool] = []
        self.removed: list[ModelKey] = []
        self.handle = FakeHandle([])

    async def add_version(self, key: ModelKey, refs: tuple[DeploymentRef, ...]) -> None:
        self.added.append((key, refs))
        self.served_while_adding.append(any(m.key == key for m in self.registry.all_models()))
        await self.gate.wait()

    def remove_version(self, key: ModelKey) -> None:
        self.removed.append(key)

    def handles(self, key: ModelKey, skip: tuple[str, str] | None = None) -> list[Any]:
        return [self.handle]

    def capacity(self, key: ModelKey) -> int:
        return 1

    def instances(self, key: ModelKey) -> int:
        return 1

    async def execute(self, key: ModelKey, executions: list[Execution]) -> list[ExecutionResult]:
        raise AssertionError("nothing runs here")


class FakeScheduler:
    def __init__(self) -> None:
        self.stats = ModelStats("m", "1")
        self.done = False

    def drained(self) -> bool:
        return self.done


class _Gateway(Gateway):
    def __del__(self) -> None:  # type: ignore[override]
        pass  # built without __init__: nothing to stop when collected


def make_gateway(replicas: int = 1) -> tuple[Gateway, FakeExecutor]:
    gw: Gateway = object.__new__(_Gateway)
    gw.settings = ServerSettings("/m", gateway_replicas=replicas)
    gw.registry = ModelRegistry()
    executor = FakeExecutor(gw.registry)
    gw.executor = executor  # type: ignore[assignment]
    gw.service = InferenceService(gw.registry, executor)  # type: ignore[arg-type]
    gw._apply_lock = asyncio.Lock()
    gw._manager = None
    gw.hosting = None  # the models' instances are in other processes here
    return gw, executor


async def wait_until(condition: Callable[[], object]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


# -- adding ------------------------------------------------------------------------------------
async def test_new_versions_are_served_only_once_their_channels_are_open() -> None:
    gw, executor = make_gateway()
    executor.gate.clear()
    task = asyncio.create_task(gw.apply_state(ServingState(5, (served(),))))
    await wait_until(lambda: executor.added)
    with pytest.raises(NotFound):
        gw.registry.resolve("m")
    assert gw.registry.revision == -1
    executor.gate.set()
    assert await task == 5
    assert executor.added == [(ModelKey("m", 1, 1), (REF,))] and executor.served_while_adding == [False]
    assert gw.registry.resolve("m").key == ModelKey("m", 1, 1)


async def test_an_ensemble_opens_no_channels() -> None:
    gw, executor = make_gateway()
    await gw.apply_state(ServingState(1, (served(), served("e", ensemble=True))))
    assert [key for key, _ in executor.added] == [ModelKey("m", 1, 1)]
    assert gw.registry.resolve("e").is_ensemble


async def test_an_older_or_the_same_revision_is_ignored() -> None:
    gw, executor = make_gateway()
    await gw.apply_state(ServingState(5, (served(),)))
    assert await gw.apply_state(ServingState(4, (served("other"),))) == 5
    assert await gw.apply_state(ServingState(5, ())) == 5
    assert gw.registry.names() == ["m"] and len(executor.added) == 1 and executor.removed == []


async def test_states_are_applied_one_at_a_time_in_order() -> None:
    gw, executor = make_gateway()
    executor.gate.clear()
    first = asyncio.create_task(gw.apply_state(ServingState(1, (served(generation=1),))))
    await wait_until(lambda: executor.added)
    second = asyncio.create_task(gw.apply_state(ServingState(2, (served(generation=2),))))
    await asyncio.sleep(0.01)
    assert len(executor.added) == 1  # the second waits for the first to finish
    executor.gate.set()
    assert await first == 1 and await second == 2
    assert [k.generation for k, _ in executor.added] == [1, 2] and executor.removed == [ModelKey("m", 1, 1)]
    assert gw.registry.resolve("m").key.generation == 2


# -- retiring -----------------------------------------------------------------------------------
async def test_a_replaced_version_is_removed_only_once_its_scheduler_drained() -> None:
    gw, executor = make_gateway()
    await gw.apply_state(ServingState(1, (served(generation=1),)))
    old = gw.registry.resolve("m")
    sched = old.scheduler = FakeScheduler()  # type: ignore[assignment]
    task = asyncio.create_task(gw.apply_state(ServingState(2, (served(generation=2),))))
    await wait_until(lambda: gw.registry.revision == 2)
    await asyncio.sleep(0.05)
    assert gw.registry.resolve("m").key == ModelKey("m", 1, 2)  # the new load serves already
    assert not task.done() and executor.removed == []
    sched.done = True
    assert await task == 2
    assert executor.removed == [ModelKey("m", 1, 1)]


async def test_an_unloaded_version_never_used_is_removed_at_once() -> None:
    gw, executor = make_gateway()
    await gw.apply_state(ServingState(1, (served(), served("other"))))
    await asyncio.wait_for(gw.apply_state(ServingState(2, (served(),), failed=(("other", "unloaded"),))), 0.5)
    assert executor.removed == [ModelKey("other", 1, 1)]
    assert await gw.model_states() == [("m", 1, "READY", ""), ("other", "-", "UNAVAILABLE", "unloaded")]


async def test_a_scheduler_that_never_drains_is_removed_after_the_drain_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_module, "DRAIN_TIMEOUT_S", 0.05)
    gw, executor = make_gateway()
    await gw.apply_state(ServingState(1, (served(generation=1),)))
    gw.registry.resolve("m").scheduler = FakeScheduler()  # type: ignore[assignment]
    await asyncio.wait_for(gw.apply_state(ServingState(2, (served(generation=2),))), 10.0)
    assert executor.removed == [ModelKey("m", 1, 1)]


# -- warmup statistics --------------------------------------------------------------------------
async def test_warmups_of_added_versions_count_on_the_only_gateway() -> None:
    gw, executor = make_gateway(replicas=1)
    executor.handle.answers = [[(1, 10, 20, 30)], [(2, 1, 2, 3)], RuntimeError("a replica died"), []]
    await gw.apply_state(ServingState(1, (served(),)))
    stats = gw.service.local_stats()[ModelKey("m", 1)]
    assert (stats.execution_count, stats.inference_count) == (2, 3)
    assert executor.handle.broadcasts == ["warmup_figures"]


async def test_a_version_gets_its_scheduler_when_it_is_served_ready() -> None:
    gw, executor = make_gateway()
    executor.handle.answers = [[], []]
    await gw.apply_state(ServingState(1, (dataclasses.replace(served(), state="LOADING"),)))
    model = gw.registry.versions("m")[0]
    assert model.scheduler is None  # not served yet: nothing built
    await gw.apply_state(ServingState(2, (served(),)))
    assert gw.registry.versions("m")[0] is model and model.scheduler is not None


async def test_warmups_are_not_counted_again_when_a_version_only_changes_state() -> None:
    gw, executor = make_gateway()
    executor.handle.answers = [[(1, 10, 20, 30)]]
    await gw.apply_state(ServingState(1, (served(),)))
    await gw.apply_state(ServingState(2, (served(),)))
    assert executor.handle.broadcasts == ["warmup_figures"]
    assert gw.service.local_stats()[ModelKey("m", 1)].execution_count == 1


@pytest.mark.parametrize(
    ("context", "counted"),
    [
        (SimpleNamespace(rank=0), True),
        (SimpleNamespace(rank=SimpleNamespace(rank=0)), True),
        (SimpleNamespace(rank=1), False),
        (SimpleNamespace(rank=SimpleNamespace(rank=2)), False),
        (None, False),  # no replica context: raises
    ],
)
async def test_with_several_gateways_only_rank_zero_counts_warmups(
    monkeypatch: pytest.MonkeyPatch, context: Any, counted: bool
) -> None:
    from ray import serve

    def replica_context() -> Any:
        if context is None:
            raise RuntimeError("not in a replica")
        return context

    monkeypatch.setattr(serve, "get_replica_context", replica_context)
    gw, executor = make_gateway(replicas=2)
    executor.handle.answers = [[(1, 10, 20, 30)]]
    await gw.apply_state(ServingState(1, (served(),)))
    assert gw.service.local_stats()[ModelKey("m", 1)].execution_count == (1 if counted else 0)
    assert executor.handle.broadcasts == (["warmup_figures"] if counted else [])


async def test_capacity_changes_reach_the_versions_batcher() -> None:
    gw, _ = make_gateway()
    await gw.apply_state(ServingState(1, (served(),)))
    sched = gw.service.scheduler(gw.registry.resolve("m"))
    gw._capacity_changed(ModelKey("m", 1, 1), 4)
    assert sched.capacity == 4  # type: ignore[attr-defined]
