"""InferenceService: health, metadata, config, statistics and infer for both protocols."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from serve_app.config import ENSEMBLE_PLATFORM
from serve_app.errors import InvalidArgument, Unavailable
from serve_app.inference.classification import apply_classification, classification_count
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse
from serve_app.inference.validate import validate_request
from serve_app.protos import model_config_pb2 as mc
from serve_app.repository.api import IndexEntry, LoadParameters, RepositoryControl
from serve_app.scheduling.ensemble_scheduler import EnsembleScheduler
from serve_app.scheduling.model_scheduler import ModelScheduler
from serve_app.sequence.port import SequencePort
from serve_app.sequence.scheduler import SequenceScheduler
from serve_app.service.catalog import ModelCatalog, ModelState, ModelVersionEntry
from serve_app.stats import ModelStats

# In the order Triton's server metadata lists them (core's InferenceServer constructor).
EXTENSIONS: tuple[str, ...] = (
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
)

# Triton's answer to load / unload when model control is not explicit.
NO_MODEL_CONTROL = "explicit model load / unload is not allowed if polling is enabled"

StatsKey = tuple[str, str]  # (model, version)
SHUTTING_DOWN = "Server is shutting down: it accepts no new requests"
Scheduler = ModelScheduler | SequenceScheduler | EnsembleScheduler
StatsSource = Callable[[], Awaitable[dict[StatsKey, ModelStats]]]


class ModelExecutor(Protocol):
    """Where executions run: in process (tests, dev) or on Ray replicas."""

    def capacity(self, entry: ModelVersionEntry) -> int:
        """How many calls may be in flight to the model's instances at once."""
        ...

    async def execute(self, entry: ModelVersionEntry, executions: list[Execution]) -> list[ExecutionResult]: ...

    def sequence_port(self, entry: ModelVersionEntry) -> SequencePort:
        """How a sequence model's steps reach the router and its instances."""
        ...


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
        catalog: ModelCatalog,
        executor: ModelExecutor,
        *,
        server_name: str = "serve_app",
        server_version: str = "0.1.0",
        extensions: tuple[str, ...] = EXTENSIONS,
        repository: RepositoryControl | None = None,
    ) -> None:
        self.catalog = catalog
        self.executor = executor
        self._metadata = ServerMetadata(server_name, server_version, list(extensions))
        self.accepting = True
        self.inflight = 0  # client requests in progress (drained at shutdown)
        # Requests a model version's scheduler holds before shedding load with 503 / UNAVAILABLE (0: unbounded).
        self.max_queued = 0
        self._schedulers: dict[tuple[str, int, int], Scheduler] = {}
        # Where statistics come from: this process's schedulers, unless a host aggregates several.
        self.stats_source: StatsSource = self._local_stats
        # Who loads and unloads models on request; None: the repository is fixed (no model control).
        self.repository = repository

    # -- health --------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Ready while accepting and no served model is still loading."""
        return self.accepting and all(e.state is not ModelState.LOADING for e in self.catalog.all_entries())

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            return self.catalog.resolve(name, version).state is ModelState.READY
        except Exception:
            return False

    # -- metadata ------------------------------------------------------------
    def server_metadata(self) -> ServerMetadata:
        return self._metadata

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        entry = self.catalog.resolve(name, version)
        versions = [str(e.version) for e in self.catalog.versions(name)] if not version else [str(entry.version)]
        sig = entry.signature
        return ModelMetadata(
            name=name,
            versions=versions,
            platform=entry.config.platform,
            inputs=_tensor_metadata(sig, outputs=False),
            outputs=_tensor_metadata(sig, outputs=True),
        )

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self.catalog.resolve(name, version).config

    def signature(self, name: str, version: str = "") -> ModelSignature:
        return self.catalog.resolve_ready(name, version).signature

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        out: list[IndexEntry] = []
        for name in self.catalog.names():
            entries = self.catalog.versions(name)
            failed = self.catalog.failed(name)
            if not entries and failed is not None:
                if not ready_only:
                    version = "" if failed.version is None else str(failed.version)
                    out.append(IndexEntry(name, version, ModelState.UNAVAILABLE.value, failed.reason))
                continue
            for e in entries:
                if ready_only and e.state is not ModelState.READY:
                    continue
                out.append(IndexEntry(name, str(e.version), e.state.value, e.reason))
        return out

    # -- model repository extension -------------------------------------------
    async def repository_index_async(self, ready_only: bool = False) -> list[IndexEntry]:
        """The control's index when there is one (it knows models not loaded here), else the catalog's."""
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
    async def infer(self, request: InferRequest) -> InferResponse:
        """A client's request; refused once the server is shutting down, counted until answered."""
        if not self.accepting:
            raise Unavailable(SHUTTING_DOWN)
        self.inflight += 1
        try:
            return await self._infer(request)
        finally:
            self.inflight -= 1

    async def drain(self, timeout_s: float) -> int:
        """Stop accepting requests and wait (up to ``timeout_s``) for those in progress; returns how many
        were still running at the deadline."""
        import asyncio

        self.accepting = False
        deadline = time.monotonic() + timeout_s
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self.inflight

    async def _infer(self, request: InferRequest) -> InferResponse:
        arrival = time.monotonic_ns()
        entry = self.catalog.resolve_ready(request.model_name, request.model_version)
        batch_size = validate_request(request, entry.signature)
        classified = classification_count(request, entry.signature) if request.outputs else None
        request.model_version = str(entry.version)
        response = await self.scheduler(entry).submit(request, batch_size, arrival)
        if classified:
            apply_classification(response, classified, entry.labels, entry.signature.max_batch_size > 0)
        return response

    def scheduler(self, entry: ModelVersionEntry) -> Scheduler:
        """The version's scheduler: an ensemble's graph, the sequence batcher's router, or the (dynamic) batcher."""
        key = entry.key
        sched = self._schedulers.get(key)
        if sched is None and entry.config.platform == ENSEMBLE_PLATFORM:
            sched = EnsembleScheduler(entry.config, entry.signature, self._infer)
            self._schedulers[key] = sched
        elif sched is None and entry.config.HasField("sequence_batching"):
            sched = SequenceScheduler(entry.config, entry.signature, self.executor.sequence_port(entry))
            self._schedulers[key] = sched
        elif sched is None:
            sched = ModelScheduler(
                entry.config,
                entry.signature,
                functools.partial(self.executor.execute, entry),
                capacity=self.executor.capacity(entry),
                max_queued=self.max_queued,
            )
            self._schedulers[key] = sched
        return sched

    def retire(self, entry: ModelVersionEntry) -> Scheduler | None:
        """Stop routing to a replaced or unloaded version: its scheduler goes (it finishes what it holds)."""
        return self._schedulers.pop(entry.key, None)

    def set_capacity(self, key: tuple[str, int, int], capacity: int) -> None:
        """The version's instance count changed (autoscaling): its batcher may keep that many calls in flight."""
        sched = self._schedulers.get(key)
        if isinstance(sched, ModelScheduler):
            sched.capacity = max(1, capacity)

    # -- statistics ----------------------------------------------------------
    def record_warmup(self, entry: ModelVersionEntry, figures: list[tuple[int, int, int, int]]) -> None:
        """Count warmup executions ((batch size, compute input/infer/output ns) each) as Triton does."""
        stats = self.scheduler(entry).stats
        now_ms = time.time_ns() // 1_000_000
        for batch, ci, cf, co in figures:
            stats.record_execution(batch, ci, cf, co)
            stats.record_success(batch, ci + cf + co, 0, ci, cf, co, now_ms)

    def local_stats(self) -> dict[StatsKey, ModelStats]:
        """This process's figures (a copy), keyed by (model, version)."""
        return {(n, str(v)): s.stats.snapshot() for (n, v, _), s in self._schedulers.items()}

    async def _local_stats(self) -> dict[StatsKey, ModelStats]:
        return self.local_stats()

    def _stats_entries(self, name: str, version: str) -> list[ModelVersionEntry]:
        """The ready versions a statistics request names, with Triton's errors."""
        if not name:
            return [e for e in self.catalog.all_entries() if e.state is ModelState.READY]
        ready = [e for e in self.catalog.versions(name) if e.state is ModelState.READY]
        if not ready:
            raise InvalidArgument(f"requested model '{name}' is not available")
        if not version:
            return ready
        try:
            number = int(version)
        except ValueError:
            raise InvalidArgument(f"failed to parse model version '{version}' for model '{name}'") from None
        chosen = [e for e in ready if e.version == number]
        if not chosen:
            raise InvalidArgument(f"requested model '{name}' version {version} is not available")
        return chosen

    async def model_statistics(self, name: str = "", version: str = "") -> list[ModelStats]:
        """Cumulative statistics of the named (or every) ready model version, from every front end."""
        entries = self._stats_entries(name, version)
        figures = await self.stats_source()
        return [figures.get((e.name, str(e.version))) or ModelStats(e.name, str(e.version)) for e in entries]
