"""Free loopback ports for servers a test or script starts.

A port the kernel hands out for ``bind(port 0)`` comes from the ephemeral range, the same range every
other process's outgoing connections and port-0 listeners (Ray's workers, gRPC channels) draw from: in
the moment between choosing it and the server binding it, one of them may take it.  So the ports here
are drawn from below the ephemeral range (and above Ray's worker ports), where nothing binds by chance,
and checked free before they are handed out.
"""

from __future__ import annotations

import random
import socket

_LOW, _HIGH = 20_000, 32_000  # Ray's workers use 10002-19999; Linux's ephemeral range starts at 32768
_given: set[int] = set()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    for _ in range(1000):
        port = random.randint(_LOW, _HIGH)
        if port not in _given and _bindable(port):
            _given.add(port)
            return port
    with socket.socket() as s:  # the range is full: fall back to the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
