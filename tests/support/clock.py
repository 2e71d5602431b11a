"""A clock the test moves by hand: schedulers take ``clock=`` so their decisions are tested without sleeping."""

from __future__ import annotations


class FakeClock:
    """Returns ``now`` (nanoseconds) until the test changes it."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns
