"""What the server serves: every model, its versions, their state and config."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from serve_app.errors import InvalidArgument, NotFound, Unavailable
from serve_app.inference.signature import ModelSignature
from serve_app.protos import model_config_pb2 as mc


class ModelState(enum.Enum):
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass(slots=True)
class ModelVersionEntry:
    name: str
    version: int
    config: mc.ModelConfig
    signature: ModelSignature
    state: ModelState = ModelState.READY
    reason: str = ""
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)  # output -> class labels
    generation: int = 0  # which load of the model: a reload serves a new entry beside the old one

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.name, self.version, self.generation)


@dataclass(slots=True)
class FailedModel:
    name: str
    reason: str
    version: int | None = None


class ModelCatalog:
    """Models by name and version; resolves requests like Triton does."""

    def __init__(self) -> None:
        self._models: dict[str, dict[int, ModelVersionEntry]] = {}
        self._failed: dict[str, FailedModel] = {}

    def add(self, entry: ModelVersionEntry) -> None:
        self._models.setdefault(entry.name, {})[entry.version] = entry
        self._failed.pop(entry.name, None)

    def remove(self, name: str, version: int) -> ModelVersionEntry | None:
        versions = self._models.get(name)
        if versions is None:
            return None
        entry = versions.pop(version, None)
        if not versions:
            del self._models[name]
        return entry

    def remove_failed(self, name: str) -> None:
        self._failed.pop(name, None)

    def add_failed(self, failed: FailedModel) -> None:
        self._failed[failed.name] = failed

    def names(self) -> list[str]:
        return sorted(set(self._models) | set(self._failed))

    def versions(self, name: str) -> list[ModelVersionEntry]:
        return [v for _, v in sorted(self._models.get(name, {}).items())]

    def failed(self, name: str) -> FailedModel | None:
        return self._failed.get(name)

    def all_entries(self) -> list[ModelVersionEntry]:
        return [e for n in sorted(self._models) for e in self.versions(n)]

    def resolve(self, name: str, version: str = "") -> ModelVersionEntry:
        """The entry a request names; an empty version is the newest served one."""
        versions = self._models.get(name)
        if not versions:
            failed = self._failed.get(name)
            if failed is not None:
                raise Unavailable(f"Request for unknown model: '{name}' has no available versions: {failed.reason}")
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        if not version:
            return versions[max(versions)]
        try:
            number = int(version)
        except ValueError:
            raise InvalidArgument(f"failed to parse model version '{version}' for model '{name}'") from None
        entry = versions.get(number)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return entry

    def resolve_ready(self, name: str, version: str = "") -> ModelVersionEntry:
        entry = self.resolve(name, version)
        if entry.state is not ModelState.READY:
            raise Unavailable(f"Request for unknown model: '{name}' version {entry.version} is not at ready state")
        return entry


def ensemble_readiness(catalog: ModelCatalog) -> None:
    """An ensemble is ready only when every model its steps use is: mark the others UNAVAILABLE."""
    from serve_app.config import ENSEMBLE_PLATFORM

    changed = True
    while changed:
        changed = False
        for entry in catalog.all_entries():
            if entry.config.platform != ENSEMBLE_PLATFORM or entry.state is not ModelState.READY:
                continue
            for step in entry.config.ensemble_scheduling.step:
                version = str(step.model_version) if step.model_version >= 0 else ""
                try:
                    ready = catalog.resolve(step.model_name, version).state is ModelState.READY
                except Exception:
                    ready = False
                if not ready:
                    entry.state = ModelState.UNAVAILABLE
                    entry.reason = f"composing model '{step.model_name}' is not ready"
                    changed = True
                    break
