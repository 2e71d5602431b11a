"""CUDA shared memory: this server has no CUDA IPC, so no region can be registered; the rest answers as a
Triton built without GPU support does (an empty status, unregister of nothing succeeds)."""

from __future__ import annotations

from serve_app.errors import InvalidArgument, NotFound


def register(name: str) -> None:
    if not name:
        raise InvalidArgument("'region name' is necessary to register cuda shared memory region")
    raise InvalidArgument(f"failed to register CUDA shared memory region: '{name}', GPUs not supported")


def status(name: str = "") -> list[object]:
    """No region is ever registered: every one is unknown."""
    if name:
        raise NotFound(f"Unable to find cuda shared memory region: '{name}'")
    return []
