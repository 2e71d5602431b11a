from __future__ import annotations

from multiprocessing import shared_memory

import pytest

from serve_app.errors import InvalidArgument, NotFound
from serve_app.shared_memory import MemoryStore, SharedMemory, cuda
from tests.support.shm import key


def test_register_is_refused_as_without_gpus() -> None:
    with pytest.raises(
        InvalidArgument, match=r"^failed to register CUDA shared memory region: 'c', GPUs not supported$"
    ):
        cuda.register("c")
    with pytest.raises(InvalidArgument, match="GPUs not supported"):  # Triton's gRPC handler: no name check
        cuda.register("")
    with pytest.raises(InvalidArgument, match="'region name' is necessary to register cuda shared memory region"):
        cuda.register("", name_required=True)


def test_status_lists_nothing_and_knows_system_regions(shm_object: shared_memory.SharedMemory) -> None:
    system = SharedMemory(MemoryStore())
    system.register("sys", key(shm_object), 0, 16)
    assert cuda.status(system) == []
    with pytest.raises(NotFound, match=r"^Unable to find cuda shared memory region: 'c'$"):
        cuda.status(system, "c")
    with pytest.raises(
        NotFound, match=r"^The region named 'sys' is registered as system shared memory, not CUDA shared"
    ):
        cuda.status(system, "sys")
    with pytest.raises(NotFound, match="Unable to find cuda shared memory region: 'sys'"):
        cuda.status(SharedMemory(), "sys")  # the extension off: nothing is registered
    system.close()
