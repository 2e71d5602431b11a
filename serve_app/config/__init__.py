"""Model configuration: parse config.pbtxt, complete it, validate it, JSON it.

Pure functions over ``serve_app.protos.model_config_pb2.ModelConfig``; the
repository package strings them together for each model directory.
"""

from __future__ import annotations

from serve_app.config.autocomplete import (
    autocomplete_config,
    default_model_filename,
    normalize_config,
    platform_for_file,
)
from serve_app.config.json_format import config_from_json, config_to_json
from serve_app.config.pbtxt import parse_config
from serve_app.config.validate import (
    ENSEMBLE_PLATFORM,
    normalize_platform,
    validate_config,
    validate_model_filename,
    validate_platform,
)

__all__ = [
    "ENSEMBLE_PLATFORM",
    "autocomplete_config",
    "config_from_json",
    "config_to_json",
    "default_model_filename",
    "normalize_config",
    "normalize_platform",
    "parse_config",
    "platform_for_file",
    "validate_config",
    "validate_model_filename",
    "validate_platform",
]
