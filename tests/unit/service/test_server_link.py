"""What a Python model's BLS call gets for a model that cannot run: Triton's texts, which differ between
``exec()`` and ``exec(decoupled=True)`` for a model the server does not know."""

from __future__ import annotations

import contextlib

import pytest

from serve_app.errors import NotFound
from serve_app.service import ModelState, ServedModel
from serve_app.service.server_link import ServiceLink
from tests.unit.service.test_inference_service import config, make_service, request


@pytest.fixture
def link() -> ServiceLink:
    return ServiceLink(make_service(ServedModel.create("slow", 1, config("slow"), state=ModelState.LOADING)))


async def test_exec_of_an_unknown_or_unready_model_says_it_is_not_ready(link: ServiceLink) -> None:
    for name in ("non_existent_model", "slow"):
        with pytest.raises(NotFound) as info:
            await link.infer(request(name))
        assert info.value.message == (
            f"Model {name} - Error when running inference: Failed for execute the inference request. "
            f"Model '{name}' is not ready."
        )


async def _stream(link: ServiceLink, name: str) -> None:
    """The decoupled call, read to its end (the error is raised before any response)."""
    async with contextlib.aclosing(link.infer_stream(request(name))) as items:
        async for _ in items:
            pass


async def test_a_decoupled_exec_names_an_unknown_model_as_triton_does(link: ServiceLink) -> None:
    with pytest.raises(NotFound) as info:
        await _stream(link, "non_existent_model")
    assert info.value.message == (
        "Model non_existent_model - Error when running inference: "
        "Request for unknown model: 'non_existent_model' is not found"
    )
    with pytest.raises(NotFound, match=r"Model 'slow' is not ready\."):
        await _stream(link, "slow")
