"""Ensembles in process: the steps run as requests to their models through the same service."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from scripts import example_models
from serve_app.errors import InvalidArgument, ServeError
from serve_app.http_server import build_http_app
from serve_app.inference.types import InferRequest, InferTensor, RequestedOutput
from serve_app.keys import ModelKey
from serve_app.local.service import LocalService
from serve_app.service import InferenceService, ModelRegistry, ModelState, ServedModel
from serve_app.service.registry import ensemble_readiness
from serve_app.stats import ModelStats
from tests.integration.conftest import infer

ENSEMBLE = "add_sub_ensemble"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceService]:
    repo = tmp_path_factory.mktemp("ensemble_repo")
    example_models.add_sub(repo)
    example_models.add_sub_ensemble(repo)
    example_models.add_sub_ensemble(repo, name="broken_ensemble", step_model="missing")
    host = LocalService.from_repository(repo)
    yield host.service
    host.close()


def request(a: np.ndarray, b: np.ndarray, outputs: tuple[str, ...] = ()) -> InferRequest:
    return InferRequest(
        ENSEMBLE,
        inputs=[InferTensor("IN_A", "FP32", a.shape, a), InferTensor("IN_B", "FP32", b.shape, b)],
        outputs=[RequestedOutput(n) for n in outputs],
    )


def operands(batch: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(batch)
    return rng.standard_normal((batch, 16)).astype(np.float32), rng.standard_normal((batch, 16)).astype(np.float32)


async def test_ensemble_runs_its_graph(service: InferenceService) -> None:
    a, b = operands(3)
    resp = await infer(service, request(a, b))
    out = {t.name: t.data for t in resp.outputs}
    assert [t.name for t in resp.outputs] == ["OUT_2A", "OUT_2B", "OUT_SUM"]
    np.testing.assert_allclose(out["OUT_2A"], 2 * a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["OUT_2B"], 2 * b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["OUT_SUM"], a + b, rtol=1e-5, atol=1e-5)


async def test_requested_outputs_only(service: InferenceService) -> None:
    a, b = operands()
    resp = await infer(service, request(a, b, ("OUT_2B",)))
    assert [t.name for t in resp.outputs] == ["OUT_2B"]


async def test_statistics_count_the_ensemble_and_its_steps(service: InferenceService) -> None:
    before = service.local_stats()
    a, b = operands()
    await asyncio.gather(*(infer(service, request(a, b)) for _ in range(5)))
    after = service.local_stats()

    def count(key: ModelKey, stats: dict[ModelKey, ModelStats]) -> int:
        return stats[key].inference_count if key in stats else 0

    ensemble, add_sub = ModelKey(ENSEMBLE, 1), ModelKey("add_sub", 1)
    assert count(ensemble, after) - count(ensemble, before) == 5
    assert count(add_sub, after) - count(add_sub, before) == 20  # four steps each


async def test_steps_no_requested_output_needs_do_not_run(service: InferenceService) -> None:
    """As Triton prunes them: OUT_2B needs the first two steps, not the two that make OUT_SUM."""
    before = service.local_stats()[ModelKey("add_sub", 1)].inference_count
    a, b = operands()
    resp = await infer(service, request(a, b, ("OUT_2B",)))
    np.testing.assert_allclose(resp.outputs[0].data, 2 * b, rtol=1e-5, atol=1e-5)
    assert service.local_stats()[ModelKey("add_sub", 1)].inference_count - before == 2


async def test_invalid_request_is_checked_against_the_ensemble(service: InferenceService) -> None:
    a, b = operands()
    bad = InferRequest(
        ENSEMBLE, inputs=[InferTensor("IN_A", "FP32", a.shape, a), InferTensor("IN_B", "FP32", (1, 8), b[:, :8])]
    )
    with pytest.raises(InvalidArgument, match="unexpected shape for input 'IN_B' for model 'add_sub_ensemble'"):
        await infer(service, bad)


async def test_step_error_names_the_ensemble(service: InferenceService, monkeypatch: pytest.MonkeyPatch) -> None:
    (held,) = service.executor.host.of(ModelKey("add_sub", 1))  # type: ignore[attr-defined]
    backend = held.instance.backend

    def broken(inputs: dict, names: list) -> dict:  # type: ignore[type-arg]
        raise RuntimeError("step exploded")

    monkeypatch.setattr(backend, "execute", broken)
    a, b = operands()
    with pytest.raises(ServeError, match=r"^in ensemble 'add_sub_ensemble', RuntimeError: step exploded$"):
        await infer(service, request(a, b))


async def test_ensemble_readiness_and_failed_ensemble(service: InferenceService) -> None:
    assert service.model_ready(ENSEMBLE)
    index = {e.name: e for e in service.repository_index()}
    assert index["broken_ensemble"].state == ModelState.UNAVAILABLE.value
    assert "model 'missing' is not available" in index["broken_ensemble"].reason


async def test_ensemble_over_http(service: InferenceService) -> None:
    a, b = operands(2)
    body = {
        "inputs": [
            {"name": "IN_A", "shape": [2, 16], "datatype": "FP32", "data": a.ravel().tolist()},
            {"name": "IN_B", "shape": [2, 16], "datatype": "FP32", "data": b.ravel().tolist()},
        ],
        "outputs": [{"name": "OUT_2A"}],
    }
    transport = httpx.ASGITransport(app=build_http_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        r = await client.post(f"/v2/models/{ENSEMBLE}/infer", json=body)
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        np.testing.assert_allclose(np.array(out["data"]).reshape(2, 16), 2 * a, rtol=1e-5, atol=1e-5)
        meta = (await client.get(f"/v2/models/{ENSEMBLE}")).json()
        assert meta["platform"] == "ensemble"


def test_a_step_that_is_not_ready_makes_the_ensemble_unavailable(service: InferenceService) -> None:
    registry = ModelRegistry()
    for model in service.registry.all_models():
        copy = ServedModel(model.key, model.config, model.signature)
        if model.name == "add_sub":
            copy.state = ModelState.UNAVAILABLE
        registry.add(copy)
    ensemble_readiness(registry)
    entry = registry.resolve(ENSEMBLE)
    assert entry.state is ModelState.UNAVAILABLE and "composing model 'add_sub' is not ready" in entry.reason
