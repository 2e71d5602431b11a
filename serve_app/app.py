"""Entry point for `serve run serve_app.app:build_app model_repository=DIR` and config files."""

from __future__ import annotations

import dataclasses
import os
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
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, namespace="serve")
        else:
            # A local Ray for `serve run`: instances share the cores, as in Triton.
            ray.init(namespace="serve", num_cpus=local_num_cpus())
    serve.start(proxy_location="Disabled")


def local_num_cpus() -> int:
    """Logical CPUs for a Ray we start here: every instance reserves some, none pins a core."""
    return max(os.cpu_count() or 1, 16)


def build_app(args: dict[str, Any]) -> Any:
    from serve_app.rayserve.app_builder import build_application

    settings = ServerSettings.from_args(args)
    if not os.path.isabs(settings.model_repository):
        # Relative to where `serve run` was started; config files should use absolute paths.
        settings = dataclasses.replace(settings, model_repository=os.path.abspath(settings.model_repository))
    ensure_serve_started(settings)
    return build_application(settings)
