"""The metrics port: ``GET /metrics`` in Prometheus text format, Triton's names."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serve_app.config import ENSEMBLE_PLATFORM
from serve_app.service import InferenceService
from serve_app.stats.prometheus import CONTENT_TYPE, ModelMetrics, render


def build_metrics_app(service: InferenceService) -> Starlette:
    async def metrics(_: Request) -> Response:
        models = []
        for stats in await service.model_statistics():
            entry = service.catalog.resolve(stats.name, stats.version)
            count = getattr(service.executor, "instances", None)
            instances = count(entry) if count is not None and entry.config.platform != ENSEMBLE_PLATFORM else None
            models.append(ModelMetrics(stats, dict(entry.config.metric_tags), instances))
        return Response(render(models), media_type=CONTENT_TYPE)

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])
