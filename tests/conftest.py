"""What every test gets: its marker from its directory, and (below end to end) a Ray that refuses to start.

- ``tests/e2e`` and ``tests/cluster`` start the real server or a Ray cluster: marked ``e2e``, so
  ``python -m pytest -m "not e2e"`` runs the fast suite (unit and in-process integration) alone.
- ``tests/multinode`` builds a Ray cluster of network namespaces (root only): marked ``e2e`` and
  ``multinode`` (``python -m pytest -m multinode`` runs it alone).
- ``tests/gpu`` needs a GPU: marked ``gpu`` (its tests skip themselves without one).
- Everywhere else ``ray.init`` fails the test: unit and integration tests must not start Ray
  (as Ray's own ``tests/unit/conftest.py`` does with ``disallow_ray_init``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.paths import ROOT

MARKERS = {"e2e": ("e2e",), "cluster": ("e2e",), "gpu": ("gpu",), "multinode": ("e2e", "multinode")}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.relative_to(ROOT / "tests").parts
        for marker in MARKERS.get(parts[0], ()) if len(parts) > 1 else ():
            item.add_marker(marker)


@pytest.fixture(autouse=True)
def _no_ray_below_e2e(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.get_closest_marker("e2e") is None:
        try:
            import ray
        except ImportError:  # a machine without Ray (the GPU check's): nothing can start it
            ray = None
        if ray is not None:
            monkeypatch.setattr(ray, "init", _refuse_ray)
    yield


def _refuse_ray(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError(
        "this test started Ray: only tests/e2e, tests/cluster and tests/multinode may (they are marked e2e)"
    )
