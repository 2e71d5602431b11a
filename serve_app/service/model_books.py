"""The model manager's books: which versions each model serves and on what, and why the others don't.

A deploy starts a new generation of some models; how it went comes from the
Ray layer (applications that did not start, host groups and instances that
failed to load) and is decided here: which models failed (an ensemble fails
with a step that failed and serves no version), which versions serve
UNAVAILABLE (``keep_failed_instances``), and what each outcome leaves stale
(a reload's old applications and host groups, a failed load's new ones).  A
failed reload keeps the generation that serves.  Pure: the model manager
(``rayserve/model_manager.py``) makes the Ray calls and keeps these books.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from serve_app.config import ENSEMBLE_PLATFORM
from serve_app.config.ensemble_deps import composing_models
from serve_app.keys import ModelKey
from serve_app.protos import model_config_pb2 as mc
from serve_app.service.serving_state import ServedVersion, ServingState


@dataclass
class Generation:
    """What a deploy started for one model: its versions, its own Serve applications, its groups in shared
    hosts (by group id) and its sequence models (for the router)."""

    served: list[ServedVersion] = field(default_factory=list)
    apps: list[str] = field(default_factory=list)
    groups: set[str] = field(default_factory=set)
    sequences: list[Any] = field(default_factory=list)


@dataclass
class Stale:
    """Applications and shared-host groups nobody serves any longer (to delete once the gateways moved)."""

    apps: list[str] = field(default_factory=list)
    groups: set[str] = field(default_factory=set)

    def add(self, apps: Sequence[str], groups: set[str]) -> None:
        self.apps += apps
        self.groups |= groups


@dataclass
class DeployResults:
    """What the Ray layer saw of a deploy (each error keyed by what it names)."""

    app_errors: Mapping[str, str] = field(default_factory=dict)  # application -> why it did not start
    group_errors: Mapping[str, str] = field(default_factory=dict)  # shared-host group id -> its load error
    load_errors: Mapping[ModelKey, str] = field(default_factory=dict)  # version -> its instances' error


class ModelBooks:
    def __init__(self) -> None:
        self.served: dict[str, list[ServedVersion]] = {}  # model -> its served versions (one generation)
        self.apps: dict[str, list[str]] = {}  # model -> its Serve applications (dedicated instances)
        self.hosted: dict[str, set[str]] = {}  # model -> its instance groups in shared hosts
        self.sequences: dict[str, list[Any]] = {}  # model -> its sequence models, for the router
        self.failed: dict[str, str] = {}  # model -> why nothing of it is served
        self.unannounced: dict[str, set[str]] = {}  # model -> its groups starting gateways have yet to load

    # -- a deploy's outcome ----------------------------------------------------------------------
    def failures(
        self,
        requested: Mapping[str, mc.ModelConfig],
        new: Mapping[str, Generation],
        group_models: Sequence[tuple[str, str]],
        results: DeployResults,
        failures: dict[str, str],
        keep_failed: bool,
    ) -> dict[ModelKey, str]:
        """Add to ``failures`` (model -> why) the models the deploy failed; returns the versions that serve
        UNAVAILABLE instead (their instances' load error).  ``group_models``: (group id, model) of each group
        placed in shared hosts, in the plan's order; the first error of a model is its reason."""
        for group, model in group_models:
            error = results.group_errors.get(group)
            if error:
                failures.setdefault(model, error)
        kept: dict[ModelKey, str] = {}
        for generation in new.values():
            for sv in generation.served:
                for ref in sv.deployments:
                    if results.app_errors.get(ref.app):
                        failures.setdefault(sv.name, results.app_errors[ref.app])
                bad = results.load_errors.get(sv.key.version_key)
                if bad and keep_failed:
                    kept[sv.key.version_key] = bad
                elif bad:
                    failures.setdefault(sv.name, bad)
        self._fail_ensembles(requested, failures)
        return kept

    def _fail_ensembles(self, requested: Mapping[str, mc.ModelConfig], failures: dict[str, str]) -> None:
        """An ensemble loaded with a step that failed (and has no version serving) fails too."""
        changed = True
        while changed:
            changed = False
            for name, config in requested.items():
                if name in failures or config.platform != ENSEMBLE_PLATFORM:
                    continue
                for step in composing_models(config):
                    if step in failures and step not in self.served:
                        failures[name] = f"its step model '{step}' failed to load: {failures[step]}"
                        changed = True
                        break

    def serve(self, name: str, generation: Generation, kept: Mapping[ModelKey, str], stale: Stale) -> None:
        """``name``'s new generation serves (READY, or UNAVAILABLE where ``kept`` says why); the old one's
        applications and groups go stale."""
        stale.add(self.apps.get(name, []), self.hosted.get(name, set()))
        self.served[name] = [_ready(sv, kept.get(sv.key.version_key)) for sv in generation.served]
        self.apps[name] = generation.apps
        self.hosted[name] = generation.groups
        self.sequences[name] = generation.sequences
        self.failed.pop(name, None)

    def load_failed(self, name: str, reason: str) -> None:
        """``name`` failed to load: listed so unless a version of it still serves (a failed reload)."""
        if name not in self.served:
            self.failed[name] = reason

    # -- unloading -------------------------------------------------------------------------------
    def remove(self, name: str, reason: str, stale: Stale) -> bool:
        """``name`` serves no longer (``reason``: unloaded, or why it failed); whether it served."""
        stale.add(self.apps.pop(name, []), self.hosted.pop(name, set()))
        served = self.served.pop(name, None)
        self.sequences.pop(name, None)
        self.failed[name] = reason
        return bool(served)

    # -- what gateways and the repository index read ---------------------------------------------
    def snapshot(self, revision: int) -> ServingState:
        served = tuple(v for name in sorted(self.served) for v in self.served[name])
        failed = tuple(sorted((n, r) for n, r in self.failed.items() if n not in self.served))
        return ServingState(revision, served, failed)

    def states(self) -> dict[ModelKey, tuple[str, str]]:
        """(model, version) -> (state, reason) of each served version."""
        return {v.key.version_key: (v.state, v.reason) for vs in self.served.values() for v in vs}

    def sequence_models(self) -> tuple[Any, ...]:
        return tuple(m for ms in self.sequences.values() for m in ms)


def _ready(sv: ServedVersion, failure: str | None = None) -> ServedVersion:
    return replace(sv, state="UNAVAILABLE", reason=failure) if failure else replace(sv, state="READY", reason="")
