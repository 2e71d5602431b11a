"""How long a decoupled model may go without sending a response before its request is ended.

Triton waits for ever for a decoupled model's final flag; a model that
forgets it leaves its client hanging.  The config parameter
``response_timeout_s`` (seconds, default 600) bounds the wait between two
responses of one request: past it, the request ends with an UNAVAILABLE error
and is cancelled on the instance.
"""

from __future__ import annotations

import math

from serve_app.config.pbtxt import config_error
from serve_app.protos import model_config_pb2 as mc

PARAMETER = "response_timeout_s"
DEFAULT_S = 600.0


def response_timeout_s(config: mc.ModelConfig, *, path: str = "config.pbtxt") -> float:
    """The model's ``response_timeout_s`` parameter; a bad value raises ``InvalidConfig``."""
    param = config.parameters.get(PARAMETER)
    if param is None:
        return DEFAULT_S
    try:
        value = float(param.string_value)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise config_error(
            config.name,
            path,
            f"parameters: '{PARAMETER}' must be a positive number of seconds (got {param.string_value!r})",
        )
    return value
