"""POSIX shared memory objects as a client creates them (under /dev/shm), for the shared memory tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory

import pytest


@pytest.fixture
def shm_object() -> Iterator[shared_memory.SharedMemory]:
    """A 64 KiB shared memory object (its key is ``"/" + .name``), removed after the test."""
    obj = shared_memory.SharedMemory(name=f"serve_app_test_{uuid.uuid4().hex[:12]}", create=True, size=65536)
    yield obj
    obj.close()
    obj.unlink()


def key(obj: shared_memory.SharedMemory) -> str:
    """The key a client registers ``obj`` under."""
    return "/" + obj.name
