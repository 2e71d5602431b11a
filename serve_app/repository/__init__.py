"""The model repository: model directories on disk to validated ModelSources."""

from __future__ import annotations

from serve_app.repository.repository import CONFIG_FILENAME, ModelRepository, ModelSource
from serve_app.repository.version_policy import select_versions

__all__ = ["CONFIG_FILENAME", "ModelRepository", "ModelSource", "select_versions"]
