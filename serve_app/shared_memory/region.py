"""One registered region: what a client registered, and its mapping in this process.

A region is a window (``offset``, ``byte_size``) of a POSIX shared memory object the client created on this
host (``shm_open(key)``, which Linux keeps under ``/dev/shm``).  The mapping covers the window only; mmap
needs a page-aligned offset, so it starts at the page below and the view skips the difference.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

from serve_app.errors import InternalError, InvalidArgument

SHM_DIR = "/dev/shm"


@dataclass(frozen=True, slots=True)
class Registration:
    """A region as registered; ``token`` tells two registrations under one name apart (the object behind a
    key may have been recreated in between, so a mapping is only reused for the same registration)."""

    name: str
    key: str
    offset: int
    byte_size: int
    token: str


@dataclass(frozen=True, slots=True)
class ShmRef:
    """Where a request's tensor lives: ``byte_size`` bytes at ``offset`` in the region ``region``."""

    region: str
    offset: int = 0
    byte_size: int = 0


def object_path(key: str) -> str:
    """The file behind ``shm_open(key)``; a key shm_open would refuse (a path, '.', '..') fails as it would."""
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise InternalError(f"Unable to open shared memory region: '{key}'")
    return os.path.join(SHM_DIR, name)


class Mapping:
    """A registration's window mapped read-write into this process."""

    def __init__(self, reg: Registration) -> None:
        self.registration = reg
        try:
            fd = os.open(object_path(reg.key), os.O_RDWR)
        except OSError:
            raise InternalError(f"Unable to open shared memory region: '{reg.key}'") from None
        try:
            size = os.fstat(fd).st_size
            if reg.offset + reg.byte_size > size:
                raise InvalidArgument(f"failed to register shared memory region '{reg.name}': invalid args")
            if reg.byte_size == 0:  # mmap refuses an empty window, as Triton's mmap does
                raise InvalidArgument(
                    f"failed to register shared memory region '{reg.name}': unable to process address space"
                    "Invalid argument"
                )
            start = reg.offset - reg.offset % mmap.ALLOCATIONGRANULARITY
            self._skip = reg.offset - start
            self._mmap = mmap.mmap(fd, self._skip + reg.byte_size, offset=start)
        finally:
            os.close(fd)
        self.view = memoryview(self._mmap)[self._skip :]

    def window(self, name: str, offset: int, byte_size: int) -> memoryview:
        """``byte_size`` bytes at ``offset`` in the region, with Triton's bounds checks."""
        size = self.registration.byte_size
        if offset < 0 or offset >= size:
            raise InvalidArgument(f"Invalid offset for shared memory region: '{name}'")
        if byte_size < 0 or offset + byte_size > size:
            raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{name}'")
        return self.view[offset : offset + byte_size]

    def close(self) -> None:
        """Unmap now, unless a request still holds a view: then the mapping goes with the last view."""
        self.view.release()
        try:
            self._mmap.close()
        except BufferError:
            pass
