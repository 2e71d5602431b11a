"""The builder waits for late GPU nodes (KubeRay builds the app as soon as the head is ready)."""

from __future__ import annotations

import pytest

from serve_app.placement import ClusterGpus
from serve_app.rayserve import cluster
from serve_app.settings import ServerSettings


def test_waits_until_enough_gpus_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = iter([0, 0, 2])
    monkeypatch.setattr(cluster, "cluster_gpus", lambda prefix: ClusterGpus(total=next(seen)))
    lines: list[str] = []
    gpus = cluster.wait_for_gpus(ServerSettings("/m", wait_for_gpus=2), lines.append, poll_s=0)
    assert gpus.total == 2 and "waiting up to 600s for 2 GPU(s); 0 joined" in lines[0]


def test_gives_up_after_the_limit_and_plans_with_what_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "cluster_gpus", lambda prefix: ClusterGpus(total=1))
    lines: list[str] = []
    settings = ServerSettings("/m", wait_for_gpus=4, wait_for_gpus_s=0.01)
    assert cluster.wait_for_gpus(settings, lines.append, poll_s=0.001).total == 1
    assert "only 1 of 4 GPU(s) joined" in lines[-1]


def test_no_wait_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "cluster_gpus", lambda prefix: ClusterGpus(total=0))
    lines: list[str] = []
    assert cluster.wait_for_gpus(ServerSettings("/m"), lines.append).total == 0
    assert lines == []
