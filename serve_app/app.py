"""Entry point for `serve run serve_app.app:build_app model_repository=DIR` and config files."""

from __future__ import annotations

from typing import Any

from serve_app.settings import ServerSettings


def ensure_serve_started(settings: ServerSettings) -> None:
    """Start Serve without Ray's proxy when nothing started it yet.

    `serve run <import path>` calls the builder before it starts Serve, and would
    start Ray's proxy on port 8000, the gateway's port.  A config file sets
    ``proxy_location: Disabled`` itself; on a running Serve this does nothing.
    """
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(namespace="serve", log_to_driver=True)
    serve.start(proxy_location="Disabled")


def build_app(args: dict[str, Any]) -> Any:
    from serve_app.rayserve.app_builder import build_application

    settings = ServerSettings.from_args(args)
    ensure_serve_started(settings)
    return build_application(settings)
