"""Entry point for `serve run serve_app.app:build_app model_repository=DIR` and config files."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from serve_app.settings import ServerSettings


def build_app(args: dict[str, Any]) -> Any:
    from serve_app.rayserve.app_builder import build_application
    from serve_app.rayserve.runner import ensure_serve_started

    settings = ServerSettings.from_args(args)
    if not os.path.isabs(settings.model_repository):
        # Relative to where `serve run` was started; config files should use absolute paths.
        settings = dataclasses.replace(settings, model_repository=os.path.abspath(settings.model_repository))
    ensure_serve_started(settings)
    return build_application(settings)
