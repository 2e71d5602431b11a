"""What the model repository extension asks of whoever owns the models: index, load, unload.

The front ends only decode a request into these calls; the owner (a Ray controller, a test fake)
decides what loading means.  Errors are raised as :mod:`serve_app.errors` types and reach the
client through the usual mapping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of the repository index: a model version, or a model that failed to load."""

    name: str
    version: str
    state: str
    reason: str


@dataclass(frozen=True, slots=True)
class LoadParameters:
    """A load request's overrides, as Triton accepts them on both protocols."""

    config_json: str | None = None  # the 'config' parameter: a JSON ModelConfig that overrides config.pbtxt
    files: dict[str, bytes] = field(default_factory=dict)  # 'file:<relative path>' parameters, keyed by the path


class RepositoryControl(Protocol):
    """The owner of the served models, for explicit model control."""

    async def index(self, ready_only: bool) -> list[IndexEntry]: ...

    async def load(self, name: str, params: LoadParameters) -> None:
        """Load (or reload) ``name``; ``params`` override its config and files when given."""
        ...

    async def unload(self, name: str, unload_dependents: bool) -> None:
        """Unload ``name``; with ``unload_dependents``, also the models it depends on that nothing else needs."""
        ...
