"""A model whose replicas Ray can't place fails with what they ask and what the cluster has (Serve's account)."""

from __future__ import annotations

from types import SimpleNamespace

from serve_app.rayserve.model_manager import _unplaced

SERVE_MESSAGE = (
    "Deployment 'big.v1.g0' in application 'serve_app--big.v1.g0--7' has 1 replicas that have taken more than "
    "30s to be scheduled. This may be due to waiting for the cluster to auto-scale or for a runtime environment "
    'to be installed. Resources required for each replica: {"CPU": 64.0}, total resources available: '
    '{"CPU": 15.5}. Use `ray status` for more details.'
)


def app(*messages: str) -> SimpleNamespace:
    return SimpleNamespace(deployments={f"d{i}": SimpleNamespace(message=m) for i, m in enumerate(messages)})


def test_replicas_waiting_for_resources_are_reported_with_the_ask_and_what_is_available() -> None:
    reason = _unplaced(app("", SERVE_MESSAGE))
    assert reason.startswith('Ray could not place its instances: each asks for {"CPU": 64.0}')
    assert 'the cluster has {"CPU": 15.5} available' in reason


def test_replicas_slow_to_initialize_are_not_unplaced() -> None:
    slow = "Deployment 'm' has 1 replicas that have taken more than 30s to initialize.\nThis may be caused by ..."
    assert _unplaced(app(slow)) == ""
    assert _unplaced(app()) == ""


def test_replicas_whose_ask_the_cluster_has_are_waited_for() -> None:
    """On a busy machine Serve reports a replica whose worker process is still starting as not scheduled."""
    busy = SERVE_MESSAGE.replace('{"CPU": 64.0}', '{"CPU": 0.01}')
    assert _unplaced(app(busy)) == ""
    missing = SERVE_MESSAGE.replace('{"CPU": 64.0}', '{"CPU": 0.01, "GPU": 1.0}')
    assert _unplaced(app(missing)).startswith('Ray could not place its instances: each asks for {"CPU": 0.01, "GPU"')
    unreadable = SERVE_MESSAGE.replace('{"CPU": 64.0}', "{CPU: 1}")
    assert _unplaced(app(unreadable)).startswith("Ray could not place its instances")
