"""The metrics port: ``GET /metrics`` in Prometheus text format, Triton's names."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serve_app.service import InferenceService
from serve_app.stats.prometheus import CONTENT_TYPE, render


def build_metrics_app(service: InferenceService) -> Starlette:
    async def metrics(_: Request) -> Response:
        body = render(await service.model_metrics(), service.metrics, custom=service.custom_metrics.render())
        if service.on_demand_stats is not None:
            body += (await service.on_demand_stats()).render().encode()
        return Response(body, media_type=CONTENT_TYPE)

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])
