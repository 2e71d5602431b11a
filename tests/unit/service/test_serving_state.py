"""The served versions of a serving state, named by ModelKey as everywhere else."""

from __future__ import annotations

from serve_app.keys import ModelKey
from serve_app.service.serving_state import ServedVersion, ServingState


def test_versions_are_keyed_by_version_whichever_load_serves_them() -> None:
    a = ServedVersion("a", 1, b"", (), generation=7)
    b = ServedVersion("a", 2, b"", ())
    state = ServingState(revision=3, served=(a, b))
    assert a.key == ModelKey("a", 1, 7)
    assert state.versions() == {ModelKey("a", 1): a, ModelKey("a", 2): b}
