"""Whether a model's instances share a host process with other models' or get one process each.

By default an instance is a thread of a shared host (one per node for CPU
instances, one per GPU for GPU instances: ``placement/pools.py``), as in
Triton, where every instance is a thread of the server.  The config parameter
``dedicated_process`` (``true``/``false``) gives each of the model's
instances a process (a Serve replica) of its own: a crash in its backend then
takes no other model down.  Models Serve autoscales always get dedicated
replicas (Serve scales replicas).  Python-backend models default to ``true``:
their code is the user's own, imports what it likes and may crash or leak,
and Triton too runs each of their instances in a process of its own; with
``false`` they run as threads of a shared host (no hop from the gateway).
"""

from __future__ import annotations

from serve_app.config.pbtxt import config_error
from serve_app.protos import model_config_pb2 as mc

PARAMETER = "dedicated_process"
_VALUES = ("true", "false")


def dedicated_process(config: mc.ModelConfig, *, path: str = "config.pbtxt") -> bool:
    """The model's ``dedicated_process`` parameter (default false, true for backend python); a bad value raises
    ``InvalidConfig``."""
    param = config.parameters.get(PARAMETER)
    if param is None:
        return config.backend == "python"
    value = param.string_value.strip().lower()
    if value not in _VALUES:
        raise config_error(
            config.name, path, f"parameters: '{PARAMETER}' must be one of {', '.join(_VALUES)} (got {value!r})"
        )
    return value == "true"
