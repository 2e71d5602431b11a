"""What the server prints: one line per model as it loads, not Ray's and Serve's INFO logs.

Ray and Serve log every actor, deployment and replica they start, at INFO, to the terminal of the
process that started Ray; a server start would bury its models under them.  By default
(``ray_logs`` off) they log at WARNING (``ray.init(logging_level=...)`` for the driver, Serve's
``LoggingConfig.log_level`` for the controller and every deployment), so warnings and errors still
show, and the model manager says what became of each model on a logger of its own.  ``ray_logs``
brings Ray's own logging back as Ray does it.

This module imports no Ray at its top: :func:`prepare_environment` must run before Ray is imported.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from serve_app.settings import ServerSettings

MODELS_LOGGER = "serve_app.models"
RETRY_LOG_ENV = "RAY_enable_output_error_log_if_still_retry"


def ray_log_level(settings: ServerSettings) -> str:
    """The level of Ray's and Serve's own loggers (the driver's, the controller's, the replicas')."""
    return "INFO" if settings.ray_logs else "WARNING"


def serve_logging(settings: ServerSettings) -> dict[str, Any]:
    """Serve's ``logging_config`` of the server's deployments (and of the controller): no access log."""
    return {"enable_access_log": False, "log_level": ray_log_level(settings)}


def prepare_environment(settings: ServerSettings, starts_ray: bool) -> None:
    """Before Ray is imported (values the user set win):

    - worker output reaches the terminal without Ray's ``(Actor pid=...)`` prefix, so that a model's line
      reads as the server's own (``RAY_DISABLE_WORKER_LOG_PREFIX``, read as Ray is imported);
    - a Ray started here uses token authentication, as Ray chooses by default for a new local cluster, but
      named (``RAY_AUTH_MODE=token``), so Ray does not warn at every start that it chose it;
    - a task that Ray retries is not announced on the terminal (``(raylet) Task ... failed. There are
      infinite retries remaining``): at every shutdown Serve kills its controller under the calls this
      process and the replicas have in flight to it, and Ray retries them, to no end a user can act on
      (``RAY_enable_output_error_log_if_still_retry``, read as Ray's processes start); a task that fails
      for good still raises where it was called."""
    if settings.ray_logs:
        return
    os.environ.setdefault("RAY_DISABLE_WORKER_LOG_PREFIX", "1")
    os.environ.setdefault(RETRY_LOG_ENV, "0")
    if starts_ray:
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def quiet_driver(settings: ServerSettings) -> None:
    """This process's Serve logger (``Started Serve``, ``Application ... is ready``) at Ray's level."""
    logging.getLogger("ray.serve").setLevel(ray_log_level(settings))
    quiet_router(settings)


class RetriedProbeFilter(logging.Filter):
    """Drops Serve's router warning that a replica's queue-length probe missed its deadline (0.1 s).

    The router then probes again with a longer deadline (up to 1 s) and routes the request all the same,
    so the warning says nothing a user can act on; on a busy machine (a server loading its models) every
    process holding a Serve handle prints it.  ``ray_logs`` keeps it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to get queue length from ")


def quiet_router(settings: ServerSettings) -> None:
    """In a process that calls Serve handles (the driver, the model manager, the gateways): no retried-probe
    warnings unless ``ray_logs``."""
    serve_logger = logging.getLogger("ray.serve")
    if not settings.ray_logs and not any(isinstance(f, RetriedProbeFilter) for f in serve_logger.filters):
        serve_logger.addFilter(RetriedProbeFilter())


def models_logger() -> logging.Logger:
    """The logger of the one line per model (loaded, or failed and why): plain text on stderr, which
    Ray forwards to the terminal of the server; whatever level Ray and Serve log at."""
    log = logging.getLogger(MODELS_LOGGER)
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def loaded_line(name: str, versions: list[tuple[int, str, str]]) -> str:
    """A model's line once its versions (version, state, reason) serve: Triton's "successfully loaded
    '<name>' version <v>" (its versions on one line), or why a version kept UNAVAILABLE is not ready."""
    unavailable = [(v, reason) for v, state, reason in versions if state != "READY"]
    if unavailable:
        version, reason = unavailable[0]
        return f"loaded '{name}' version {version} UNAVAILABLE (its instances are kept): {reason}"
    numbers = sorted(v for v, _, _ in versions)
    which = f"version {numbers[0]}" if len(numbers) == 1 else "versions " + ", ".join(map(str, numbers))
    return f"successfully loaded '{name}' {which}"


def failed_line(name: str, reason: str) -> str:
    """A model's line when it fails to load (Triton's "failed to load '<name>' ...: <reason>")."""
    return f"failed to load '{name}': {reason}"


def unloaded_line(name: str) -> str:
    return f"successfully unloaded '{name}'"
