from __future__ import annotations

import pathlib

import pytest

from serve_app.errors import AlreadyExists
from serve_app.shared_memory import DirectoryStore, MemoryStore, RegionStore, Registration, node_directory


def reg(name: str, token: str = "t1", key: str = "/k") -> Registration:
    return Registration(name, key, 0, 16, token)


@pytest.fixture(params=["memory", "directory"])
def store(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> RegionStore:
    return MemoryStore() if request.param == "memory" else DirectoryStore(str(tmp_path / "regions"))


def test_add_get_remove(store: RegionStore) -> None:
    store.add(reg("b"))
    store.add(reg("a"))
    assert store.get("a") == reg("a")
    assert [r.name for r in store.all()] == ["a", "b"]
    assert store.remove("a") is True
    assert store.remove("a") is False
    assert store.get("a") is None


def test_a_name_is_registered_once(store: RegionStore) -> None:
    store.add(reg("r"))
    with pytest.raises(AlreadyExists, match="shared memory region 'r' already in manager"):
        store.add(reg("r", token="t2"))


def test_any_name_is_a_file_name(store: RegionStore) -> None:
    name = "../odd/name with spaces é" + "x" * 300
    store.add(reg(name))
    assert store.get(name) == reg(name)


def test_processes_of_a_node_share_one_directory(tmp_path: pathlib.Path) -> None:
    """Two stores over one directory are two gateway processes: each sees what the other registers."""
    a, b = DirectoryStore(str(tmp_path)), DirectoryStore(str(tmp_path))
    a.add(reg("r"))
    assert b.get("r") == reg("r")
    with pytest.raises(AlreadyExists):
        b.add(reg("r", token="t2"))
    b.remove("r")
    assert a.get("r") is None
    b.add(reg("r", token="t3"))  # re-registered: the reader's cache follows the new file
    assert a.get("r") == reg("r", token="t3")


def test_close_removes_the_directory(tmp_path: pathlib.Path) -> None:
    store = DirectoryStore(str(tmp_path / "d"))
    store.add(reg("r"))
    store.close()
    assert not (tmp_path / "d").exists()
    assert store.all() == []


def test_node_directory_is_per_server_and_hides_the_secret() -> None:
    a, b = node_directory(b"secret-one", "n1"), node_directory(b"secret-two", "n1")
    assert a != b and a == node_directory(b"secret-one", "n1")
    assert "secret" not in a


def test_node_directory_is_per_ray_node_even_on_one_filesystem() -> None:
    """Containers that share a host's /tmp are separate nodes: their registrations must not mix."""
    assert node_directory(b"secret", "node-a") != node_directory(b"secret", "node-b")
