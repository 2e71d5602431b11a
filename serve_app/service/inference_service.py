"""InferenceService: health, metadata, config, statistics and infer for both protocols.

The front ends make the same calls: :meth:`InferenceService.model` resolves
the model a request names (once, with Triton's errors), the front end decodes
the request against its signature, and :meth:`InferenceService.infer`
validates it, reads its options and hands it to the version's scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from serve_app.cache_config import CacheConfig
from serve_app.config.decoupled import response_timeout_s
from serve_app.config.validate import PER_REQUEST_BACKENDS
from serve_app.errors import InvalidArgument, ServeError, Unavailable, as_serve_error
from serve_app.inference.classification import apply_classification
from serve_app.inference.custom_metrics import Collected
from serve_app.inference.execution import Execution, ExecutionResult, PartResult
from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, StreamItem
from serve_app.inference.validate import validate_request
from serve_app.keys import ModelKey, parse_version
from serve_app.metrics_options import MetricsOptions
from serve_app.observability import spans
from serve_app.observability.diagnostics import Diagnostics
from serve_app.protos import model_config_pb2 as mc
from serve_app.repository.api import IndexEntry, LoadParameters, RepositoryControl
from serve_app.scheduling.base import Scheduler
from serve_app.scheduling.decoupled_batcher import BatchedDecoupledScheduler, batches_decoupled
from serve_app.scheduling.decoupled_scheduler import DecoupledScheduler
from serve_app.scheduling.ensemble_scheduler import EnsembleScheduler
from serve_app.scheduling.model_scheduler import ModelScheduler
from serve_app.scheduling.rate_limiter import RateLimiter
from serve_app.scheduling.response_cache import ResponseCache
from serve_app.sequence.scheduler import SequenceScheduler
from serve_app.service.model_executor import ModelExecutor
from serve_app.service.registry import ModelRegistry, ModelState, ServedModel
from serve_app.shared_memory import SharedMemory
from serve_app.stats import ModelStats
from serve_app.stats.latency import Latencies
from serve_app.stats.on_demand import OnDemandStats
from serve_app.stats.prometheus import ModelMetrics

# In the order Triton's server metadata lists them (core's InferenceServer constructor).
EXTENSIONS: tuple[str, ...] = (
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)
# Listed, where Triton lists it, only when clients may register regions (--allow-client-shm).
SYSTEM_SHARED_MEMORY = "system_shared_memory"

# Triton's answer to load / unload when model control is not explicit.
NO_MODEL_CONTROL = "explicit model load / unload is not allowed if polling is enabled"

SHUTTING_DOWN = "Server is shutting down: it accepts no new requests"
StatsSource = Callable[[], Awaitable[dict[ModelKey, ModelStats]]]


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: list[int]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    name: str
    version: str
    extensions: list[str] = field(default_factory=list)


def _tensor_metadata(sig: ModelSignature, outputs: bool) -> list[TensorMetadata]:
    specs = sig.outputs if outputs else sig.inputs
    return [TensorMetadata(s.name, s.datatype.wire_name, sig.full_shape(s)) for s in specs.values()]


class InferenceService:
    def __init__(
        self,
        registry: ModelRegistry,
        executor: ModelExecutor,
        *,
        server_name: str = "serve_app",
        server_version: str = "0.1.0",
        extensions: tuple[str, ...] = EXTENSIONS,
        repository: RepositoryControl | None = None,
        max_queued: int = 0,
        metrics: MetricsOptions | None = None,
        cache: CacheConfig | None = None,
        rate_limits: Mapping[str, int] | None = None,
        stats_source: StatsSource | None = None,
        shared_memory: SharedMemory | None = None,
        diagnostics: Diagnostics | None = None,
        strict_readiness: bool = False,
    ) -> None:
        """``repository``: who loads and unloads models on request (None: the repository is fixed).
        ``max_queued``: requests a model version's scheduler holds before shedding load with 503 /
        UNAVAILABLE (0: unbounded).  ``metrics``: the latency metrics to keep (--metrics-config).
        ``cache``: the response cache (--cache-config) of the models that enable it.  ``rate_limits``: the
        rate limiter's explicit resource counts (None: --rate-limit off).
        ``stats_source``: where statistics come from (default: this process's schedulers; a host with
        several front-end processes adds theirs up).  ``shared_memory``:
        the system shared memory regions clients registered (default: the extension off).  ``diagnostics``:
        the trace and log settings (default: tracing off, settings changed in this process only).
        ``strict_readiness``: Triton's, ready only while every model is READY (see :meth:`ready`)."""
        self.strict_readiness = strict_readiness
        self.custom_metrics = Collected()  # what models' own metric families last reported
        self.registry = registry
        self.executor = executor
        self.repository = repository
        self.max_queued = max_queued
        self.metrics = metrics or MetricsOptions()
        self.cache = ResponseCache(cache.size_bytes) if cache is not None and cache.enabled else None
        self.limiter = RateLimiter(dict(rate_limits)) if rate_limits is not None else None
        self.stats_source: StatsSource = stats_source or self._local_stats
        self.shared_memory = shared_memory or SharedMemory()
        listed = list(extensions)
        if self.shared_memory.enabled and SYSTEM_SHARED_MEMORY not in listed:
            at = listed.index("model_configuration") + 1 if "model_configuration" in listed else len(listed)
            listed.insert(at, SYSTEM_SHARED_MEMORY)
        self._metadata = ServerMetadata(server_name, server_version, listed)
        self.accepting = True
        self.inflight = 0  # client requests in progress (drained at shutdown)
        self.diagnostics = diagnostics if diagnostics is not None else Diagnostics()
        self.diagnostics.model_ready = self.model_ready
        # Load on demand: loads a model no version of which is served, returns once it serves (None: off).
        self.on_demand: Callable[[str], Awaitable[None]] | None = None
        self.waited_for_load: dict[str, int] = {}  # by model: requests that waited for its load
        self.on_demand_stats: Callable[[], Awaitable[OnDemandStats]] | None = None  # for the metrics port

    def usage(self) -> dict[str, tuple[float | None, bool, int]]:
        """Each served model's use here: its last request (seconds since the epoch, None: none yet), whether
        requests are in flight or queued, and its live sequences."""
        out: dict[str, tuple[float | None, bool, int]] = {}
        for model in self.registry.all_models():
            sched = model.scheduler
            if sched is None:
                continue
            stats = sched.stats
            last = stats.last_inference_ms / 1000 if stats.last_inference_ms else None
            busy = not sched.drained() or stats.pending > 0
            sequences = sched.live_sequences if isinstance(sched, SequenceScheduler) else 0
            old_last, old_busy, old_sequences = out.get(model.name, (None, False, 0))
            if old_last is not None and (last is None or old_last > last):
                last = old_last
            out[model.name] = (last, busy or old_busy, sequences + old_sequences)
        return out

    async def model_after_miss(self, name: str, version: str, error: ServeError) -> ServedModel:
        """A request named a model :meth:`model` doesn't serve (``error``): with load on demand and no version of
        it served, load it, wait, and serve it; otherwise ``error``."""
        if self.on_demand is None or self.registry.versions(name):
            raise error
        try:
            await self.on_demand(name)
        except Exception as exc:
            raise as_serve_error(exc) from None
        # counted once it serves: a name the repository lacks must not add a series to the metrics page
        self.waited_for_load[name] = self.waited_for_load.get(name, 0) + 1
        return self.registry.resolve_ready(name, version)

    # -- health --------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Ready while accepting and no served model is still loading; with strict readiness (Triton's
        default), only while every model is READY: one that failed to load, or is unavailable, counts too."""
        if not self.accepting:
            return False
        models = self.registry.all_models()
        if self.strict_readiness:
            failed = any(
                self.registry.failed(n) is not None and not self.registry.versions(n) for n in self.registry.names()
            )
            return not failed and all(m.state is ModelState.READY for m in models)
        return all(m.state is not ModelState.LOADING for m in models)

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            return self.registry.resolve(name, version).state is ModelState.READY
        except Exception:
            return False

    # -- metadata ------------------------------------------------------------
    def server_metadata(self) -> ServerMetadata:
        return self._metadata

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        model = self.registry.resolve(name, version)
        versions = [str(m.version) for m in self.registry.versions(name)] if not version else [str(model.version)]
        sig = model.signature
        return ModelMetadata(
            name=name,
            versions=versions,
            platform=model.config.platform or model.config.backend,  # Triton's: the backend's name without one
            inputs=_tensor_metadata(sig, outputs=False),
            outputs=_tensor_metadata(sig, outputs=True),
        )

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self.registry.resolve(name, version).config

    def model(self, name: str, version: str = "") -> ServedModel:
        """The ready model version an inference request names (decode the request against its signature)."""
        return self.registry.resolve_ready(name, version)

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        out: list[IndexEntry] = []
        for name in self.registry.names():
            models = self.registry.versions(name)
            failed = self.registry.failed(name)
            if not models and failed is not None:
                if not ready_only:
                    version = "" if failed.version is None else str(failed.version)
                    out.append(IndexEntry(name, version, ModelState.UNAVAILABLE.value, failed.reason))
                continue
            for m in models:
                if ready_only and m.state is not ModelState.READY:
                    continue
                out.append(IndexEntry(name, str(m.version), m.state.value, m.reason))
        return out

    # -- model repository extension -------------------------------------------
    async def repository_index_async(self, ready_only: bool = False) -> list[IndexEntry]:
        """The control's index when there is one (it knows models not loaded here), else the registry's."""
        if self.repository is not None:
            return await self.repository.index(ready_only)
        return self.repository_index(ready_only)

    async def repository_load(self, name: str, params: LoadParameters) -> None:
        if self.repository is None:
            raise Unavailable(NO_MODEL_CONTROL)
        await self.repository.load(name, params)

    async def repository_unload(self, name: str, unload_dependents: bool) -> None:
        if self.repository is None:
            raise Unavailable(NO_MODEL_CONTROL)
        await self.repository.unload(name, unload_dependents)

    # -- inference -----------------------------------------------------------
    async def infer(self, model: ServedModel, request: InferRequest) -> InferResponse:
        """A client's request to ``model``; refused once the server is shutting down, counted until answered."""
        if not self.accepting:
            raise Unavailable(SHUTTING_DOWN)
        self.inflight += 1
        try:
            return await self._infer(model, request)
        finally:
            self.inflight -= 1

    async def infer_stream(self, model: ServedModel, request: InferRequest) -> AsyncGenerator[StreamItem, None]:
        """A request's responses as the model sends them (a decoupled model: zero or more, then the final
        flag; any other model: its one response, final).  Checks fail before the first item, as errors."""
        if not self.accepting:
            raise Unavailable(SHUTTING_DOWN)
        if not model.is_decoupled:
            yield StreamItem(await self.infer(model, request), final=True)
            return
        self.inflight += 1
        try:
            async with contextlib.aclosing(self._submit_stream(model, request)) as items:
                async for item in items:
                    yield item
        finally:
            self.inflight -= 1

    async def _submit_stream(self, model: ServedModel, request: InferRequest) -> AsyncGenerator[StreamItem, None]:
        """A decoupled model's (or ensemble's) responses to ``request``; checks fail before the first."""
        arrival = time.monotonic_ns()
        batch_size = validate_request(request, model.signature)
        options = RequestOptions.parse(request, model.signature, batch_size=batch_size, sequence_model=False)
        request.model_version = str(model.version)
        scheduler = self.scheduler(model)
        assert isinstance(scheduler, (DecoupledScheduler, BatchedDecoupledScheduler, EnsembleScheduler))
        async with contextlib.aclosing(scheduler.submit_stream(request, options, arrival)) as items:
            async for item in items:
                yield item

    async def drain(self, timeout_s: float) -> int:
        """Stop accepting requests and wait (up to ``timeout_s``) for those in progress; returns how many
        were still running at the deadline."""
        self.accepting = False
        deadline = time.monotonic() + timeout_s
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self.inflight

    async def _infer(self, model: ServedModel, request: InferRequest) -> InferResponse:
        parent = spans.current()
        if parent is None:  # not traced: the usual case
            return await self._run(model, request, None)
        span = parent.model_span(model.name, model.version, request.id)
        token = spans.activate(span)  # an ensemble's steps become children of its span
        try:
            return await self._run(model, request, span)
        finally:
            span.end("REQUEST_END")
            spans.deactivate(token)

    async def _run(self, model: ServedModel, request: InferRequest, span: spans.ActiveSpan | None) -> InferResponse:
        arrival = time.monotonic_ns()
        batch_size = validate_request(request, model.signature)
        options = RequestOptions.parse(
            request, model.signature, batch_size=batch_size, sequence_model=model.is_sequence
        )
        request.model_version = str(model.version)
        if span is not None:
            span.event("QUEUE_START")
        response = await self.scheduler(model).submit(request, options, arrival)
        if options.classification:
            apply_classification(response, options.classification, model.labels, model.signature.max_batch_size > 0)
        return response

    async def _step_stream(self, request: InferRequest) -> AsyncGenerator[StreamItem, None]:
        """An ensemble step: a request to the model the step names, as a client's would be; its responses
        (one, final, unless the model is decoupled)."""
        model = self.model(request.model_name, request.model_version)
        if not model.is_decoupled:
            yield StreamItem(await self._infer(model, request), final=True)
            return
        async with contextlib.aclosing(self._submit_stream(model, request)) as items:
            async for item in items:
                yield item

    def prepare(self, models: list[ServedModel]) -> None:
        """Build each ready version's scheduler as it starts being served, so that no request pays for it.
        A scheduler that can't be built yet (no sequence router runs) stays lazy: each request gets why."""
        for model in models:
            if model.state is ModelState.READY:
                with contextlib.suppress(ServeError):
                    self.scheduler(model)

    def scheduler(self, model: ServedModel) -> Scheduler:
        """The version's scheduler: an ensemble's graph, the sequence batcher's router, or the (dynamic) batcher."""
        if model.scheduler is not None:
            return model.scheduler
        sched: Scheduler
        if model.is_ensemble:
            sched = EnsembleScheduler(model.config, model.signature, self._step_stream)
        elif model.is_sequence:
            sched = SequenceScheduler(model.config, model.signature, self.executor.sequence_port(model.key))
        elif model.is_decoupled and batches_decoupled(model.config):
            sched = BatchedDecoupledScheduler(
                model.config,
                model.signature,
                functools.partial(self._stream, model.key),
                capacity=self.executor.capacity(model.key),
                response_timeout_s=response_timeout_s(model.config),
                max_queued=self.max_queued,
            )
        elif model.is_decoupled:
            sched = DecoupledScheduler(
                model.signature,
                functools.partial(self._stream, model.key),
                response_timeout_s=response_timeout_s(model.config),
            )
        else:
            sched = ModelScheduler(
                model.config,
                model.signature,
                functools.partial(self._execute, model.key),
                capacity=self.executor.capacity(model.key),
                max_queued=self.max_queued,
                per_request=model.config.backend in PER_REQUEST_BACKENDS,
                cache=self.cache if model.config.response_cache.enable else None,
                limiter=self.limiter,
            )
        sched.stats.latencies = Latencies.for_model(self.metrics, model.config)
        model.scheduler = sched
        return sched

    async def _execute(self, key: ModelKey, executions: list[Execution]) -> list[ExecutionResult]:
        """The executor's results, the custom metrics they carry kept for the metrics port."""
        results = await self.executor.execute(key, executions)
        for result in results:
            if result.custom_metrics is not None:
                self.custom_metrics.record(result.custom_metrics)
        return results

    async def _stream(self, key: ModelKey, execution: Execution) -> AsyncGenerator[tuple[int, PartResult], None]:
        """The executor's stream, the custom metrics its final responses carry kept for the metrics port."""
        async with contextlib.aclosing(self.executor.stream(key, execution)) as items:
            async for index, part in items:
                if part.custom_metrics is not None:
                    self.custom_metrics.record(part.custom_metrics)
                yield index, part

    def set_capacity(self, key: ModelKey, capacity: int) -> None:
        """The version's instance count changed (autoscaling): its batcher may keep that many calls in flight."""
        for model in self.registry.versions(key.name):
            if model.key == key and isinstance(model.scheduler, (ModelScheduler, BatchedDecoupledScheduler)):
                model.scheduler.capacity = max(1, capacity)

    # -- statistics ----------------------------------------------------------
    def record_warmup(self, model: ServedModel, figures: list[tuple[int, int, int, int]]) -> None:
        """Count warmup executions ((batch size, compute input/infer/output ns) each) as Triton does."""
        stats = self.scheduler(model).stats
        now_ms = time.time_ns() // 1_000_000
        for batch, ci, cf, co in figures:
            stats.record_execution(batch, ci, cf, co)
            stats.record_success(batch, ci + cf + co, 0, ci, cf, co, now_ms)

    def local_stats(self) -> dict[ModelKey, ModelStats]:
        """This process's figures (a copy), by version."""
        return {m.key.version_key: m.scheduler.stats.snapshot() for m in self.registry.all_models() if m.scheduler}

    async def _local_stats(self) -> dict[ModelKey, ModelStats]:
        return self.local_stats()

    def _stats_models(self, name: str, version: str) -> list[ServedModel]:
        """The ready versions a statistics request names, with Triton's errors."""
        if not name:
            return [m for m in self.registry.all_models() if m.state is ModelState.READY]
        ready = [m for m in self.registry.versions(name) if m.state is ModelState.READY]
        if not ready:
            raise InvalidArgument(f"requested model '{name}' is not available")
        if not version:
            return ready
        number = parse_version(version)
        chosen = [m for m in ready if m.version == number]
        if not chosen:
            raise InvalidArgument(f"requested model version is not available for model '{name}'")
        return chosen

    async def model_statistics(self, name: str = "", version: str = "") -> list[ModelStats]:
        """Cumulative statistics of the named (or every) ready model version, from every front end."""
        models = self._stats_models(name, version)
        figures = await self.stats_source()
        return [figures.get(m.key.version_key) or ModelStats(m.name, str(m.version)) for m in models]

    async def model_metrics(self) -> list[ModelMetrics]:
        """What the metrics port shows: each ready version's statistics, metric tags and instance count."""
        out = []
        for stats in await self.model_statistics():
            model = self.registry.resolve(stats.name, stats.version)
            if stats.latencies is None:  # no request yet: its histogram and summaries show empty
                stats.latencies = Latencies.for_model(self.metrics, model.config)
            instances = None if model.is_ensemble else self.executor.instances(model.key)
            cached = self.cache is not None and model.config.response_cache.enable and not model.is_ensemble
            out.append(ModelMetrics(stats, dict(model.config.metric_tags), instances, cached))
        return out
