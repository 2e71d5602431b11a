"""--metrics-config's latency metrics on the metrics app's /metrics page of a service that serves requests
through the HTTP front end: the first-response histogram (Triton's default buckets, or the model config's)
and the summaries appear when enabled, and move as requests are served."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from scripts import example_models
from serve_app.http_server import build_http_app
from serve_app.http_server.metrics import build_metrics_app
from serve_app.local.service import LocalService
from serve_app.metrics_options import MetricsOptions
from serve_app.service import InferenceService

BUCKETS = (
    'model_metrics { metric_control [ { metric_identifier { family: "nv_inference_first_response_histogram_ms" } '
    "histogram_options { buckets: [ 1, 30000 ] } } ] }"
)
HISTOGRAM = "nv_inference_first_response_histogram_ms"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceService]:
    repo = tmp_path_factory.mktemp("latency_repo")
    example_models.add_sub(repo, name="plain")
    example_models.add_sub(repo, name="custom", extra_config=BUCKETS)
    options = MetricsOptions.parse(["histogram_latencies=true", "summary_latencies=true", "summary_quantiles=0.5:0.05"])
    host = LocalService.from_repository(pathlib.Path(repo), metrics=options)
    yield host.service
    host.close()


async def page(service: InferenceService) -> dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_metrics_app(service)), base_url="http://m"
    ) as c:
        text = (await c.get("/metrics")).text
    out: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(family.name, {})[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def serve(service: InferenceService, model: str, n: int) -> None:
    inputs = [{"name": name, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16} for name in ("INPUT0", "INPUT1")]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_http_app(service)), base_url="http://s") as c:
        for _ in range(n):
            assert (await c.post(f"/v2/models/{model}/infer", json={"inputs": inputs})).status_code == 200


def bucket(figures: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]], model: str, le: str) -> float:
    key = (f"{HISTOGRAM}_bucket", (("le", le), ("model", model), ("version", "1")))
    return figures[HISTOGRAM][key]


async def test_the_histogram_shows_before_any_request_and_counts_each_one(service: InferenceService) -> None:
    before = await page(service)
    assert [bucket(before, "plain", le) for le in ("100", "500", "2000", "5000", "+Inf")] == [0, 0, 0, 0, 0]
    await serve(service, "plain", 3)
    after = await page(service)
    assert bucket(after, "plain", "+Inf") == 3
    assert after[HISTOGRAM][(f"{HISTOGRAM}_count", (("model", "plain"), ("version", "1")))] == 3
    assert bucket(after, "plain", "5000") == 3  # three tiny requests: all well under five seconds


async def test_the_model_configs_buckets_replace_the_defaults(service: InferenceService) -> None:
    await serve(service, "custom", 2)
    figures = await page(service)
    les = sorted(
        dict(labels)["le"]
        for name, labels in figures[HISTOGRAM]
        if name.endswith("_bucket") and ("model", "custom") in labels
    )
    assert les == sorted(["1", "30000", "+Inf"])
    assert bucket(figures, "custom", "30000") == bucket(figures, "custom", "+Inf") == 2


async def test_summaries_show_the_configured_quantiles(service: InferenceService) -> None:
    await serve(service, "plain", 2)
    figures = await page(service)
    for name in (
        "nv_inference_request_summary_us",
        "nv_inference_queue_summary_us",
        "nv_inference_compute_infer_summary_us",
    ):
        samples = figures[name]
        quantiles = [dict(labels)["quantile"] for n, labels in samples if n == name and ("model", "plain") in labels]
        assert quantiles == ["0.5"]
        assert samples[(f"{name}_count", (("model", "plain"), ("version", "1")))] >= 2
    request_p50 = figures["nv_inference_request_summary_us"][
        ("nv_inference_request_summary_us", (("model", "plain"), ("quantile", "0.5"), ("version", "1")))
    ]
    assert request_p50 > 0
