"""Version policy: which versions on disk are served."""

from __future__ import annotations

import pytest

from serve_app.config import parse_config
from serve_app.protos import model_config_pb2 as mc
from serve_app.repository import select_versions


def policy(text: str) -> mc.ModelConfig:
    return parse_config(text, model="m", path="p")


def test_default_is_latest_one() -> None:
    assert select_versions(mc.ModelConfig(), [1, 3, 2]) == [3]


def test_empty_policy_message_is_latest_one() -> None:
    assert select_versions(policy("version_policy { }"), [1, 2]) == [2]


@pytest.mark.parametrize(("count", "expected"), [(0, [7]), (1, [7]), (2, [5, 7]), (3, [2, 5, 7]), (10, [2, 5, 7])])
def test_latest(count: int, expected: list[int]) -> None:
    config = policy(f"version_policy {{ latest {{ num_versions: {count} }} }}")
    assert select_versions(config, [5, 2, 7]) == expected


def test_all() -> None:
    assert select_versions(policy("version_policy { all { } }"), [3, 1, 2]) == [1, 2, 3]


def test_specific_serves_only_available_listed_versions() -> None:
    config = policy("version_policy { specific { versions: [ 4, 1, 9 ] } }")
    assert select_versions(config, [1, 2, 3, 4]) == [1, 4]


def test_specific_with_nothing_available() -> None:
    config = policy("version_policy { specific { versions: [ 9 ] } }")
    assert select_versions(config, [1, 2]) == []


def test_no_versions_on_disk() -> None:
    assert select_versions(mc.ModelConfig(), []) == []
    assert select_versions(policy("version_policy { all { } }"), []) == []


def test_duplicates_collapse() -> None:
    assert select_versions(policy("version_policy { all { } }"), [2, 1, 2]) == [1, 2]
