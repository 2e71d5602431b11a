"""Cumulative statistics of one model version, as Triton keeps them.

Counts follow Triton's aggregator: ``inference_count`` sums the batch sizes of
successful requests; ``execution_count`` counts model executions; each
successful request adds its whole batch's compute durations to
``compute_input/infer/output`` (so under dynamic batching their counts exceed
``execution_count``), while ``batch_stats`` gets one entry per execution.
Snapshots merge by addition, so the figures of every gateway (and through them
of every replica) add up to the model's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from serve_app.stats.latency import Latencies

# nv_inference_request_failure's ``reason`` label values.
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

INFER_FIELDS = (
    "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss"
)  # fmt: skip
BATCH_FIELDS = ("compute_input", "compute_infer", "compute_output")
RESPONSE_FIELDS = ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def merge(self, other: Duration) -> None:
        self.count += other.count
        self.ns += other.ns


def _durations(names: tuple[str, ...]) -> dict[str, Duration]:
    return {n: Duration() for n in names}


def _merge_table(into: dict[str, Duration], other: dict[str, Duration]) -> None:
    for k, d in other.items():
        into.setdefault(k, Duration()).merge(d)


@dataclass(slots=True)
class ModelStats:
    name: str
    version: str
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    inference: dict[str, Duration] = field(default_factory=lambda: _durations(INFER_FIELDS))
    batches: dict[int, dict[str, Duration]] = field(default_factory=dict)  # batch size -> compute durations
    responses: dict[str, dict[str, Duration]] = field(default_factory=dict)  # response index -> durations
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    pending: int = 0  # requests queued and not yet sent to an instance (a gauge)
    latencies: Latencies | None = None  # histogram and summaries, when --metrics-config enables them

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.execution_count += 1
        table = self.batches.get(batch_size)
        if table is None:
            table = self.batches[batch_size] = _durations(BATCH_FIELDS)
        table["compute_input"].add(input_ns)
        table["compute_infer"].add(infer_ns)
        table["compute_output"].add(output_ns)

    def record_success(
        self,
        batch_size: int,
        duration_ns: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        now_ms: int,
        *,
        first_response: bool = True,
    ) -> None:
        """``first_response``: the request's one response is its first (a decoupled model's first response
        is recorded on its own, :meth:`record_first_response`)."""
        inf = self.inference
        self.inference_count += batch_size
        inf["success"].add(duration_ns)
        inf["queue"].add(queue_ns)
        inf["compute_input"].add(input_ns)
        inf["compute_infer"].add(infer_ns)
        inf["compute_output"].add(output_ns)
        resp = self.responses.get("0")
        if resp is None:
            resp = self.responses["0"] = _durations(RESPONSE_FIELDS)
        resp["compute_infer"].add(infer_ns)
        resp["compute_output"].add(output_ns)
        resp["success"].add(infer_ns + output_ns)
        if now_ms > self.last_inference_ms:
            self.last_inference_ms = now_ms
        if self.latencies is not None:
            if first_response:
                self.latencies.observe_first_response(duration_ns)
            durations = {
                "request": duration_ns, "queue": queue_ns, "compute_input": input_ns, "compute_infer": infer_ns,
                "compute_output": output_ns,
            }  # fmt: skip
            self.latencies.observe_request(durations, now_ms)

    def record_first_response(self, since_arrival_ns: int) -> None:
        if self.latencies is not None:
            self.latencies.observe_first_response(since_arrival_ns)

    def record_cache_hit(self, duration_ns: int, queue_ns: int, lookup_ns: int, now_ms: int) -> None:
        """A request answered from the response cache, counted as Triton counts it: a success, its duration
        and queue time, a cache hit; not an inference nor an execution."""
        inf = self.inference
        inf["success"].add(duration_ns)
        inf["queue"].add(queue_ns)
        inf["cache_hit"].add(lookup_ns)
        if now_ms > self.last_inference_ms:
            self.last_inference_ms = now_ms
        self.record_first_response(duration_ns)

    def record_cache_miss(self, miss_ns: int) -> None:
        """A computed answer stored in the cache: its lookup and insert time, also added to the request's
        duration (Triton's accounting)."""
        self.inference["cache_miss"].add(miss_ns)
        self.inference["success"].ns += miss_ns

    def record_failure(self, reason: str, duration_ns: int, now_ms: int, *, executed_ns: int | None = None) -> None:
        """A failed request; ``executed_ns`` (infer + output time) when it failed in an execution."""
        self.inference["fail"].add(duration_ns)
        self.failures[reason] = self.failures.get(reason, 0) + 1
        if executed_ns is not None:
            resp = self.responses.get("0")
            if resp is None:
                resp = self.responses["0"] = _durations(RESPONSE_FIELDS)
            resp["fail"].add(executed_ns)
        if now_ms > self.last_inference_ms:
            self.last_inference_ms = now_ms

    def merge(self, other: ModelStats) -> None:
        """Add ``other``'s figures to these (same model and version)."""
        self.last_inference_ms = max(self.last_inference_ms, other.last_inference_ms)
        self.inference_count += other.inference_count
        self.execution_count += other.execution_count
        _merge_table(self.inference, other.inference)
        for size, table in other.batches.items():
            _merge_table(self.batches.setdefault(size, _durations(BATCH_FIELDS)), table)
        for key, table in other.responses.items():
            _merge_table(self.responses.setdefault(key, _durations(RESPONSE_FIELDS)), table)
        for reason, n in other.failures.items():
            self.failures[reason] = self.failures.get(reason, 0) + n
        self.pending += other.pending
        if other.latencies is not None:
            if self.latencies is None:
                self.latencies = Latencies()
            self.latencies.merge(other.latencies)

    def snapshot(self) -> ModelStats:
        return copy.deepcopy(self)

    @property
    def failure_count(self) -> int:
        return self.inference["fail"].count
