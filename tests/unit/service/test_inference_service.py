"""InferenceService over a fake ModelExecutor and real configs: resolution, validation and options before
anything is queued (sequence models too), drain, statistics by version, metrics' instance counts, capacity."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest
from google.protobuf import text_format

from serve_app.errors import InternalError, InvalidArgument, NotFound, Unavailable
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.inference.types import InferRequest, InferTensor, ParamValue
from serve_app.keys import ModelKey
from serve_app.protos import model_config_pb2 as mc
from serve_app.repository.api import IndexEntry, LoadParameters
from serve_app.scheduling.model_scheduler import ModelScheduler
from serve_app.service import FailedModel, InferenceService, ModelRegistry, ModelState, ServedModel
from serve_app.service.inference_service import NO_MODEL_CONTROL, SHUTTING_DOWN
from serve_app.stats import ModelStats

WIDTH = 2


def config(name: str = "m", extra: str = "") -> mc.ModelConfig:
    """INPUT0 -> OUTPUT0 (= INPUT0 + 1)."""
    return text_format.Parse(
        f"""
        name: "{name}"
        max_batch_size: 8
        input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [{WIDTH}] }}]
        output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [{WIDTH}] }}]
        {extra}
        """,
        mc.ModelConfig(),
    )


def ensemble_config(name: str = "e", step: str = "m") -> mc.ModelConfig:
    return text_format.Parse(
        f"""
        name: "{name}"
        platform: "ensemble"
        max_batch_size: 8
        input [{{ name: "IN" data_type: TYPE_FP32 dims: [{WIDTH}] }}]
        output [{{ name: "OUT" data_type: TYPE_FP32 dims: [{WIDTH}] }}]
        ensemble_scheduling {{ step [{{
          model_name: "{step}" model_version: -1
          input_map {{ key: "INPUT0" value: "IN" }} output_map {{ key: "OUTPUT0" value: "OUT" }}
        }}] }}
        """,
        mc.ModelConfig(),
    )


class FakeExecutor:
    """Runs OUTPUT0 = INPUT0 + 1; ``blocked`` holds every call until ``gate`` is set."""

    def __init__(self, *, blocked: bool = False) -> None:
        self.calls: list[tuple[ModelKey, list[Execution]]] = []
        self.gate = asyncio.Event()
        if not blocked:
            self.gate.set()
        self.counts: dict[ModelKey, int] = {}
        self.ports: list[ModelKey] = []

    def capacity(self, key: ModelKey) -> int:
        return 2

    def instances(self, key: ModelKey) -> int:
        return self.counts.get(key, 1)

    async def execute(self, key: ModelKey, executions: list[Execution]) -> list[ExecutionResult]:
        self.calls.append((key, executions))
        await self.gate.wait()
        return [ExecutionResult(outputs={"OUTPUT0": e.inputs["INPUT0"] + 1}) for e in executions]

    def sequence_port(self, key: ModelKey) -> object:
        self.ports.append(key)
        raise AssertionError("the request should have been refused before its scheduler was made")


def request(name: str = "m", version: str = "", value: float = 1.0, **params: ParamValue) -> InferRequest:
    data = np.full((1, WIDTH), value, dtype=np.float32)
    return InferRequest(
        name, version, inputs=[InferTensor("INPUT0", "FP32", (1, WIDTH), data)], parameters=dict(params)
    )


def make_service(*models: ServedModel, executor: FakeExecutor | None = None, **options: object) -> InferenceService:
    registry = ModelRegistry()
    for model in models:
        registry.add(model)
    return InferenceService(registry, executor or FakeExecutor(), **options)  # type: ignore[arg-type]


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


@pytest.fixture
def executor() -> FakeExecutor:
    return FakeExecutor()


@pytest.fixture
def service(executor: FakeExecutor) -> InferenceService:
    svc = make_service(
        ServedModel.create("m", 1, config(), generation=7),
        ServedModel.create("m", 2, config(), generation=7),
        ServedModel.create("slow", 1, config("slow"), state=ModelState.LOADING),
        executor=executor,
    )
    svc.registry.add_failed(FailedModel("broken", "bad config"))
    return svc


# -- model() --------------------------------------------------------------------------------------
def test_model_is_the_newest_ready_version(service: InferenceService) -> None:
    assert service.model("m").key == ModelKey("m", 2, 7)
    assert service.model("m", "1").key == ModelKey("m", 1, 7)


@pytest.mark.parametrize(
    ("name", "version", "error", "message"),
    [
        ("x", "", NotFound, "Request for unknown model: 'x' is not found"),
        ("m", "5", NotFound, "Request for unknown model: 'm' version 5 is not found"),
        (
            "m",
            "one",
            InvalidArgument,
            "failed to get model version from specified version string 'one' (details: stol), version should be an "
            "integral value > 0",
        ),
        ("broken", "", Unavailable, "Request for unknown model: 'broken' has no available versions: bad config"),
        ("slow", "", Unavailable, "Request for unknown model: 'slow' version 1 is not at ready state"),
    ],
)
def test_model_resolution_errors(
    service: InferenceService, name: str, version: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as exc:
        service.model(name, version)
    assert str(exc.value) == message
    assert not service.model_ready(name, version)


def test_ready_waits_for_loading_models() -> None:
    loading = ServedModel.create("m", 1, config(), state=ModelState.LOADING)
    svc = make_service(loading)
    assert svc.live() and not svc.ready()
    loading.state = ModelState.READY
    assert svc.ready()


def test_strict_readiness_needs_every_model_ready() -> None:
    """Triton's --strict-readiness: a model that failed to load, or a version not READY, makes the server not
    ready; without it, a failed model does not."""
    model = ServedModel.create("m", 1, config())
    strict = make_service(model, strict_readiness=True)
    relaxed = make_service(model)
    assert strict.ready() and relaxed.ready()
    model.state = ModelState.UNAVAILABLE
    assert not strict.ready() and relaxed.ready()
    model.state = ModelState.READY
    for svc in (strict, relaxed):
        svc.registry.add_failed(FailedModel("broken", "bad config"))
    assert not strict.ready() and relaxed.ready()


# -- infer() ----------------------------------------------------------------------------------------
async def test_infer_runs_the_version_on_the_executor(service: InferenceService, executor: FakeExecutor) -> None:
    response = await service.infer(service.model("m"), request(value=3.0))
    assert response.model_version == "2"
    np.testing.assert_array_equal(response.outputs[0].data, np.full((1, WIDTH), 4.0, np.float32))
    assert [key for key, _ in executor.calls] == [ModelKey("m", 2, 7)]
    assert service.inflight == 0


async def test_invalid_request_never_reaches_the_executor(service: InferenceService, executor: FakeExecutor) -> None:
    bad = request()
    bad.inputs[0].datatype = "INT32"
    with pytest.raises(InvalidArgument):
        await service.infer(service.model("m"), bad)
    assert executor.calls == [] and service.inflight == 0 and service.model("m").scheduler is None


@pytest.mark.parametrize("priority", ["high", -1, True, 2.5, 2**64])
async def test_malformed_priority_is_refused_before_queueing(
    service: InferenceService, executor: FakeExecutor, priority: ParamValue
) -> None:
    with pytest.raises(InvalidArgument, match=r"parameter 'priority' of the request for model 'm' must be an unsigned"):
        await service.infer(service.model("m"), request(priority=priority))
    assert executor.calls == [] and service.model("m").scheduler is None


@pytest.mark.parametrize("priority", ["high", -1, True])
async def test_malformed_priority_is_refused_for_a_sequence_model_too(priority: ParamValue) -> None:
    executor = FakeExecutor()
    seq = ServedModel.create("seq", 1, config("seq", "sequence_batching { direct { } }"))
    svc = make_service(seq, executor=executor)
    assert seq.is_sequence
    with pytest.raises(InvalidArgument, match=r"parameter 'priority' of the request for model 'seq' must be an unsign"):
        await svc.infer(seq, request("seq", sequence_id=1, sequence_start=True, priority=priority))
    assert executor.ports == [] and seq.scheduler is None


async def test_sequence_model_request_without_correlation_id_is_refused() -> None:
    seq = ServedModel.create("seq", 1, config("seq", "sequence_batching { direct { } }"))
    svc = make_service(seq)
    with pytest.raises(InvalidArgument, match="must specify a non-zero or non-empty correlation ID"):
        await svc.infer(seq, request("seq"))


async def test_malformed_timeout_is_refused(service: InferenceService) -> None:
    with pytest.raises(InvalidArgument, match=r"parameter 'timeout' of the request for model 'm'"):
        await service.infer(service.model("m"), request(timeout="soon"))


# -- drain() ----------------------------------------------------------------------------------------
async def test_drain_waits_for_requests_in_progress_then_refuses_new_ones() -> None:
    executor = FakeExecutor(blocked=True)
    svc = make_service(ServedModel.create("m", 1, config()), executor=executor)
    task = asyncio.create_task(svc.infer(svc.model("m"), request()))
    await until(lambda: bool(executor.calls))
    draining = asyncio.create_task(svc.drain(30.0))
    await asyncio.sleep(0.03)
    assert not draining.done() and not svc.accepting and not svc.ready()
    executor.gate.set()
    assert await draining == 0
    assert (await task).model_version == "1"
    with pytest.raises(Unavailable, match=SHUTTING_DOWN):
        await svc.infer(svc.model("m"), request())


async def test_drain_returns_how_many_are_still_running_at_the_deadline() -> None:
    executor = FakeExecutor(blocked=True)
    svc = make_service(ServedModel.create("m", 1, config()), executor=executor)
    tasks = [asyncio.create_task(svc.infer(svc.model("m"), request())) for _ in range(2)]
    await until(lambda: bool(executor.calls))
    assert await svc.drain(0.03) == 2
    executor.gate.set()
    await asyncio.gather(*tasks)
    assert svc.inflight == 0


# -- statistics -------------------------------------------------------------------------------------
async def test_local_statistics_are_keyed_by_version_whatever_the_generation(service: InferenceService) -> None:
    await service.infer(service.model("m", "1"), request())
    figures = service.local_stats()
    assert list(figures) == [ModelKey("m", 1)]
    assert figures[ModelKey("m", 1)].inference_count == 1
    assert figures[ModelKey("m", 1)] is not service.model("m", "1").scheduler.stats  # type: ignore[union-attr]


async def test_statistics_from_the_source_reach_a_new_generation() -> None:
    async def source() -> dict[ModelKey, ModelStats]:
        return {ModelKey("m", 1): ModelStats("m", "1", inference_count=5)}

    svc = make_service(ServedModel.create("m", 1, config(), generation=9), stats_source=source)
    [stats] = await svc.model_statistics("m")
    assert (stats.name, stats.version, stats.inference_count) == ("m", "1", 5)


async def test_statistics_of_versions_never_used_are_empty(service: InferenceService) -> None:
    stats = await service.model_statistics()
    assert [(s.name, s.version, s.inference_count) for s in stats] == [("m", "1", 0), ("m", "2", 0)]


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("slow", "", "requested model 'slow' is not available"),
        ("x", "", "requested model 'x' is not available"),
        ("m", "3", "requested model version is not available for model 'm'"),
        (
            "m",
            "v",
            "failed to get model version from specified version string 'v' (details: stol), version should be an "
            "integral value > 0",
        ),
    ],
)
async def test_statistics_errors(service: InferenceService, name: str, version: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        await service.model_statistics(name, version)
    assert str(exc.value) == message


def test_warmup_figures_count_as_executions_and_inferences(service: InferenceService) -> None:
    model = service.model("m", "1")
    service.record_warmup(model, [(2, 10, 20, 30), (1, 1, 2, 3)])
    stats = service.local_stats()[ModelKey("m", 1)]
    assert (stats.execution_count, stats.inference_count) == (2, 3)
    assert stats.inference["compute_infer"].ns == 22


# -- metrics and capacity ---------------------------------------------------------------------------
async def test_metrics_show_instance_counts_and_none_for_ensembles(executor: FakeExecutor) -> None:
    m = ServedModel.create("m", 1, config(extra='metric_tags { key: "team" value: "vision" }'), generation=3)
    svc = make_service(
        m,
        ServedModel.create("e", 1, ensemble_config()),
        ServedModel.create("slow", 1, config("slow"), state=ModelState.LOADING),
        executor=executor,
    )
    executor.counts[ModelKey("m", 1, 3)] = 3
    metrics = {(x.stats.name, x.stats.version): x for x in await svc.model_metrics()}
    assert set(metrics) == {("e", "1"), ("m", "1")}
    assert metrics[("m", "1")].instances == 3 and dict(metrics[("m", "1")].tags) == {"team": "vision"}
    assert metrics[("e", "1")].instances is None


def test_set_capacity_changes_only_that_loads_batcher(service: InferenceService) -> None:
    model = service.model("m", "1")
    sched = service.scheduler(model)
    assert isinstance(sched, ModelScheduler) and sched.capacity == 2
    service.set_capacity(ModelKey("m", 1, 7), 6)
    assert sched.capacity == 6
    service.set_capacity(ModelKey("m", 1, 8), 9)  # another generation: not this one
    assert sched.capacity == 6
    service.set_capacity(ModelKey("m", 1, 7), 0)
    assert sched.capacity == 1


def test_set_capacity_before_the_scheduler_exists_is_harmless(service: InferenceService) -> None:
    service.set_capacity(ModelKey("m", 2, 7), 4)
    assert service.model("m").scheduler is None


# -- repository -------------------------------------------------------------------------------------
def test_index_lists_failed_models_without_a_version(service: InferenceService) -> None:
    assert service.repository_index() == [
        IndexEntry("broken", "", "UNAVAILABLE", "bad config"),
        IndexEntry("m", "1", "READY", ""),
        IndexEntry("m", "2", "READY", ""),
        IndexEntry("slow", "1", "LOADING", ""),
    ]
    assert [(e.name, e.version) for e in service.repository_index(ready_only=True)] == [("m", "1"), ("m", "2")]


async def test_load_and_unload_need_a_repository_control(service: InferenceService) -> None:
    with pytest.raises(Unavailable, match=NO_MODEL_CONTROL):
        await service.repository_load("m", LoadParameters())
    with pytest.raises(Unavailable, match=NO_MODEL_CONTROL):
        await service.repository_unload("m", False)


def test_model_metadata_platform_is_the_backend_for_a_backend_model() -> None:
    """Triton's metadata: the config's platform, else its backend (a Python model says "python")."""
    svc = make_service(
        ServedModel.create("py", 1, config("py", 'backend: "python"')),
        ServedModel.create("e", 1, ensemble_config()),
        ServedModel.create("m", 1, config()),
    )
    assert svc.model_metadata("py").platform == "python"
    assert svc.model_metadata("e").platform == "ensemble"
    assert svc.model_metadata("m").platform == ""


# -- prepare() ------------------------------------------------------------------------------------
def test_prepare_builds_the_schedulers_of_ready_versions_before_any_request() -> None:
    ready = ServedModel.create("m", 1, config())
    loading = ServedModel.create("slow", 1, config("slow"), state=ModelState.LOADING)
    ensemble = ServedModel.create("e", 1, ensemble_config())
    svc = make_service(ready, loading, ensemble)
    svc.prepare([ready, loading, ensemble])
    assert isinstance(ready.scheduler, ModelScheduler) and ensemble.scheduler is not None
    assert loading.scheduler is None


class NoRouterExecutor(FakeExecutor):
    """As the Ray executor where no sequence router runs."""

    def sequence_port(self, key: ModelKey) -> object:
        self.ports.append(key)
        raise InternalError(f"model '{key.name}' has sequence batching but no sequence router runs")


async def test_a_scheduler_that_cannot_be_built_at_load_stays_lazy_and_each_request_gets_why() -> None:
    seq = ServedModel.create("s", 1, config("s", "sequence_batching {}"))
    executor = NoRouterExecutor()
    svc = make_service(seq, executor=executor)
    svc.prepare([seq])  # nothing raised here
    assert seq.scheduler is None and executor.ports == [seq.key]
    with pytest.raises(InternalError, match="no sequence router runs"):
        await svc.infer(seq, request("s", sequence_id=1))
