"""What the server serves: one :class:`ServedModel` per loaded model version, and the registry of them.

A ``ServedModel`` is Triton's ``Model`` object: the version's config,
signature, state and labels, and the scheduler that queues its requests,
under one :class:`~serve_app.keys.ModelKey`.  The registry resolves a
request's model and version as Triton does, and learns what to serve from
the model manager's :class:`ServingState` in two pure steps: :meth:`plan`
says what changes, :meth:`apply` makes it so (the Ray gateway opens the new
versions' channels in between, so a model is never served before it can run).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from serve_app.config import ENSEMBLE_PLATFORM
from serve_app.errors import NotFound, ServeError, Unavailable
from serve_app.inference.signature import ModelSignature
from serve_app.keys import ModelKey, parse_version
from serve_app.protos import model_config_pb2 as mc
from serve_app.scheduling.base import Scheduler
from serve_app.service.serving_state import DeploymentRef, ServedVersion, ServingState


class ModelState(enum.Enum):
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass(slots=True, eq=False)
class ServedModel:
    """One loaded model version (one generation of it): what a request to it needs."""

    key: ModelKey
    config: mc.ModelConfig
    signature: ModelSignature
    state: ModelState = ModelState.READY
    reason: str = ""
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)  # output -> class labels
    scheduler: Scheduler | None = None  # made by the service when the version is served
    # What kind of model it is, read from the config once (every request asks).
    is_ensemble: bool = field(init=False)
    is_sequence: bool = field(init=False)
    is_decoupled: bool = field(init=False)  # it answers with a stream (``model_transaction_policy { decoupled }``)

    def __post_init__(self) -> None:
        self.is_ensemble = self.config.platform == ENSEMBLE_PLATFORM
        self.is_sequence = self.config.HasField("sequence_batching")
        self.is_decoupled = self.config.model_transaction_policy.decoupled

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def version(self) -> int:
        return self.key.version

    @classmethod
    def create(
        cls,
        name: str,
        version: int,
        config: mc.ModelConfig,
        *,
        labels: dict[str, tuple[str, ...]] | None = None,
        generation: int = 0,
        state: ModelState = ModelState.READY,
        reason: str = "",
    ) -> ServedModel:
        """A model version from its config (the signature is derived from it)."""
        signature = ModelSignature.from_config(config, str(version))
        return cls(ModelKey(name, version, generation), config, signature, state, reason, dict(labels or {}))

    @classmethod
    def from_served(cls, sv: ServedVersion) -> ServedModel:
        """A version as the model manager publishes it."""
        config = mc.ModelConfig.FromString(sv.config_bytes)
        return cls.create(
            sv.name,
            sv.version,
            config,
            labels=dict(sv.labels),
            generation=sv.generation,
            state=ModelState(sv.state),
            reason=sv.reason,
        )


@dataclass(slots=True)
class FailedModel:
    name: str
    reason: str
    version: int | None = None


@dataclass(slots=True)
class RegistryChanges:
    """What applying a :class:`ServingState` changes (see :meth:`ModelRegistry.plan`)."""

    revision: int
    added: list[tuple[ServedModel, tuple[DeploymentRef, ...]]] = field(default_factory=list)
    retired: list[ServedModel] = field(default_factory=list)  # replaced or unloaded: drain, then drop
    updated: list[tuple[ServedModel, ModelState, str]] = field(default_factory=list)  # same load, new state
    failed: dict[str, str] = field(default_factory=dict)  # model -> why nothing of it is served


class ModelRegistry:
    """Models by name and version; resolves requests like Triton does."""

    def __init__(self) -> None:
        self._models: dict[str, dict[int, ServedModel]] = {}
        self._failed: dict[str, FailedModel] = {}
        self.revision = -1  # of the last ServingState applied

    # -- contents -----------------------------------------------------------------
    def add(self, model: ServedModel) -> None:
        self._models.setdefault(model.name, {})[model.version] = model
        self._failed.pop(model.name, None)

    def remove(self, name: str, version: int) -> ServedModel | None:
        versions = self._models.get(name)
        if versions is None:
            return None
        model = versions.pop(version, None)
        if not versions:
            del self._models[name]
        return model

    def remove_failed(self, name: str) -> None:
        self._failed.pop(name, None)

    def add_failed(self, failed: FailedModel) -> None:
        self._failed[failed.name] = failed

    def names(self) -> list[str]:
        return sorted(set(self._models) | set(self._failed))

    def versions(self, name: str) -> list[ServedModel]:
        return [v for _, v in sorted(self._models.get(name, {}).items())]

    def failed(self, name: str) -> FailedModel | None:
        return self._failed.get(name)

    def all_models(self) -> list[ServedModel]:
        return [m for n in sorted(self._models) for m in self.versions(n)]

    # -- resolution ---------------------------------------------------------------
    def resolve(self, name: str, version: str = "") -> ServedModel:
        """The model version a request names; an empty version is the newest served one."""
        versions = self._models.get(name)
        if not versions:
            failed = self._failed.get(name)
            if failed is not None:
                raise Unavailable(f"Request for unknown model: '{name}' has no available versions: {failed.reason}")
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        if not version:
            return versions[max(versions)]
        number = parse_version(version)
        model = versions.get(number)
        if model is None:
            raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return model

    def resolve_ready(self, name: str, version: str = "") -> ServedModel:
        model = self.resolve(name, version)
        if model.state is not ModelState.READY:
            raise Unavailable(f"Request for unknown model: '{name}' version {model.version} is not at ready state")
        return model

    # -- following the model manager ------------------------------------------------
    def plan(self, state: ServingState) -> RegistryChanges:
        """What serving ``state`` changes, without changing anything (``state`` must be newer)."""
        changes = RegistryChanges(state.revision, failed=dict(state.failed))
        current = {m.key.version_key: m for m in self.all_models()}
        wanted = state.versions()
        for key, sv in wanted.items():
            old = current.get(key)
            if old is not None and old.key.generation == sv.generation:
                changes.updated.append((old, ModelState(sv.state), sv.reason))
                continue
            changes.added.append((ServedModel.from_served(sv), sv.deployments))
            if old is not None:
                changes.retired.append(old)
        changes.retired += [old for key, old in current.items() if key not in wanted]
        return changes

    def apply(self, changes: RegistryChanges) -> None:
        """Serve what :meth:`plan` found; ensembles whose steps are not ready become UNAVAILABLE."""
        for model, state, reason in changes.updated:
            model.state, model.reason = state, reason
        for model, _ in changes.added:
            self.add(model)
        replaced = {m.key.version_key for m, _ in changes.added}
        for old in changes.retired:
            if old.key.version_key not in replaced:
                self.remove(old.name, old.version)
        for name in self.names():
            if name not in changes.failed and self.failed(name) is not None:
                self.remove_failed(name)
        for name, reason in changes.failed.items():
            if not self.versions(name):
                self.add_failed(FailedModel(name, reason))
        ensemble_readiness(self)
        self.revision = changes.revision


def ensemble_decoupling(registry: ModelRegistry) -> None:
    """An ensemble with a decoupled step (or a step that is such an ensemble) is decoupled itself, as
    Triton sets it in the ensemble's config: it answers on a stream only, once per response of its steps."""
    ensembles = [m for m in registry.all_models() if m.is_ensemble]
    decoupled = {id(m): False for m in ensembles}
    changed = True
    while changed:
        changed = False
        for model in ensembles:
            if decoupled[id(model)]:
                continue
            for step in model.config.ensemble_scheduling.step:
                version = str(step.model_version) if step.model_version >= 0 else ""
                try:
                    used = registry.resolve(step.model_name, version)
                except ServeError:
                    continue
                if decoupled.get(id(used), used.is_decoupled):
                    decoupled[id(model)] = changed = True
                    break
    for model in ensembles:
        model.config.model_transaction_policy.decoupled = model.is_decoupled = decoupled[id(model)]


def ensemble_readiness(registry: ModelRegistry) -> None:
    """An ensemble is ready only when every model its steps use is: mark the others UNAVAILABLE (and those
    with a decoupled step decoupled)."""
    ensemble_decoupling(registry)
    changed = True
    while changed:
        changed = False
        for model in registry.all_models():
            if not model.is_ensemble or model.state is not ModelState.READY:
                continue
            for step in model.config.ensemble_scheduling.step:
                version = str(step.model_version) if step.model_version >= 0 else ""
                try:
                    ready = registry.resolve(step.model_name, version).state is ModelState.READY
                except ServeError:
                    ready = False
                if not ready:
                    model.state = ModelState.UNAVAILABLE
                    model.reason = f"composing model '{step.model_name}' is not ready"
                    changed = True
                    break
