"""A request's cancellation that leaves its responses flowing: Triton's request cancel, as BLS uses it.

Closing a stream cancels its request and drops what the model sends after.
Triton's BLS ``ResponseIterator.cancel()`` does less: the called model's
``is_cancelled()`` turns true, and the caller goes on reading until the
model's final response (often a CANCELLED error).  A :class:`CancelSignal`
rides with the request (``InferRequest.cancel``, ``RequestPart.cancel``)
to wherever its instance runs; each hop between processes forwards it
(the direct channel sends a frame for it), and the instance marks the
request cancelled when it fires.

Pickled, a signal crosses as a new one that keeps only whether it has fired:
its listeners stay in the process that registered them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

Listener = Callable[[], None]


class CancelSignal:
    """Fires once; listeners run in the thread that fires it (or at once, when added after)."""

    __slots__ = ("_fired", "_listeners", "_lock")

    def __init__(self, fired: bool = False) -> None:
        self._fired = fired
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()

    @property
    def fired(self) -> bool:
        return self._fired

    def fire(self) -> None:
        with self._lock:
            if self._fired:
                return
            self._fired = True
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener()

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` when the signal fires; returns how to stop listening."""
        with self._lock:
            if not self._fired:
                self._listeners.append(listener)
                return lambda: self._forget(listener)
        listener()
        return lambda: None

    def _forget(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def __reduce__(self) -> tuple[Any, ...]:
        return (CancelSignal, (self._fired,))

    def __repr__(self) -> str:
        return f"CancelSignal(fired={self._fired})"
