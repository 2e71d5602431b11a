"""Start-up without --address starts a Ray of its own, whatever an earlier `ray start` left behind; with
--address it joins (no Ray is started here: ray.init is replaced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
from ray._private.services import canonicalize_bootstrap_address

from serve_app.rayserve import runner
from serve_app.rayserve.runner import RayOptions
from serve_app.settings import ServerSettings


class _Stop(Exception):
    pass


def init_arguments(monkeypatch: pytest.MonkeyPatch, options: RayOptions, tmp_path: Path) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    def init(**kwargs: Any) -> None:
        seen.append(kwargs)
        raise _Stop

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(_Stop):
        runner.serve_on_ray(ServerSettings(model_repository=str(tmp_path)), options)
    return seen[0]


def test_without_an_address_it_starts_its_own_ray(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kwargs = init_arguments(monkeypatch, RayOptions(num_cpus=3), tmp_path)
    assert kwargs["address"] == "local" and kwargs["num_cpus"] == 3


def test_with_an_address_it_joins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kwargs = init_arguments(monkeypatch, RayOptions(address="10.0.0.1:6379", num_cpus=3), tmp_path)
    assert kwargs["address"] == "10.0.0.1:6379" and "num_cpus" not in kwargs


def test_local_starts_anew_despite_a_stale_cluster_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What a stale `ray start` leaves: ray_current_cluster naming a dead head.  Ray's plain init would join
    it (and fail: "When connecting to an existing cluster, num_cpus and num_gpus must not be provided")."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("192.0.2.77:6379\n")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert canonicalize_bootstrap_address(None) == "192.0.2.77:6379"  # ray.init() without an address: join it
    assert canonicalize_bootstrap_address("local") is None  # "local": start a new one
