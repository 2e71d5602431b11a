"""The statistics extension's wire forms: Triton's JSON and the gRPC ModelStatistics message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from serve_app.protos import grpc_service_pb2 as pb
from serve_app.stats import Duration, ModelStats
from serve_app.stats.model_stats import BATCH_FIELDS, INFER_FIELDS, RESPONSE_FIELDS


def _d(d: Duration | None) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns} if d is not None else {"count": 0, "ns": 0}


def stats_to_json(stats: Sequence[ModelStats]) -> dict[str, Any]:
    return {"model_stats": [_model_json(s) for s in stats]}


def _model_json(s: ModelStats) -> dict[str, Any]:
    return {
        "name": s.name,
        "version": s.version,
        "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {f: _d(s.inference.get(f)) for f in INFER_FIELDS},
        "response_stats": {k: {f: _d(t.get(f)) for f in RESPONSE_FIELDS} for k, t in sorted(s.responses.items())},
        "batch_stats": [
            {"batch_size": size, **{f: _d(t.get(f)) for f in BATCH_FIELDS}} for size, t in sorted(s.batches.items())
        ],
        "memory_usage": [],
    }


def _fill(target: pb.StatisticDuration, d: Duration | None) -> None:
    if d is not None:
        target.count = d.count
        target.ns = d.ns


def stats_to_proto(stats: Sequence[ModelStats]) -> pb.ModelStatisticsResponse:
    resp = pb.ModelStatisticsResponse()
    for s in stats:
        m = resp.model_stats.add(
            name=s.name,
            version=s.version,
            last_inference=s.last_inference_ms,
            inference_count=s.inference_count,
            execution_count=s.execution_count,
        )
        for f in INFER_FIELDS:
            _fill(getattr(m.inference_stats, f), s.inference.get(f))
        for size, table in sorted(s.batches.items()):
            b = m.batch_stats.add(batch_size=size)
            for f in BATCH_FIELDS:
                _fill(getattr(b, f), table.get(f))
        for key, table in s.responses.items():
            r = m.response_stats[key]
            for f in RESPONSE_FIELDS:
                _fill(getattr(r, f), table.get(f))
    return resp
