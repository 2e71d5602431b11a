"""What the server prints: the one line per model, and how quiet Ray and Serve are told to be."""

from __future__ import annotations

import logging
import os

import pytest

from serve_app.rayserve.console import (
    RETRY_LOG_ENV,
    RetriedProbeFilter,
    failed_line,
    loaded_line,
    prepare_environment,
    quiet_router,
    serve_logging,
    unloaded_line,
)
from serve_app.settings import ServerSettings


def test_a_loaded_model_is_one_line_with_its_versions() -> None:
    assert loaded_line("m", [(1, "READY", "")]) == "successfully loaded 'm' version 1"
    assert loaded_line("m", [(3, "READY", ""), (2, "READY", "")]) == "successfully loaded 'm' versions 2, 3"


def test_a_version_kept_unavailable_says_why() -> None:
    line = loaded_line("m", [(1, "READY", ""), (2, "UNAVAILABLE", "no CUDA here")])
    assert line == "loaded 'm' version 2 UNAVAILABLE (its instances are kept): no CUDA here"


def test_failed_and_unloaded_lines() -> None:
    assert failed_line("m", "bad config") == "failed to load 'm': bad config"
    assert unloaded_line("m") == "successfully unloaded 'm'"


def test_serve_logs_warnings_unless_ray_logs() -> None:
    assert serve_logging(ServerSettings("/r")) == {"enable_access_log": False, "log_level": "WARNING"}
    assert serve_logging(ServerSettings("/r", ray_logs=True))["log_level"] == "INFO"


def test_the_environment_names_rays_choices_unless_the_user_did(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RAY_DISABLE_WORKER_LOG_PREFIX", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    prepare_environment(ServerSettings("/r"), starts_ray=False)  # joins a cluster: its auth mode is its own
    assert "RAY_AUTH_MODE" not in os.environ
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    prepare_environment(ServerSettings("/r"), starts_ray=True)
    assert os.environ["RAY_AUTH_MODE"] == "disabled" and os.environ["RAY_DISABLE_WORKER_LOG_PREFIX"] == "1"


def test_rays_retries_are_not_announced_unless_the_user_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve kills its controller under calls in flight at every shutdown; Ray's retries of them are noise."""
    monkeypatch.delenv(RETRY_LOG_ENV, raising=False)
    prepare_environment(ServerSettings("/r"), starts_ray=False)
    assert os.environ[RETRY_LOG_ENV] == "0"
    monkeypatch.setenv(RETRY_LOG_ENV, "1")
    prepare_environment(ServerSettings("/r"), starts_ray=True)
    assert os.environ[RETRY_LOG_ENV] == "1"


def test_ray_logs_leaves_the_environment_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RAY_DISABLE_WORKER_LOG_PREFIX", "RAY_AUTH_MODE", RETRY_LOG_ENV):
        monkeypatch.delenv(name, raising=False)
    prepare_environment(ServerSettings("/r", ray_logs=True), starts_ray=True)
    assert not {"RAY_DISABLE_WORKER_LOG_PREFIX", "RAY_AUTH_MODE", RETRY_LOG_ENV} & set(os.environ)


def test_serves_retried_probe_warning_is_dropped_unless_ray_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    serve_logger = logging.getLogger("ray.serve")
    monkeypatch.setattr(serve_logger, "filters", [])
    quiet_router(ServerSettings("/r", ray_logs=True))
    assert serve_logger.filters == []
    quiet_router(ServerSettings("/r"))
    quiet_router(ServerSettings("/r"))  # once per process
    assert [type(f) for f in serve_logger.filters] == [RetriedProbeFilter]

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("ray.serve", logging.WARNING, __file__, 1, msg, None, None)

    probe = "Failed to get queue length from Replica(id='r1', deployment='m.v1.g0', app='a') within 0.1s. ..."
    assert not serve_logger.filter(record(probe))
    assert serve_logger.filter(record("Deployment 'm' is unhealthy"))
