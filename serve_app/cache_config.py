"""Triton's ``--cache-config``: the response cache the server keeps for models that enable it.

``local,size=N`` is Triton's local cache of ``N`` bytes (``size=0``, or no entry: no cache).  Parsed with
the other server settings, so a wrong entry stops the server at start.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from serve_app.errors import InvalidArgument

LOCAL = "local"


@dataclass(frozen=True, slots=True)
class CacheConfig:
    size_bytes: int = 0  # 0: no response cache

    @classmethod
    def parse(cls, entries: Iterable[str]) -> CacheConfig:
        """From ``<cache>,<setting>=<value>`` entries, as Triton's --cache-config takes them."""
        size = 0
        for entry in entries:
            cache, sep, setting = entry.partition(",")
            name, eq, value = setting.partition("=")
            if not sep or not eq:
                raise InvalidArgument(f"--cache-config '{entry}': expected <cache>,<setting>=<value>")
            if cache.strip() != LOCAL:
                raise InvalidArgument(f"--cache-config: cache '{cache.strip()}' is not available (only '{LOCAL}')")
            if name.strip() != "size":
                raise InvalidArgument(f"--cache-config: the local cache has no setting '{name.strip()}' (only size)")
            try:
                size = int(value.strip())
            except ValueError:
                size = -1
            if size < 0:
                raise InvalidArgument(f"--cache-config local,size={value.strip()}: expected a number of bytes")
        return cls(size)

    @property
    def enabled(self) -> bool:
        return self.size_bytes > 0
