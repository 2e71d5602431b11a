"""One registered region: what a client registered, and its mapping in this process.

A region is a window (``offset``, ``byte_size``) of a POSIX shared memory object the client created on this
host (``shm_open(key)``, which Linux keeps under ``/dev/shm``).  The mapping covers the window only; mmap
needs a page-aligned offset, so it starts at the page below and the view skips the difference.

The object is opened as glibc's ``shm_open`` (which Triton uses) opens it: without following a symbolic link
(``O_NOFOLLOW``: a link under ``/dev/shm`` would let a client read and write any file the server can open),
and only a regular shared memory object is mapped (not a FIFO, a socket or a device).
"""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass

from serve_app.errors import InternalError, InvalidArgument

SHM_DIR = "/dev/shm"
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # non-blocking: a FIFO can't hang us


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
        unable = InternalError(f"Unable to open shared memory region: '{reg.key}'")
        try:
            fd = os.open(object_path(reg.key), _OPEN_FLAGS)
        except OSError:  # ELOOP for a symbolic link, as shm_open
            raise unable from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise unable
            size = info.st_size
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
