"""The service's side of load on demand: a request for a model not served asks for its load once it misses,
and the gateways' view of each model's use (what the eviction policy reads)."""

from __future__ import annotations

import pytest

from serve_app.errors import NotFound
from serve_app.inference.options import RequestOptions
from serve_app.service import ServedModel
from tests.unit.service.test_inference_service import config, make_service, request


async def test_off_the_miss_is_the_answer() -> None:
    svc = make_service()
    with pytest.raises(NotFound) as miss:
        svc.model("m")
    with pytest.raises(NotFound):
        await svc.model_after_miss("m", "", miss.value)


async def test_on_a_miss_loads_then_serves() -> None:
    svc = make_service()
    asked: list[str] = []

    async def load(name: str) -> None:
        asked.append(name)
        svc.registry.add(ServedModel.create(name, 1, config(name)))

    svc.on_demand = load
    with pytest.raises(NotFound) as miss:
        svc.model("m")
    assert (await svc.model_after_miss("m", "", miss.value)).name == "m"
    assert asked == ["m"] and svc.waited_for_load == {"m": 1}


async def test_an_unknown_name_is_not_counted() -> None:
    svc = make_service()

    async def unknown(name: str) -> None:
        raise NotFound(f"Request for unknown model: '{name}' is not found")

    svc.on_demand = unknown
    with pytest.raises(NotFound, match="'x' is not found"):
        await svc.model_after_miss("x", "", NotFound("miss"))
    assert svc.waited_for_load == {}


async def test_a_served_model_is_never_loaded_again_by_a_miss() -> None:
    svc = make_service(ServedModel.create("m", 1, config()))
    miss = NotFound("Request for unknown model: 'm' version 3 is not found")

    async def load(name: str) -> None:
        raise AssertionError("not asked")

    svc.on_demand = load
    with pytest.raises(NotFound, match="version 3"):
        await svc.model_after_miss("m", "3", miss)


async def test_usage_says_last_use_busy_and_sequences() -> None:
    svc = make_service(ServedModel.create("m", 1, config()), ServedModel.create("idle", 1, config("idle")))
    svc.prepare(svc.registry.all_models())
    assert svc.usage() == {"m": (None, False, 0), "idle": (None, False, 0)}
    model = svc.model("m")
    req = request()
    await svc.scheduler(model).submit(req, RequestOptions.parse(req, model.signature, batch_size=1), 0)
    last, busy, sequences = svc.usage()["m"]
    assert last is not None and not busy and sequences == 0
