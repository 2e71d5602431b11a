"""CUDA shared memory: this server has no CUDA IPC, so no region can be registered; the rest answers as a
Triton built without GPU support does (an empty status, unregister of nothing succeeds).  Triton keeps one
namespace for both kinds, so a name registered as system shared memory is reported as such."""

from __future__ import annotations

from serve_app.errors import InvalidArgument, NotFound
from serve_app.shared_memory.manager import SharedMemory


def register(name: str, name_required: bool = False) -> None:
    """Refused; ``name_required``: Triton's HTTP handler asks for a name first, its gRPC handler does not."""
    if name_required and not name:
        raise InvalidArgument("'region name' is necessary to register cuda shared memory region")
    raise InvalidArgument(f"failed to register CUDA shared memory region: '{name}', GPUs not supported")


def status(system: SharedMemory, name: str = "") -> list[object]:
    """No region is ever registered: every one is unknown, or a system shared memory region."""
    if not name:
        return []
    if system.store is not None and system.store.get(name) is not None:
        raise NotFound(f"The region named '{name}' is registered as system shared memory, not CUDA shared memory")
    raise NotFound(f"Unable to find cuda shared memory region: '{name}'")
