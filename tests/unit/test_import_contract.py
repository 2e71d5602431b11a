"""The import contract in pyproject.toml names every package of serve_app, so a new one can't escape it."""

from __future__ import annotations

import pkgutil

import pytest

import serve_app
from tests.support.paths import ROOT

tomllib = pytest.importorskip("tomllib")

ALLOWED = {  # the package each framework may be imported in
    "Ray only in serve_app.rayserve": {"serve_app.rayserve"},
    # the OpenAI port's pure modules are listed one by one: its package holds the app module too
    "Starlette and uvicorn only in serve_app.http_server and the OpenAI port's app": {
        "serve_app.http_server",
        "serve_app.openai_api",
    },
    "grpc only in serve_app.grpc_server and the status table": {"serve_app.grpc_server"},
    "Model frameworks (onnxruntime, torch, tensorrt, cuda) only in serve_app.backends": {"serve_app.backends"},
    "OpenTelemetry only in serve_app.observability.otel_export": set(),  # one module, by an ignored import
}


def contracts() -> list[dict[str, object]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["importlinter"]["contracts"])


def packages() -> set[str]:
    return {f"serve_app.{m.name}" for m in pkgutil.iter_modules(serve_app.__path__)} - {"serve_app.protos"}


def test_every_package_has_a_layer() -> None:
    (layers,) = [c for c in contracts() if c["type"] == "layers"]
    listed = {name.strip() for line in layers["layers"] for name in str(line).split("|")}  # type: ignore[attr-defined]
    assert packages() - listed == set()


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_every_package_but_its_home_is_kept_from_each_framework(name: str) -> None:
    (contract,) = [c for c in contracts() if c["name"] == name]
    assert packages() - set(contract["source_modules"]) == ALLOWED[name]  # type: ignore[arg-type]
