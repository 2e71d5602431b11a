"""The one key of a loaded model version, shared by the registry, the schedulers, the executors and the router."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class ModelKey:
    """One load (``generation``) of one version of one model.

    A reload serves a new generation beside the old one until the old one has
    drained, so per-load tables (schedulers, channels) key by all three; what
    outlives a load keys by :attr:`version_key` (statistics summed over
    gateways) or :attr:`label` (the sequence router's tables).
    """

    name: str
    version: int
    generation: int = 0

    @property
    def label(self) -> str:
        """``<name>:<version>``: the version, whichever load serves it."""
        return f"{self.name}:{self.version}"

    @property
    def version_key(self) -> ModelKey:
        """The version whichever load serves it: gateways add up statistics by it (two gateways may hold
        different loads for a moment during a reload)."""
        return ModelKey(self.name, self.version)
