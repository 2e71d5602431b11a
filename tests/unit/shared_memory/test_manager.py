from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory

import numpy as np
import pytest

from serve_app.errors import AlreadyExists, InternalError, InvalidArgument, NotFound
from serve_app.shared_memory import NOT_ENABLED, DirectoryStore, MemoryStore, SharedMemory, ShmRef
from tests.support.shm import key


def test_off_by_default_and_says_how_to_turn_it_on(shm_object: shared_memory.SharedMemory) -> None:
    shm = SharedMemory()
    assert not shm.enabled
    with pytest.raises(InvalidArgument, match="--allow-client-shm"):
        shm.register("r", key(shm_object), 0, 16)
    with pytest.raises(InvalidArgument, match="the request names region 'r'") as err:
        shm.window(ShmRef("r", 0, 4))
    assert err.value.message.startswith(NOT_ENABLED)
    assert shm.status() == []
    shm.unregister("r")
    shm.unregister_all()


def test_register_read_write_through_the_mapping(shm_object: shared_memory.SharedMemory) -> None:
    shm = SharedMemory(MemoryStore())
    shm.register("r", key(shm_object), 4096 + 8, 64)  # an offset that is not page aligned
    shm_object.buf[4096 + 8 : 4096 + 12] = b"abcd"
    assert bytes(shm.window(ShmRef("r", 0, 4))) == b"abcd"
    shm.window(ShmRef("r", 60, 4))[:] = b"wxyz"
    assert bytes(shm_object.buf[4096 + 68 : 4096 + 72]) == b"wxyz"
    [status] = shm.status()
    assert (status.name, status.key, status.offset, status.byte_size) == ("r", key(shm_object), 4104, 64)
    assert shm.status("r") == [status]
    shm.close()


def test_triton_errors(shm_object: shared_memory.SharedMemory) -> None:
    shm = SharedMemory(MemoryStore())
    with pytest.raises(InternalError, match="Unable to open shared memory region: '/no_such_object_here'"):
        shm.register("r", "/no_such_object_here", 0, 16)
    for bad_key in ("/../etc/passwd", "/a/b", "", "/.."):
        with pytest.raises(InternalError, match="Unable to open shared memory region"):
            shm.register("r", bad_key, 0, 16)
    with pytest.raises(InvalidArgument, match="failed to register shared memory region 'r': invalid args"):
        shm.register("r", key(shm_object), 65536 - 8, 16)
    with pytest.raises(InvalidArgument, match="'region name' is necessary"):
        shm.register("", key(shm_object), 0, 16)
    shm.register("r", key(shm_object), 0, 16)
    with pytest.raises(AlreadyExists, match="shared memory region 'r' already in manager"):
        shm.register("r", key(shm_object), 0, 16)
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'x'"):
        shm.window(ShmRef("x", 0, 4))
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'x'"):
        shm.status("x")
    with pytest.raises(InvalidArgument, match="Invalid offset for shared memory region: 'r'"):
        shm.window(ShmRef("r", 16, 0))
    with pytest.raises(InvalidArgument, match="Invalid offset \\+ byte size for shared memory region: 'r'"):
        shm.window(ShmRef("r", 8, 9))
    with pytest.raises(InvalidArgument, match="Invalid offset for shared memory region"):
        shm.window(ShmRef("r", -1, 4))
    shm.unregister("r")
    shm.unregister("r")  # unregistering nothing is fine, as in Triton
    with pytest.raises(NotFound):
        shm.window(ShmRef("r", 0, 4))


def test_a_view_outlives_unregister(shm_object: shared_memory.SharedMemory) -> None:
    """A request still reading a region that is unregistered meanwhile keeps its mapping until it is done."""
    shm = SharedMemory(MemoryStore())
    shm.register("r", key(shm_object), 0, 16)
    shm_object.buf[:4] = np.float32(1.5).tobytes()
    arr = np.frombuffer(shm.window(ShmRef("r", 0, 4)), dtype=np.float32)
    shm.unregister_all()
    assert arr[0] == 1.5
    assert shm.status() == []


def test_gateways_share_registrations(shm_object: shared_memory.SharedMemory, tmp_path: pathlib.Path) -> None:
    """Registered with one process, used by another; re-registered under the name, mapped afresh."""
    here, there = SharedMemory(DirectoryStore(str(tmp_path))), SharedMemory(DirectoryStore(str(tmp_path)))
    here.register("r", key(shm_object), 0, 16)
    shm_object.buf[:2] = b"hi"
    assert bytes(there.window(ShmRef("r", 0, 2))) == b"hi"
    with pytest.raises(AlreadyExists):
        there.register("r", key(shm_object), 0, 16)
    there.unregister("r")
    with pytest.raises(NotFound):
        here.window(ShmRef("r", 0, 2))
    there.register("r", key(shm_object), 8, 8)
    shm_object.buf[8:10] = b"yo"
    assert bytes(here.window(ShmRef("r", 0, 2))) == b"yo"
    assert [r.offset for r in here.status()] == [8]
    here.close(forget=True)
    assert there.status() == []


@pytest.fixture
def shm_entry() -> Iterator[pathlib.Path]:
    """A fresh name under /dev/shm, removed after the test."""
    path = pathlib.Path("/dev/shm") / f"serve_app_unit_{uuid.uuid4().hex[:12]}"
    yield path
    path.unlink(missing_ok=True)


def test_a_symbolic_link_is_not_followed(shm_entry: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """As shm_open (O_NOFOLLOW): a link under /dev/shm must not open the file it names."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 4096)
    shm_entry.symlink_to(secret)
    shm = SharedMemory(MemoryStore())
    with pytest.raises(InternalError, match=f"Unable to open shared memory region: '/{shm_entry.name}'"):
        shm.register("r", f"/{shm_entry.name}", 0, 16)
    assert shm.status() == [] and secret.read_bytes() == b"s" * 4096


def test_a_link_to_a_shared_memory_object_is_not_followed_either(
    shm_entry: pathlib.Path, shm_object: shared_memory.SharedMemory
) -> None:
    shm_entry.symlink_to(pathlib.Path("/dev/shm") / shm_object.name.lstrip("/"))
    with pytest.raises(InternalError, match="Unable to open shared memory region"):
        SharedMemory(MemoryStore()).register("r", f"/{shm_entry.name}", 0, 16)


def test_only_regular_objects_are_mapped(shm_entry: pathlib.Path) -> None:
    os.mkfifo(shm_entry)
    with pytest.raises(InternalError, match="Unable to open shared memory region"):  # and no hang on the FIFO
        SharedMemory(MemoryStore()).register("r", f"/{shm_entry.name}", 0, 16)
