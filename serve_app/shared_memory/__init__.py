"""Triton's system shared memory extension, without any protocol: regions clients register, their mappings
and the bounds every access is checked against.  CUDA shared memory is answered as not supported (``cuda``)."""

from serve_app.shared_memory.manager import NOT_ENABLED, SharedMemory
from serve_app.shared_memory.region import Registration, ShmRef
from serve_app.shared_memory.store import DirectoryStore, MemoryStore, RegionStore, node_directory

__all__ = [
    "NOT_ENABLED",
    "DirectoryStore",
    "MemoryStore",
    "RegionStore",
    "Registration",
    "SharedMemory",
    "ShmRef",
    "node_directory",
]
