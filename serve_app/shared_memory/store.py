"""Where registrations live: in this process, or in a directory every process of the server on a node shares.

A client registers a region with one gateway and may send its requests to another (the gateways of a node
share the ports), so with several front-end processes the registry is a per-node directory: one small JSON
file per region, created atomically (``os.link`` refuses an existing name, which is Triton's "already in
manager"), removed by unregister.  Shared memory is a property of the node, so the directory is too: no
process of another node could map the region anyway.  Readers cache a file by its inode and mtime, so a
request naming a region costs a ``stat``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from typing import Protocol

from serve_app.errors import AlreadyExists
from serve_app.shared_memory.region import Registration


def already_registered(name: str) -> AlreadyExists:
    return AlreadyExists(f"shared memory region '{name}' already in manager")


class RegionStore(Protocol):
    def add(self, reg: Registration) -> None:
        """Record ``reg``; AlreadyExists when its name is taken."""

    def remove(self, name: str) -> bool:
        """Forget the region ``name``; False when there was none."""

    def get(self, name: str) -> Registration | None: ...

    def all(self) -> list[Registration]:
        """Every registration, by name."""

    def close(self) -> None:
        """The server is going away: forget everything."""


class MemoryStore:
    """One process's registrations (the local server: one process serves both protocols)."""

    def __init__(self) -> None:
        self._regions: dict[str, Registration] = {}

    def add(self, reg: Registration) -> None:
        if reg.name in self._regions:
            raise already_registered(reg.name)
        self._regions[reg.name] = reg

    def remove(self, name: str) -> bool:
        return self._regions.pop(name, None) is not None

    def get(self, name: str) -> Registration | None:
        return self._regions.get(name)

    def all(self) -> list[Registration]:
        return [self._regions[n] for n in sorted(self._regions)]

    def close(self) -> None:
        self._regions.clear()


def node_directory(server_secret: bytes, node_id: str) -> str:
    """The registry directory of the server whose processes share ``server_secret`` on the Ray node
    ``node_id`` (the same path in each of them, another for each server and node; named by a hash, which
    tells nothing of the secret).  Keyed by the node, not by the temporary directory alone: nodes that share
    a filesystem (containers sharing a host's /tmp) must not share registrations nobody else can map."""
    digest = hashlib.sha256(b"serve_app shared memory\0" + server_secret + b"\0" + node_id.encode()).hexdigest()[:24]
    return os.path.join(tempfile.gettempdir(), f"serve_app-shm-{digest}")


class DirectoryStore:
    """Registrations as files in ``path``, shared by the processes of one server on a node."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, mode=0o700, exist_ok=True)
        self._cache: dict[str, tuple[tuple[int, int], Registration]] = {}

    def _file(self, name: str) -> str:
        return os.path.join(self.path, hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest() + ".json")

    def add(self, reg: Registration) -> None:
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        text = json.dumps(
            {"name": reg.name, "key": reg.key, "offset": reg.offset, "byte_size": reg.byte_size, "token": reg.token}
        )
        tmp = os.path.join(self.path, f".{uuid.uuid4().hex}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            os.link(tmp, self._file(reg.name))
        except FileExistsError:
            raise already_registered(reg.name) from None
        finally:
            os.unlink(tmp)

    def remove(self, name: str) -> bool:
        self._cache.pop(name, None)
        try:
            os.unlink(self._file(name))
        except FileNotFoundError:
            return False
        return True

    def get(self, name: str) -> Registration | None:
        path = self._file(name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._cache.pop(name, None)
            return None
        stamp = (st.st_ino, st.st_mtime_ns)
        cached = self._cache.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        reg = self._read(path)
        if reg is None:
            self._cache.pop(name, None)
            return None
        self._cache[name] = (stamp, reg)
        return reg

    def all(self) -> list[Registration]:
        try:
            files = [f for f in os.listdir(self.path) if f.endswith(".json")]
        except FileNotFoundError:
            return []
        regs = [r for r in (self._read(os.path.join(self.path, f)) for f in files) if r is not None]
        return sorted(regs, key=lambda r: r.name)

    def close(self) -> None:
        self._cache.clear()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.path)

    @staticmethod
    def _read(path: str) -> Registration | None:
        """A registration file, or None when it went away (unregistered meanwhile)."""
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except FileNotFoundError:
            return None
        return Registration(d["name"], d["key"], int(d["offset"]), int(d["byte_size"]), d["token"])
