"""What the model manager publishes and every gateway serves: the loaded model versions.

The set of loaded models is cluster state.  One manager owns it and bumps
``revision`` on each change; gateways (however many, whenever they start)
apply the newest snapshot, so all of them answer ready, metadata and infer
the same way.  Plain data, picklable across Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serve_app.keys import ModelKey


@dataclass(frozen=True, slots=True)
class DeploymentRef:
    """One Serve deployment running instances of a model version (one instance group): a dedicated
    deployment, or the pool of shared hosts that holds them."""

    app: str  # Serve application holding it (one per deployment and load generation)
    name: str  # deployment name
    replicas: int  # instances it starts with (autoscaling may change the count)
    autoscaled: bool = False
    hosted: bool = False  # a pool of shared hosts (each holds instances of many models), not one replica each


@dataclass(frozen=True, slots=True)
class ServedVersion:
    name: str
    version: int
    config_bytes: bytes
    deployments: tuple[DeploymentRef, ...]  # empty for an ensemble
    labels: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (output, class labels)
    generation: int = 0  # which load of the model this is; a reload makes a new one
    state: str = "READY"
    reason: str = ""

    @property
    def key(self) -> ModelKey:
        return ModelKey(self.name, self.version, self.generation)


@dataclass(frozen=True, slots=True)
class ServingState:
    revision: int = 0
    served: tuple[ServedVersion, ...] = ()
    failed: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (model, reason): nothing served

    def versions(self) -> dict[ModelKey, ServedVersion]:
        """The served versions by :attr:`ModelKey.version_key` (whichever load serves each)."""
        return {v.key.version_key: v for v in self.served}
