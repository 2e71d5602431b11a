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


def parse_version(text: str) -> int:
    """A version a request names (``/versions/<v>``, gRPC ``model_version``), with Triton's messages."""
    from serve_app.errors import InvalidArgument

    try:
        number = int(text)
    except ValueError:
        raise InvalidArgument(
            f"failed to get model version from specified version string '{text}' (details: stol), version should "
            "be an integral value > 0"
        ) from None
    if number < 0:
        raise InvalidArgument(f"invalid model version specified '{text}' , version should be an integral value > 0")
    return number
