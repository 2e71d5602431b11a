"""Ensembles in process: the steps run as requests to their models through the same service."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import example_models
import httpx
import numpy as np
import pytest

from serve_app.backends import BackendContext
from serve_app.config import ENSEMBLE_PLATFORM
from serve_app.config.ensemble_deps import ensemble_problems
from serve_app.errors import InvalidArgument, ServeError
from serve_app.http_server import build_http_app
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferTensor, RequestedOutput
from serve_app.local.executor import LocalModelExecutor
from serve_app.repository import ModelRepository
from serve_app.runtime import ModelInstance
from serve_app.service import InferenceService, ModelCatalog, ModelState, ModelVersionEntry
from serve_app.service.catalog import FailedModel, ensemble_readiness

ENSEMBLE = "add_sub_ensemble"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceService]:
    repo = tmp_path_factory.mktemp("ensemble_repo")
    example_models.add_sub(repo)
    example_models.add_sub_ensemble(repo)
    example_models.add_sub_ensemble(repo, name="broken_ensemble", step_model="missing")
    sources = {n: s for n, s in ModelRepository(repo).load_all().items() if not isinstance(s, ServeError)}
    problems = ensemble_problems(
        {n: s.config for n, s in sources.items()}, {n: set(s.versions) for n, s in sources.items()}
    )
    catalog = ModelCatalog()
    instances: dict[tuple[str, int], ModelInstance] = {}
    for name, source in sources.items():
        if name in problems:
            catalog.add_failed(FailedModel(name, problems[name]))
            continue
        for version, path in source.versions.items():
            if source.config.platform != ENSEMBLE_PLATFORM:
                ctx = BackendContext(name, version, source.config, path)
                instances[(name, version)] = ModelInstance(ctx)
            sig = ModelSignature.from_config(source.config, str(version))
            catalog.add(ModelVersionEntry(name, version, source.config, sig))
    ensemble_readiness(catalog)
    yield InferenceService(catalog, LocalModelExecutor(instances))
    for instance in instances.values():
        instance.close()


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
    resp = await service.infer(request(a, b))
    out = {t.name: t.data for t in resp.outputs}
    assert [t.name for t in resp.outputs] == ["OUT_2A", "OUT_2B", "OUT_SUM"]
    np.testing.assert_allclose(out["OUT_2A"], 2 * a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["OUT_2B"], 2 * b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["OUT_SUM"], a + b, rtol=1e-5, atol=1e-5)


async def test_requested_outputs_only(service: InferenceService) -> None:
    a, b = operands()
    resp = await service.infer(request(a, b, ("OUT_2B",)))
    assert [t.name for t in resp.outputs] == ["OUT_2B"]


async def test_statistics_count_the_ensemble_and_its_steps(service: InferenceService) -> None:
    before = service.local_stats()
    a, b = operands()
    await asyncio.gather(*(service.infer(request(a, b)) for _ in range(5)))
    after = service.local_stats()

    def count(key: tuple[str, str], stats: dict) -> int:
        return stats[key].inference_count if key in stats else 0

    assert count((ENSEMBLE, "1"), after) - count((ENSEMBLE, "1"), before) == 5
    assert count(("add_sub", "1"), after) - count(("add_sub", "1"), before) == 20  # four steps each


async def test_invalid_request_is_checked_against_the_ensemble(service: InferenceService) -> None:
    a, b = operands()
    bad = InferRequest(
        ENSEMBLE, inputs=[InferTensor("IN_A", "FP32", a.shape, a), InferTensor("IN_B", "FP32", (1, 8), b[:, :8])]
    )
    with pytest.raises(InvalidArgument, match="unexpected shape for input 'IN_B' for model 'add_sub_ensemble'"):
        await service.infer(bad)


async def test_step_error_names_the_ensemble(service: InferenceService, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = service.executor._instances[("add_sub", 1)].backend  # type: ignore[attr-defined]

    def broken(inputs: dict, names: list) -> dict:  # type: ignore[type-arg]
        raise RuntimeError("step exploded")

    monkeypatch.setattr(backend, "execute", broken)
    a, b = operands()
    with pytest.raises(ServeError, match=r"^in ensemble 'add_sub_ensemble', RuntimeError: step exploded$"):
        await service.infer(request(a, b))


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
    catalog = ModelCatalog()
    for entry in service.catalog.all_entries():
        copy = ModelVersionEntry(entry.name, entry.version, entry.config, entry.signature)
        if entry.name == "add_sub":
            copy.state = ModelState.UNAVAILABLE
        catalog.add(copy)
    ensemble_readiness(catalog)
    entry = catalog.resolve(ENSEMBLE)
    assert entry.state is ModelState.UNAVAILABLE and "composing model 'add_sub' is not ready" in entry.reason
