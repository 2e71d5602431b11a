"""Per-model statistics (ModelStats) and their statistics-extension forms: Triton's JSON and the gRPC message."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format

from serve_app.protocol.stats_codec import stats_to_json, stats_to_proto
from serve_app.protos import grpc_service_pb2 as pb
from serve_app.stats import FAILURE_REASONS, Duration, ModelStats

INFER_FIELDS = (
    "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss"
)  # fmt: skip
RESPONSE_FIELDS = ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")


def d(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


ZERO = d(0, 0)


def durations(stats: dict[str, Duration]) -> dict[str, tuple[int, int]]:
    return {k: (v.count, v.ns) for k, v in stats.items()}


def sample_stats() -> ModelStats:
    """Two executions (batch 3, then batch 1) carrying four requests, and two failures."""
    s = ModelStats("simple", "2")
    s.record_execution(3, 10, 100, 20)
    s.record_success(2, 5_000, 1_000, 10, 100, 20, now_ms=1_700_000_000_001)
    s.record_success(1, 6_000, 1_500, 10, 100, 20, now_ms=1_700_000_000_002)
    s.record_execution(1, 7, 70, 14)
    s.record_success(1, 4_000, 500, 7, 70, 14, now_ms=1_700_000_000_003)
    s.record_failure("REJECTED", 300, now_ms=1_700_000_000_004)
    s.record_failure("BACKEND", 2_000, now_ms=1_700_000_000_000, executed_ns=90)
    return s


# -- ModelStats --------------------------------------------------------------------
def test_new_stats_are_zero() -> None:
    s = ModelStats("m", "1")
    assert (s.name, s.version) == ("m", "1")
    assert s.last_inference_ms == 0
    assert s.inference_count == 0
    assert s.execution_count == 0
    assert durations(s.inference) == dict.fromkeys(INFER_FIELDS, (0, 0))
    assert s.batches == {}
    assert s.responses == {}
    assert s.failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    assert s.pending == 0
    assert s.failure_count == 0


def test_failure_reasons_are_tritons() -> None:
    assert FAILURE_REASONS == ("REJECTED", "CANCELED", "BACKEND", "OTHER")


def test_record_execution_counts_per_batch_size() -> None:
    s = ModelStats("m", "1")
    s.record_execution(4, 10, 20, 30)
    s.record_execution(4, 1, 2, 3)
    s.record_execution(1, 5, 6, 7)
    assert s.execution_count == 3
    assert sorted(s.batches) == [1, 4]
    assert durations(s.batches[4]) == {"compute_input": (2, 11), "compute_infer": (2, 22), "compute_output": (2, 33)}
    assert durations(s.batches[1]) == {"compute_input": (1, 5), "compute_infer": (1, 6), "compute_output": (1, 7)}
    # executions alone are not inferences
    assert s.inference_count == 0
    assert s.inference["success"].count == 0


def test_record_success() -> None:
    s = ModelStats("m", "1")
    s.record_success(3, 5_000, 1_000, 10, 100, 20, now_ms=42)
    assert s.inference_count == 3  # the request's batch size
    assert s.execution_count == 0  # counted by record_execution
    assert durations(s.inference) == {
        "success": (1, 5_000),
        "fail": (0, 0),
        "queue": (1, 1_000),
        "compute_input": (1, 10),
        "compute_infer": (1, 100),
        "compute_output": (1, 20),
        "cache_hit": (0, 0),
        "cache_miss": (0, 0),
    }
    assert list(s.responses) == ["0"]
    assert durations(s.responses["0"]) == {
        "compute_infer": (1, 100),
        "compute_output": (1, 20),
        "success": (1, 120),
        "fail": (0, 0),
        "empty_response": (0, 0),
        "cancel": (0, 0),
    }
    assert s.last_inference_ms == 42
    assert s.failures == dict.fromkeys(FAILURE_REASONS, 0)


def test_each_request_of_a_batch_adds_the_batch_compute_times() -> None:
    s = ModelStats("m", "1")
    s.record_execution(2, 10, 100, 20)
    for _ in range(2):
        s.record_success(1, 1_000, 0, 10, 100, 20, now_ms=1)
    assert s.execution_count == 1
    assert s.inference_count == 2
    assert s.inference["compute_infer"].count == 2  # exceeds execution_count under batching
    assert s.inference["compute_infer"].ns == 200
    assert s.batches[2]["compute_infer"].count == 1


def test_record_failure_without_execution() -> None:
    s = ModelStats("m", "1")
    s.record_failure("REJECTED", 700, now_ms=9)
    assert s.inference["fail"].count == 1
    assert s.inference["fail"].ns == 700
    assert s.failure_count == 1
    assert s.failures == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    assert s.responses == {}  # never executed: no response statistics
    assert s.inference_count == 0
    assert s.inference["success"].count == 0
    assert s.last_inference_ms == 9


def test_record_failure_in_an_execution() -> None:
    s = ModelStats("m", "1")
    s.record_failure("BACKEND", 700, now_ms=9, executed_ns=50)
    s.record_failure("OTHER", 300, now_ms=10, executed_ns=0)
    assert s.failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 1}
    assert s.inference["fail"].count == 2
    assert s.inference["fail"].ns == 1_000
    assert durations(s.responses["0"])["fail"] == (2, 50)
    assert durations(s.responses["0"])["success"] == (0, 0)


def test_last_inference_keeps_the_latest() -> None:
    s = ModelStats("m", "1")
    s.record_success(1, 1, 0, 0, 0, 0, now_ms=100)
    s.record_success(1, 1, 0, 0, 0, 0, now_ms=50)
    assert s.last_inference_ms == 100
    s.record_failure("OTHER", 1, now_ms=70)
    assert s.last_inference_ms == 100
    s.record_failure("OTHER", 1, now_ms=170)
    assert s.last_inference_ms == 170


def test_merge_adds_figures() -> None:
    a = sample_stats()
    a.pending = 2
    b = ModelStats("simple", "2", last_inference_ms=5)
    b.record_execution(3, 1, 2, 3)
    b.record_execution(8, 4, 5, 6)
    b.record_success(3, 900, 90, 1, 2, 3, now_ms=6)
    b.record_failure("REJECTED", 10, now_ms=7)
    b.record_failure("CANCELED", 20, now_ms=8)
    b.pending = 1

    a.merge(b)
    assert a.last_inference_ms == 1_700_000_000_004  # the max, not a sum
    assert a.inference_count == 4 + 3
    assert a.execution_count == 2 + 2
    assert durations(a.inference) == {
        "success": (4, 15_900),
        "fail": (4, 2_330),
        "queue": (4, 3_090),
        "compute_input": (4, 28),
        "compute_infer": (4, 272),
        "compute_output": (4, 57),
        "cache_hit": (0, 0),
        "cache_miss": (0, 0),
    }
    assert sorted(a.batches) == [1, 3, 8]
    assert durations(a.batches[3]) == {"compute_input": (2, 11), "compute_infer": (2, 102), "compute_output": (2, 23)}
    assert durations(a.batches[8]) == {"compute_input": (1, 4), "compute_infer": (1, 5), "compute_output": (1, 6)}
    assert durations(a.batches[1]) == {"compute_input": (1, 7), "compute_infer": (1, 70), "compute_output": (1, 14)}
    assert durations(a.responses["0"]) == {
        "compute_infer": (4, 272),
        "compute_output": (4, 57),
        "success": (4, 329),
        "fail": (1, 90),
        "empty_response": (0, 0),
        "cancel": (0, 0),
    }
    assert a.failures == {"REJECTED": 2, "CANCELED": 1, "BACKEND": 1, "OTHER": 0}
    assert a.failure_count == 4
    assert a.pending == 3


def test_merge_leaves_the_other_untouched() -> None:
    a, b = ModelStats("m", "1"), sample_stats()
    before = b.snapshot()
    a.merge(b)
    assert b == before
    a.record_execution(3, 1, 1, 1)
    assert b.batches[3]["compute_input"].count == 1  # no shared tables


def test_merge_into_empty_equals_the_other() -> None:
    a, b = ModelStats("simple", "2"), sample_stats()
    a.merge(b)
    assert a == b


def test_merge_keeps_the_later_last_inference() -> None:
    a = ModelStats("m", "1", last_inference_ms=10)
    b = ModelStats("m", "1", last_inference_ms=3)
    a.merge(b)
    assert a.last_inference_ms == 10
    b.merge(ModelStats("m", "1", last_inference_ms=30))
    assert b.last_inference_ms == 30


def test_snapshot_is_a_deep_copy() -> None:
    s = sample_stats()
    snap = s.snapshot()
    assert snap == s
    s.record_execution(3, 1, 1, 1)
    s.record_success(1, 1, 1, 1, 1, 1, now_ms=1)
    s.record_failure("OTHER", 1, now_ms=1)
    assert snap.execution_count == 2
    assert snap.batches[3]["compute_input"].count == 1
    assert snap.inference["success"].count == 3
    assert snap.failures["OTHER"] == 0


# -- JSON ---------------------------------------------------------------------------
def test_json_shape() -> None:
    out = stats_to_json([sample_stats()])
    assert out == {
        "model_stats": [
            {
                "name": "simple",
                "version": "2",
                "last_inference": 1_700_000_000_004,
                "inference_count": 4,
                "execution_count": 2,
                "inference_stats": {
                    "success": d(3, 15_000),
                    "fail": d(2, 2_300),
                    "queue": d(3, 3_000),
                    "compute_input": d(3, 27),
                    "compute_infer": d(3, 270),
                    "compute_output": d(3, 54),
                    "cache_hit": ZERO,
                    "cache_miss": ZERO,
                },
                "response_stats": {
                    "0": {
                        "compute_infer": d(3, 270),
                        "compute_output": d(3, 54),
                        "success": d(3, 324),
                        "fail": d(1, 90),
                        "empty_response": ZERO,
                        "cancel": ZERO,
                    }
                },
                "batch_stats": [
                    {"batch_size": 1, "compute_input": d(1, 7), "compute_infer": d(1, 70), "compute_output": d(1, 14)},
                    {
                        "batch_size": 3,
                        "compute_input": d(1, 10),
                        "compute_infer": d(1, 100),
                        "compute_output": d(1, 20),
                    },
                ],
                "memory_usage": [],
            }
        ]
    }
    json.dumps(out)  # serializable as is


def test_json_of_unused_model() -> None:
    out = stats_to_json([ModelStats("m", "1")])
    assert out == {
        "model_stats": [
            {
                "name": "m",
                "version": "1",
                "last_inference": 0,
                "inference_count": 0,
                "execution_count": 0,
                "inference_stats": dict.fromkeys(INFER_FIELDS, ZERO),
                "response_stats": {},
                "batch_stats": [],
                "memory_usage": [],
            }
        ]
    }


def test_json_batch_stats_sorted_by_batch_size() -> None:
    s = ModelStats("m", "1")
    for size in (8, 2, 5, 1):
        s.record_execution(size, 1, 1, 1)
    entries = stats_to_json([s])["model_stats"][0]["batch_stats"]
    assert [e["batch_size"] for e in entries] == [1, 2, 5, 8]


def test_json_of_several_models_keeps_their_order() -> None:
    out = stats_to_json([ModelStats("b", "3"), ModelStats("a", "1")])
    assert [(m["name"], m["version"]) for m in out["model_stats"]] == [("b", "3"), ("a", "1")]
    assert stats_to_json([]) == {"model_stats": []}


# -- gRPC --------------------------------------------------------------------------------
def _proto_duration(p: pb.StatisticDuration) -> dict[str, int]:
    return {"count": p.count, "ns": p.ns}


def test_proto_fields() -> None:
    resp = stats_to_proto([sample_stats()])
    assert isinstance(resp, pb.ModelStatisticsResponse)
    assert len(resp.model_stats) == 1
    m = resp.model_stats[0]
    assert m.name == "simple"
    assert m.version == "2"
    assert m.last_inference == 1_700_000_000_004
    assert m.inference_count == 4
    assert m.execution_count == 2
    inf = m.inference_stats
    assert _proto_duration(inf.success) == d(3, 15_000)
    assert _proto_duration(inf.fail) == d(2, 2_300)
    assert _proto_duration(inf.queue) == d(3, 3_000)
    assert _proto_duration(inf.compute_input) == d(3, 27)
    assert _proto_duration(inf.compute_infer) == d(3, 270)
    assert _proto_duration(inf.compute_output) == d(3, 54)
    assert _proto_duration(inf.cache_hit) == ZERO
    assert _proto_duration(inf.cache_miss) == ZERO
    assert [b.batch_size for b in m.batch_stats] == [1, 3]
    assert _proto_duration(m.batch_stats[0].compute_input) == d(1, 7)
    assert _proto_duration(m.batch_stats[0].compute_infer) == d(1, 70)
    assert _proto_duration(m.batch_stats[0].compute_output) == d(1, 14)
    assert _proto_duration(m.batch_stats[1].compute_input) == d(1, 10)
    assert _proto_duration(m.batch_stats[1].compute_infer) == d(1, 100)
    assert _proto_duration(m.batch_stats[1].compute_output) == d(1, 20)
    assert list(m.response_stats) == ["0"]
    r = m.response_stats["0"]
    assert _proto_duration(r.compute_infer) == d(3, 270)
    assert _proto_duration(r.compute_output) == d(3, 54)
    assert _proto_duration(r.success) == d(3, 324)
    assert _proto_duration(r.fail) == d(1, 90)
    assert _proto_duration(r.empty_response) == ZERO
    assert _proto_duration(r.cancel) == ZERO
    assert len(m.memory_usage) == 0


def _normalize(value: Any) -> Any:
    """Protobuf JSON writes uint64 as strings and drops zero fields: compare on ints with zeros filled in."""
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def test_proto_agrees_with_json() -> None:
    stats = [sample_stats(), ModelStats("other", "1")]
    resp = stats_to_proto(stats)
    as_json = json_format.MessageToDict(
        resp, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    assert _normalize(as_json) == _normalize(stats_to_json(stats))


def test_proto_batch_stats_sorted_and_empty_model() -> None:
    s = ModelStats("m", "1")
    for size in (4, 1, 2):
        s.record_execution(size, 1, 1, 1)
    resp = stats_to_proto([s, ModelStats("n", "7")])
    assert [b.batch_size for b in resp.model_stats[0].batch_stats] == [1, 2, 4]
    empty = resp.model_stats[1]
    assert (empty.name, empty.version, empty.inference_count, empty.execution_count) == ("n", "7", 0, 0)
    assert len(empty.batch_stats) == 0
    assert len(empty.response_stats) == 0
    assert stats_to_proto([]) == pb.ModelStatisticsResponse()
