"""Triton's ``--rate-limit`` and ``--rate-limit-resource`` settings, parsed with the other server settings so
a wrong entry stops the server at start (the limiter itself is ``serve_app.scheduling.rate_limiter``)."""

from __future__ import annotations

from collections.abc import Iterable

from serve_app.errors import InvalidArgument

RATE_LIMIT_MODES = ("off", "execution_count")


def parse_resources(entries: Iterable[str]) -> dict[str, int]:
    """``--rate-limit-resource name:count[:device]`` entries (several for one name: the largest count)."""
    out: dict[str, int] = {}
    for entry in entries:
        parts = entry.split(":")
        if len(parts) not in (2, 3) or not parts[0]:
            raise InvalidArgument(f"--rate-limit-resource '{entry}': expected <name>:<count>[:<device>]")
        try:
            count = int(parts[1])
            if len(parts) == 3:
                int(parts[2])
        except ValueError:
            count = -1
        if count < 0:
            raise InvalidArgument(f"--rate-limit-resource '{entry}': count and device must be whole numbers")
        out[parts[0]] = max(out.get(parts[0], 0), count)
    return out
