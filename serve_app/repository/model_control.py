"""Triton's model control modes and repository load/unload rules, as plain decisions.

:class:`ModelControl` decides *what* to load and unload and which states the
repository index reports; whoever owns the running models (the Ray model
manager, a test) carries the decisions out and reports back with
:meth:`~ModelControl.loaded`, :meth:`~ModelControl.load_failed` and
:meth:`~ModelControl.unloaded`.  No Ray, no asyncio, no threads: one caller at
a time (the manager serializes).

Followed from Triton (core ``src/model_repository_manager/model_repository_manager.cc``
and ``model_lifecycle.cc``, server ``src/command_line_parser.cc``, docs
``user_guide/model_management.md`` and ``protocol/extension_model_repository.md``):

* modes none / poll / explicit (``--model-control-mode``, case-insensitive);
  none and poll load every model at start and ignore ``--load-model``;
  explicit loads the ``--load-model`` names (``*`` alone: every model; ``*``
  with other names is an error) together with the composing models of the
  ensembles among them;
* load and unload requests outside explicit mode: UNAVAILABLE "explicit model
  load / unload is not allowed if polling is enabled"; a model the repository
  doesn't have: INTERNAL "failed to load '<m>', failed to poll from model
  repository"; files without ``config``, or with a path that would leave the
  model directory, or a ``config`` that is not a model config in JSON: refused
  the same way (Triton logs why, e.g. "Load parameter 'config' must be
  specified for model file override" or "Invalid config override"; we append it);
* a load of a model that serves and whose directory hasn't changed does
  nothing (so a config override given earlier stays in force); a changed one is
  reloaded from its directory (dropping an earlier config override); a load
  with ``config`` always reloads with it; a load with files reloads from them,
  and the next plain load goes back to the repository;
* loading an ensemble polls its composing models with it: those not loaded
  (or changed) are loaded too, and loaded ensembles that use a reloaded model
  are reloaded after it (or unloaded when they no longer fit);
* a failed reload keeps the versions that serve;
* unloading a model also unloads the loaded ensembles that use it;
  ``unload_dependents`` also unloads the composing models that were loaded
  only as composing models (not requested themselves) and that nothing left
  loaded uses; an unknown or unloaded model unloads successfully (nothing to do);
* the index lists every model directory of the repository: loaded versions
  with their state and reason, unloaded versions as UNAVAILABLE "unloaded",
  never-loaded models by name only.

Deliberate differences:

* a config or model that fails to read or validate raises the repository's
  typed error (InvalidConfig naming model, file and field) where Triton answers
  "failed to poll from model repository" and keeps the detail for its log;
* a requested ensemble that no longer fits its steps raises and keeps what
  serves (Triton unloads it);
* a model whose load failed and that serves nothing is listed in the index as
  UNAVAILABLE with the reason, version "" (Triton lists a model rejected before
  any version was created by name only);
* change detection compares a fingerprint of (path, size, mtime) of every file
  (see ``fingerprint.py``) instead of "the newest mtime grew";
* poll retries a model whose load failed only once its directory changes again
  (Triton retries it every poll interval; for us each retry is a Ray deployment);
* with ``unload_dependents``, composing models are also released from the
  ensembles the unload takes down with it (Triton releases only those of the
  requested model and of what that cascades to);
* a load request for a model that serves unchanged as a composing model makes
  it an explicitly loaded one (Triton keeps the flag of an unchanged model).
"""

from __future__ import annotations

import enum
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from serve_app.config import ENSEMBLE_PLATFORM, config_from_json, parse_config
from serve_app.config.ensemble_deps import composing_models, ensemble_problems
from serve_app.config.pbtxt import config_error
from serve_app.errors import InternalError, InvalidArgument, InvalidConfig, ServeError, Unavailable, as_serve_error
from serve_app.keys import ModelKey
from serve_app.protos import model_config_pb2 as mc
from serve_app.repository.code_upload import code_in_load, refusal
from serve_app.repository.fingerprint import model_fingerprint
from serve_app.repository.repository import (
    CONFIG_OVERRIDE,
    ModelRepository,
    ModelSource,
    validate_model_name,
)
from serve_app.repository.staging import remove_staged, stage_files

if TYPE_CHECKING:
    from serve_app.repository.api import IndexEntry

WILDCARD = "*"
UNLOADED_REASON = "unloaded"
NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"
MISSING_CONFIG = "Load parameter 'config' must be specified for model file override"
# The fingerprint recorded for a model served from staged files: never equal to a directory's, so the
# next plain load goes back to the repository (Triton resets the timestamp for the same reason).
_STAGED = "staged"


class Demand(enum.Enum):
    """What a request for a model that may not be loaded needs (load on demand)."""

    SERVES = "serves"
    LOAD = "load"
    FAILED = "failed"
    UNKNOWN = "unknown"


class ControlMode(enum.Enum):
    """Triton's ``--model-control-mode``."""

    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


def parse_control_mode(text: str) -> ControlMode:
    """``none``, ``poll`` or ``explicit``, in any case, as Triton's command line takes them."""
    try:
        return ControlMode(text.strip().lower())
    except ValueError:
        raise InvalidArgument(
            f"invalid argument for --model-control-mode: '{text}' (expected none, poll or explicit)"
        ) from None


@dataclass(frozen=True)
class LoadPlan:
    """What a load request deploys.

    ``sources`` is in deploy order: composing models before the ensembles that
    use them.  It is empty when the requested model serves and nothing of it
    changed (Triton doesn't reload it).  ``unload``: loaded ensembles the load
    leaves unservable (a reloaded step no longer fits them), with why; Triton
    unloads them, so should the caller (and report :meth:`ModelControl.unloaded`).
    """

    sources: dict[str, ModelSource]
    unload: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PollChanges:
    """What a poll found since the models were last loaded (or failed to): load added and changed, unload removed.

    ``changed`` also holds the known ensembles that use an added, changed or
    removed model, which Triton re-evaluates with them.
    """

    added: list[str]
    removed: list[str]
    changed: list[str]


@dataclass(frozen=True)
class _Pending:
    """A load handed to the caller and not reported yet: the directory as it was before it was read."""

    fingerprint: str
    explicit: bool
    staged: Path | None = None


class ModelControl:
    """Decides what to load and unload under Triton's model control modes; remembers what serves."""

    def __init__(
        self,
        repository: ModelRepository,
        mode: ControlMode,
        startup_models: Sequence[str] = (),
        staging_root: Path | None = None,
        allow_code_upload: bool = False,
        on_demand: bool = False,
    ) -> None:
        wanted = set(startup_models)
        if mode is ControlMode.EXPLICIT and WILDCARD in wanted and len(wanted) > 1:
            raise InvalidArgument("Wildcard model name '*' must be the ONLY startup model if specified at all.")
        self._repo = repository
        self._mode = mode
        self._startup_models = sorted(wanted)
        self._staging_root = Path(staging_root).resolve() if staging_root is not None else None
        self._allow_code_upload = allow_code_upload
        self._on_demand = on_demand  # models load on their first request: the start and poll add none
        self._loaded: dict[str, ModelSource] = {}
        self._loaded_fp: dict[str, str] = {}  # the directory as it was when what serves was read
        self._seen_fp: dict[str, str] = {}  # ... when the last load (good or failed) was read: what poll compares
        self._pending: dict[str, _Pending] = {}
        self._explicit: set[str] = set()  # loaded because asked for, not only as an ensemble's step
        self._failed: dict[str, str] = {}  # not serving: why the last load failed
        self._failed_versions: dict[str, tuple[int, ...]] = {}  # the versions that load was for, when known
        self._unloaded: dict[str, list[int]] = {}  # not serving: the versions it served until unloaded

    @property
    def mode(self) -> ControlMode:
        return self._mode

    @property
    def repository(self) -> ModelRepository:
        return self._repo

    # -- start -------------------------------------------------------------------------------
    def startup(self) -> list[str]:
        """The models to load at start, composing models before the ensembles that use them.

        None and poll: every model (``--load-model`` is ignored, as in Triton).
        Explicit: the startup models and, transitively, the composing models of
        the ensembles among them (``*``: every model).  A startup model the
        repository doesn't have fails the start: Triton loads the others, then
        fails with "failed to load all models" and (by default) exits.
        """
        if self._on_demand and self._mode is ControlMode.POLL:
            return []
        if self._mode is not ControlMode.EXPLICIT or self._startup_models == [WILDCARD]:
            roots = self._repo.model_names()
            names = roots
        else:
            roots = self._startup_models
            missing = [n for n in roots if not self._repo.has_model(n)]
            if missing:
                detail = "; ".join(
                    f"failed to poll model '{n}': model not found in any model repository" for n in missing
                )
                raise InternalError(f"failed to load all models: {detail}")
            names = self._with_steps(roots)
        order = _deps_first(names, self._peek_steps)
        explicit = set(roots)
        for name in order:
            self._pending[name] = _Pending(self._fingerprint(name), explicit=name in explicit)
        return order

    # -- load ----------------------------------------------------------------------------------
    def prepare_load(
        self, name: str, config_json: str | None = None, files: Mapping[str, bytes] | None = None
    ) -> LoadPlan:
        """What loading (or reloading) ``name`` deploys; raises why it can't.

        ``config_json`` (the load API's ``config``) replaces config.pbtxt and is
        completed and validated like it; ``files`` (path relative to the model
        directory -> bytes) are written to a fresh staged directory the model is
        then read from, and need ``config_json``.  Either bringing code the
        server would run is refused unless ``allow_code_upload`` (see
        :mod:`~serve_app.repository.code_upload`).  Errors reading the model (or
        a composing model) are recorded as with :meth:`load_failed`.
        """
        self._require_explicit()
        validate_model_name(name)
        files = dict(files or {})
        if files and config_json is None:
            raise _poll_failed(name, MISSING_CONFIG)
        if not files and not self._repo.has_model(name):
            raise _poll_failed(name)
        override = _parse_override(name, config_json) if config_json is not None else None
        code = None if self._allow_code_upload else code_in_load(override, files)
        if code is not None:
            raise InvalidArgument(refusal(name, code))
        staged: Path | None = None
        if files:
            try:
                staged = stage_files(files, self._staging_dir(), name)
            except InvalidArgument as exc:
                raise _poll_failed(name, exc.message) from None
        planned: list[str] = []
        try:
            return self._plan_load(name, override, staged, planned)
        except ServeError as err:
            self.load_failed(name, err.message)
            for other in planned:
                if other != name:
                    self._pending.pop(other, None)
            raise

    # -- load on demand ---------------------------------------------------------------------------
    def demand(self, name: str) -> Demand:
        """What a request for ``name`` needs: it serves, it must load, its last load failed and the directory
        is unchanged since (that failure answers), or the repository has no such model."""
        if name in self._loaded:
            return Demand.SERVES
        if not self._repo.has_model(name):
            return Demand.UNKNOWN
        if name in self._failed and self._seen_fp.get(name) == self._fingerprint(name):
            return Demand.FAILED
        return Demand.LOAD

    def failure(self, name: str) -> str:
        """Why the last load of ``name`` failed ("" if it didn't)."""
        return self._failed.get(name, "")

    def prepare_demand(self, name: str) -> LoadPlan:
        """:meth:`prepare_load` of a plain load from the repository, in explicit or poll mode, that doesn't make
        ``name`` an operator's (explicitly loaded) model."""
        planned: list[str] = []
        try:
            return self._plan_load(name, None, None, planned, explicit=False)
        except ServeError as err:
            self.load_failed(name, err.message)
            for other in planned:
                if other != name:
                    self._pending.pop(other, None)
            raise

    def is_explicit(self, name: str) -> bool:
        """Loaded because the operator asked for it (not only as a step, not only on demand)."""
        return name in self._explicit

    def steps_of(self, name: str) -> list[str]:
        """The composing models of ``name`` (an ensemble), as it serves or as its directory says."""
        return self._peek_steps(name)

    def users(self) -> dict[str, list[str]]:
        """Each loaded model -> the loaded ensembles that use it."""
        out: dict[str, list[str]] = {}
        for other, source in sorted(self._loaded.items()):
            for step in _steps(source.config):
                out.setdefault(step, []).append(other)
        return out

    def _plan_load(
        self,
        name: str,
        override: mc.ModelConfig | None,
        staged: Path | None,
        planned: list[str],
        explicit: bool = True,
    ) -> LoadPlan:
        sources: dict[str, ModelSource] = {}
        configs: dict[str, mc.ModelConfig] = {}  # every model the load involves, as it will serve
        if override is None and staged is None:
            source = self._read_plain(name, explicit, planned)
        else:
            fingerprint = _STAGED if staged is not None else self._fingerprint(name)
            self._pending[name] = _Pending(fingerprint, explicit=True, staged=staged)
            planned.append(name)
            source = self._repo.load(name, config_override=override, directory=staged)
        if source is not None:
            sources[name] = source
        elif explicit:  # serves unchanged; asked for now, so not only a composing model any more
            self._explicit.add(name)
        configs[name] = (source or self._loaded[name]).config

        # An ensemble's composing models are polled with it (Triton's PollModels chain).
        queue = [(step, name) for step in _steps(configs[name])]
        while queue:
            step, via = queue.pop(0)
            if step in configs:
                continue
            if not self._repo.has_model(step):
                if step in self._loaded:  # served from staged files
                    configs[step] = self._loaded[step].config
                    continue
                raise _poll_failed(name, f"ensemble '{via}' contains models that are not available: {step}")
            try:
                step_source = self._read_plain(step, False, planned)
            except ServeError as err:
                self.load_failed(step, err.message)
                raise type(err)(
                    f"ensemble '{via}' depends on '{step}' which is not valid. "
                    f"Model '{step}' failed with error: {err.message}"
                ) from None
            if step_source is not None:
                sources[step] = step_source
            configs[step] = (step_source or self._loaded[step]).config
            queue += [(s, step) for s in _steps(configs[step])]

        # Loaded ensembles that use a reloaded model are reloaded after it (Triton re-checks its dependents).
        downstream: list[str] = []
        touched = set(sources)
        grew = True
        while grew:
            grew = False
            for other, loaded in self._loaded.items():
                if other not in touched and touched & set(_steps(loaded.config)):
                    downstream.append(other)
                    touched.add(other)
                    grew = True

        every = dict(self._loaded)
        every.update(sources)
        problems = ensemble_problems(
            {n: s.config for n, s in every.items()}, {n: set(s.versions) for n, s in every.items()}
        )
        if name in problems:
            directory = every[name].directory
            where = CONFIG_OVERRIDE if override is not None else str(directory / self._repo.config_file(directory))
            raise config_error(name, where, problems[name])
        unload: dict[str, str] = {}
        for other in downstream:
            if other in problems:
                unload[other] = problems[other]
            else:
                sources[other] = self._loaded[other]
                self._pending[other] = _Pending(self._loaded_fp.get(other, ""), explicit=other in self._explicit)
        order = _deps_first(sources, lambda n: _steps(sources[n].config))
        return LoadPlan({n: sources[n] for n in order}, unload)

    def _read_plain(self, name: str, explicit: bool, planned: list[str]) -> ModelSource | None:
        """``name`` read from its directory; None when it serves and the directory is unchanged (no reload)."""
        fingerprint = self._fingerprint(name)
        if name in self._loaded and self._loaded_fp.get(name) == fingerprint:
            return None
        self._pending[name] = _Pending(fingerprint, explicit=explicit or name in self._explicit)
        planned.append(name)
        try:
            return self._repo.load(name)
        except Exception as exc:
            raise as_serve_error(exc) from None

    # -- outcomes ------------------------------------------------------------------------------
    def loaded(self, name: str, source: ModelSource) -> None:
        """``source`` now serves as ``name`` (replacing what served before)."""
        pending = self._pending.pop(name, None)
        if pending is not None:
            fingerprint = pending.fingerprint
        elif self._is_staged(source.directory):
            fingerprint = _STAGED
        else:
            fingerprint = self._fingerprint(name)
        old = self._loaded.get(name)
        if old is not None and old.directory != source.directory and self._is_staged(old.directory):
            remove_staged(old.directory, self._staging_dir())
        self._loaded[name] = source
        self._loaded_fp[name] = fingerprint
        self._seen_fp[name] = fingerprint
        if (pending is not None and pending.explicit) or self._mode is not ControlMode.EXPLICIT:
            self._explicit.add(name)
        self._failed.pop(name, None)
        self._unloaded.pop(name, None)

    def load_failed(self, name: str, reason: str, versions: Iterable[int] = ()) -> None:
        """Loading ``name`` failed; if it served before, its old versions keep serving (as in Triton).
        ``versions``: those the load was for, when it got that far (the index lists each, as Triton's)."""
        pending = self._pending.pop(name, None)
        if pending is not None and pending.staged is not None:
            remove_staged(pending.staged, self._staging_dir())
        self._seen_fp[name] = pending.fingerprint if pending is not None else self._fingerprint(name)
        if name not in self._loaded:
            self._failed[name] = reason
            self._failed_versions[name] = tuple(sorted(versions))
            self._unloaded.pop(name, None)

    # -- unload --------------------------------------------------------------------------------
    def prepare_unload(self, name: str, unload_dependents: bool = False) -> list[str]:
        """The models to unload for a request to unload ``name``, users before what they use.

        The loaded ensembles that use ``name`` (directly or not) go with it, as
        Triton can no longer serve them.  With ``unload_dependents``, so do the
        composing models of everything unloaded here that were loaded only as
        composing models and that no model staying loaded uses.  A model that
        doesn't serve: nothing to do (success, as in Triton).
        """
        self._require_explicit()
        return self.unload_plan(name, unload_dependents)

    def unload_plan(self, name: str, unload_dependents: bool = False) -> list[str]:
        """:meth:`prepare_unload` in any mode (what evicting a model loaded on demand takes down with it)."""
        if name not in self._loaded:
            return []
        users: dict[str, set[str]] = {}
        for other, source in self._loaded.items():
            for step in _steps(source.config):
                users.setdefault(step, set()).add(other)
        going = {name}
        stack = [name]
        while stack:
            for user in users.get(stack.pop(), ()):
                if user not in going:
                    going.add(user)
                    stack.append(user)
        if unload_dependents:
            grew = True
            while grew:
                grew = False
                for model in list(going):
                    for step in _steps(self._loaded[model].config):
                        if (
                            step in self._loaded
                            and step not in going
                            and step not in self._explicit
                            and users.get(step, set()) <= going
                        ):
                            going.add(step)
                            grew = True
        return _deps_first(going, lambda n: sorted(users.get(n, set()) & going))  # users first

    def unloaded(self, name: str) -> None:
        """``name`` no longer serves; the index lists its versions as UNAVAILABLE "unloaded"."""
        source = self._loaded.pop(name, None)
        self._pending.pop(name, None)
        if source is not None and self._is_staged(source.directory):
            remove_staged(source.directory, self._staging_dir())
        self._loaded_fp.pop(name, None)
        self._seen_fp.pop(name, None)
        self._explicit.discard(name)
        self._failed.pop(name, None)
        self._unloaded[name] = sorted(source.versions) if source is not None else []

    # -- poll ------------------------------------------------------------------------------------
    def poll(self) -> PollChanges:
        """The model directories added, removed and changed since their last load (poll mode only).

        A model is compared with the directory as it was when its last load
        (good or failed) read it, so a model whose load failed is retried once
        it changes again.  The fingerprints taken here are what :meth:`loaded`
        and :meth:`load_failed` record, so a change made while a load runs is
        seen by the next poll.
        """
        if self._mode is not ControlMode.POLL:
            raise Unavailable("polling is disabled")
        names = self._repo.model_names()
        current = {n: model_fingerprint(self._repo.root / n) for n in names}
        added = [n for n in names if n not in self._seen_fp]
        removed = sorted(n for n in self._seen_fp if n not in current)
        changed = [n for n in names if n in self._seen_fp and current[n] != self._seen_fp[n]]
        touched = {*added, *removed, *changed}
        steps = {n: self._peek_steps(n) for n in names if n not in touched}
        grew = True
        while grew:
            grew = False
            for name, uses in steps.items():
                if name not in touched and touched & set(uses):
                    changed.append(name)
                    touched.add(name)
                    grew = True
        if self._on_demand:  # models load on their first request: only those that serve are reloaded
            added = []
            changed = [n for n in changed if n in self._loaded]
        for name in (*added, *changed):
            self._pending[name] = _Pending(current[name], explicit=True)
        return PollChanges(added=added, removed=removed, changed=sorted(changed))

    # -- what serves ---------------------------------------------------------------------------
    def index(self, ready_only: bool, states: Mapping[ModelKey, tuple[str, str]]) -> list[IndexEntry]:
        """Triton's repository index: every model directory, with its versions' states.

        ``states`` (a version's :class:`ModelKey` -> (state, reason)) is what the caller
        knows of versions now (LOADING, READY, UNLOADING...); a model it says
        nothing about is listed from what was reported: serving versions READY,
        a failed load UNAVAILABLE with its reason (version ""), unloaded versions
        UNAVAILABLE "unloaded", a model never loaded by name only.  As in
        Triton, models served only from staged files (no directory in the
        repository) are not listed.
        """
        from serve_app.repository.api import IndexEntry  # the service package is heavy to import

        by_model: dict[str, list[tuple[int | None, str, str]]] = {}
        version: int | None  # None in a row for a model without a version
        for key, (state, reason) in states.items():
            by_model.setdefault(key.name, []).append((key.version, state, reason))
        out: list[IndexEntry] = []
        for name in self._repo.model_names():
            rows = sorted(by_model.get(name, []), key=lambda row: (row[0] or 0, row[1], row[2]))
            if not rows:
                if name in self._loaded:
                    rows = [(v, "READY", "") for v in sorted(self._loaded[name].versions)]
                elif name in self._failed:
                    failed_versions = self._failed_versions.get(name, ())
                    reason = self._failed[name]
                    rows = [(v, "UNAVAILABLE", reason) for v in failed_versions] or [(None, "UNAVAILABLE", reason)]
                elif name in self._unloaded:
                    rows = [(v, "UNAVAILABLE", UNLOADED_REASON) for v in self._unloaded[name]]
                    rows = rows or [(None, "UNAVAILABLE", UNLOADED_REASON)]
                else:
                    rows = [(None, "", "")]
            for version, state, reason in rows:
                if ready_only and state != "READY":
                    continue
                out.append(IndexEntry(name, "" if version is None else str(version), state, reason))
        return out

    def loaded_names(self) -> list[str]:
        return sorted(self._loaded)

    def source(self, name: str) -> ModelSource | None:
        """What serves as ``name``, or None."""
        return self._loaded.get(name)

    # -- helpers ---------------------------------------------------------------------------------
    def _require_explicit(self) -> None:
        if self._mode is not ControlMode.EXPLICIT:
            raise Unavailable(NOT_EXPLICIT)

    def _fingerprint(self, name: str) -> str:
        return model_fingerprint(self._repo.root / name) if self._repo.has_model(name) else ""

    def _staging_dir(self) -> Path:
        if self._staging_root is None:
            self._staging_root = Path(tempfile.mkdtemp(prefix="serve_app-staging-")).resolve()
        return self._staging_root

    def _is_staged(self, directory: Path) -> bool:
        if self._staging_root is None:
            return False
        try:
            return directory.resolve().parent == self._staging_root
        except OSError:
            return False

    def _peek_steps(self, name: str) -> list[str]:
        """An ensemble's step models, from what serves or a quick parse of config.pbtxt ([] if unreadable)."""
        if name in self._loaded:
            return _steps(self._loaded[name].config)
        directory = self._repo.root / name
        path = directory / self._repo.config_file(directory)
        try:
            config = parse_config(path.read_text(encoding="utf-8"), model=name, path=str(path))
        except (OSError, UnicodeDecodeError, ServeError):
            return []
        return _steps(config)

    def _with_steps(self, roots: Iterable[str]) -> list[str]:
        """``roots`` and, transitively, their composing models that the repository has."""
        names: list[str] = []
        queue = list(roots)
        while queue:
            name = queue.pop(0)
            if name in names:
                continue
            names.append(name)
            queue += [s for s in self._peek_steps(name) if self._repo.has_model(s)]
        return names


def _steps(config: mc.ModelConfig) -> list[str]:
    return composing_models(config) if config.platform == ENSEMBLE_PLATFORM else []


def _poll_failed(name: str, detail: str = "") -> InternalError:
    """Triton's answer to a load it couldn't poll (HTTP 500), with what its log would say."""
    message = f"failed to load '{name}', failed to poll from model repository"
    return InternalError(f"{message}: {detail}" if detail else message)


def _parse_override(name: str, config_json: str) -> mc.ModelConfig:
    """The load API's ``config``: JSON Triton can't read fails its poll, as a repository it can't read does."""
    try:
        return config_from_json(config_json, model=name)
    except InvalidConfig as exc:
        raise _poll_failed(name, exc.message) from None


def _deps_first(names: Iterable[str], steps: Callable[[str], Sequence[str]]) -> list[str]:
    """``names`` (sorted) with each model after the models among them that it uses; cycles are cut."""
    wanted = set(names)
    order: list[str] = []
    visited: set[str] = set()

    def visit(name: str) -> None:
        visited.add(name)
        for step in steps(name):
            if step in wanted and step not in visited:
                visit(step)
        order.append(name)

    for name in sorted(wanted):
        if name not in visited:
            visit(name)
    return order
