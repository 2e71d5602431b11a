"""The server's system shared memory: register, status, unregister, and the bytes a request's tensor names.

Off unless the server runs with ``--allow-client-shm``: a region lets a client have the server read and
write any file it can name under ``/dev/shm`` of the server's host, so it is for clients on that host that
the operator trusts.  Off, registering fails with :data:`NOT_ENABLED`, and so does a request naming a region.

Each process maps a region on first use and keeps the mapping while the registration stands; a region
re-registered under the same name (another token) is mapped afresh.  Messages are Triton's
(``shared_memory_manager.cc``).
"""

from __future__ import annotations

import uuid

from serve_app.errors import InvalidArgument, NotFound
from serve_app.shared_memory.region import Mapping, Registration, ShmRef
from serve_app.shared_memory.store import RegionStore, already_registered

NOT_ENABLED = (
    "system shared memory is not enabled on this server: start it with --allow-client-shm to let clients on "
    "its host register regions"
)


class SharedMemory:
    """The registry of one server (``store``: where registrations live; None: the extension is off)."""

    def __init__(self, store: RegionStore | None = None) -> None:
        self.store = store
        self._mappings: dict[str, Mapping] = {}  # region name -> this process's mapping of it

    @property
    def enabled(self) -> bool:
        return self.store is not None

    def _store(self) -> RegionStore:
        if self.store is None:
            raise InvalidArgument(NOT_ENABLED)
        return self.store

    # -- the extension's API ---------------------------------------------------------------------
    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        store = self._store()
        if not name:
            raise InvalidArgument("'region name' is necessary to register system shared memory region")
        if store.get(name) is not None:
            raise already_registered(name)
        mapping = Mapping(Registration(name, key, offset, byte_size, uuid.uuid4().hex))
        try:
            store.add(mapping.registration)
        except BaseException:
            mapping.close()
            raise
        self._drop(name)
        self._mappings[name] = mapping

    def unregister(self, name: str) -> None:
        """Forget ``name``; nothing registered under it is fine, as in Triton."""
        if self.store is not None:
            self.store.remove(name)
        self._drop(name)

    def unregister_all(self) -> None:
        if self.store is not None:
            for reg in self.store.all():
                self.store.remove(reg.name)
        for name in list(self._mappings):
            self._drop(name)

    def status(self, name: str = "") -> list[Registration]:
        """Every region, or the one named (NOT_FOUND when there is none)."""
        regs = self.store.all() if self.store is not None else []
        self._forget_stale({r.name: r.token for r in regs})
        if not name:
            return regs
        found = [r for r in regs if r.name == name]
        if not found:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return found

    # -- what requests read and write --------------------------------------------------------------
    def window(self, ref: ShmRef) -> memoryview:
        """The ``ref.byte_size`` bytes at ``ref.offset`` of the region a tensor names: a view of the mapping."""
        if self.store is None:
            raise InvalidArgument(f"{NOT_ENABLED} (the request names region '{ref.region}')")
        reg = self.store.get(ref.region)
        if reg is None:
            self._drop(ref.region)
            raise NotFound(f"Unable to find shared memory region: '{ref.region}'")
        mapping = self._mappings.get(ref.region)
        if mapping is None or mapping.registration.token != reg.token:
            self._drop(ref.region)
            mapping = self._mappings[ref.region] = Mapping(reg)
        return mapping.window(ref.region, ref.offset, ref.byte_size)

    def close(self, forget: bool = False) -> None:
        """Unmap everything; ``forget``: the server is going away, drop the registrations too."""
        for name in list(self._mappings):
            self._drop(name)
        if forget and self.store is not None:
            self.store.close()

    def _drop(self, name: str) -> None:
        mapping = self._mappings.pop(name, None)
        if mapping is not None:
            mapping.close()

    def _forget_stale(self, current: dict[str, str]) -> None:
        """Unmap regions another process unregistered (or re-registered) since this one mapped them."""
        for name, mapping in list(self._mappings.items()):
            if current.get(name) != mapping.registration.token:
                self._drop(name)
