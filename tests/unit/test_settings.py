"""Server settings from `serve run` args and configs/, and the shipped config file."""

from __future__ import annotations

import pytest
import yaml

from serve_app.errors import InvalidArgument
from serve_app.settings import ServerSettings
from tests.support.paths import ROOT


def test_from_args_converts_strings() -> None:
    s = ServerSettings.from_args({"model_repository": "/m", "http_port": "9000", "instance_cpus": "0.5"})
    assert (s.http_port, s.instance_cpus, s.grpc_port) == (9000, 0.5, 8001)


def test_from_args_reads_booleans() -> None:
    assert ServerSettings.from_args({"model_repository": "/m", "direct_channel": "false"}).direct_channel is False
    assert ServerSettings.from_args({"model_repository": "/m", "direct_channel": True}).direct_channel is True
    with pytest.raises(InvalidArgument, match="direct_channel"):
        ServerSettings.from_args({"model_repository": "/m", "direct_channel": "maybe"})


def test_from_args_requires_repository() -> None:
    with pytest.raises(InvalidArgument, match="model_repository"):
        ServerSettings.from_args({})


def test_from_args_rejects_unknown_and_bad_values() -> None:
    with pytest.raises(InvalidArgument, match="unknown serve_app argument"):
        ServerSettings.from_args({"model_repository": "/m", "htp_port": 1})
    with pytest.raises(InvalidArgument, match="http_port"):
        ServerSettings.from_args({"model_repository": "/m", "http_port": "eighty"})


def test_round_trip() -> None:
    s = ServerSettings(model_repository="/m", gateway_replicas=2)
    assert ServerSettings.from_args(s.to_args()) == s


def test_shipped_serve_config_is_valid() -> None:
    schema = pytest.importorskip("ray.serve.schema")
    raw = yaml.safe_load((ROOT / "configs" / "serve_app.yaml").read_text())
    config = schema.ServeDeploySchema.model_validate(raw)
    assert config.proxy_location.value == "Disabled"
    (app,) = config.applications
    assert app.import_path == "serve_app.app:build_app"
    settings = ServerSettings.from_args(app.args)
    assert settings.http_port == 8000 and settings.grpc_port == 8001


def test_tritons_metrics_cache_and_config_name_settings_are_checked_at_start() -> None:
    s = ServerSettings.from_args(
        {
            "model_repository": "/m",
            "metrics_config": "histogram_latencies=true;summary_quantiles=0.5:0.05,0.9:0.01",
            "cache_config": "local,size=1024",
            "model_config_name": "small",
        }
    )
    assert s.metrics_options().histogram_latencies
    assert s.metrics_options().quantiles == ((0.5, 0.05), (0.9, 0.01))
    assert s.response_cache().size_bytes == 1024
    assert s.model_config_name == "small"
    for key, value, message in (
        ("metrics_config", "histogram_latencies=maybe", "expected true or false"),
        ("cache_config", "redis,host=h", "only 'local'"),
        ("model_config_name", "../x", "must be a file name"),
        ("rate_limit", "requests", "rate_limit 'requests' is not one of off, execution_count"),
    ):
        with pytest.raises(InvalidArgument, match=message):
            ServerSettings.from_args({"model_repository": "/m", key: value})


def test_rate_limit_resources_only_count_with_the_rate_limiter_on() -> None:
    off = ServerSettings.from_args({"model_repository": "/m", "rate_limit_resource": "R:2"})
    assert off.rate_limit_resources() is None
    on = ServerSettings.from_args(
        {"model_repository": "/m", "rate_limit": "execution_count", "rate_limit_resource": "R:2,S:1:0"}
    )
    assert on.rate_limit_resources() == {"R": 2, "S": 1}


def test_load_on_demand_needs_explicit_or_poll_and_sane_bounds() -> None:
    ServerSettings.from_args({"model_repository": "/m", "model_control_mode": "poll", "load_on_demand": "true"})
    with pytest.raises(InvalidArgument, match="load_on_demand needs model_control_mode explicit or poll"):
        ServerSettings(model_repository="/m", load_on_demand=True)
    with pytest.raises(InvalidArgument, match="max_loaded_models_per_node"):
        ServerSettings(model_repository="/m", model_control_mode="explicit", max_loaded_models_per_node=-1)
