"""The model manager: one Serve deployment (one replica) that owns the set of loaded models.

It decides with :class:`~serve_app.repository.model_control.ModelControl`
(Triton's control modes and repository API rules) and acts on Ray Serve:
each model version's instance groups run as Serve applications of their own
(``model_apps.py``), so loading or unloading one model never restarts
another.  Every change bumps a revision of :class:`ServingState`, which is
pushed to every gateway replica (and pulled by gateways that start later), so
all front ends serve the same set.

A load or reload deploys the new generation beside the old one, waits until
its instances are up, switches the gateways, waits for them to drain the old
one, then deletes it: requests under load keep succeeding throughout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from ray import serve

from serve_app.autoscale import AutoscalingSpec, autoscaling_spec, load_override_file
from serve_app.config.ensemble_deps import load_waves
from serve_app.errors import ServeError, as_serve_error
from serve_app.hosting import InstanceLoad
from serve_app.keys import ModelKey
from serve_app.observability.log_settings import LogSettings
from serve_app.observability.trace_settings import NewSetting
from serve_app.placement import ClusterGpus
from serve_app.placement.pools import pool_rollout, started_pools
from serve_app.rayserve.cluster import cpu_nodes, wait_for_gpus
from serve_app.rayserve.console import failed_line, loaded_line, models_logger, quiet_router, unloaded_line
from serve_app.rayserve.diagnostics import DiagnosticsOwner, Record
from serve_app.rayserve.model_apps import ModelApps, plan_model_apps, pool_options
from serve_app.rayserve.on_demand import OnDemand, unknown_model, usage_of
from serve_app.rayserve.pool_content import PoolContent
from serve_app.rayserve.sequence_router_deployment import SequenceModelSpec
from serve_app.rayserve.shutdown import StopsOnShutdown
from serve_app.repository import ModelRepository, ModelSource
from serve_app.repository.api import IndexEntry
from serve_app.repository.model_control import ControlMode, ModelControl, parse_control_mode
from serve_app.repository.residency import Usage
from serve_app.service.admission import admit
from serve_app.service.model_books import DeployResults, Generation, ModelBooks, Stale
from serve_app.service.serving_state import ServedVersion, ServingState
from serve_app.settings import ServerSettings
from serve_app.stats.on_demand import OnDemandStats

logger = logging.getLogger("ray.serve")
models_log = models_logger()  # one line per model as it loads, whatever Ray's and Serve's level

APP_POLL_S = 0.25
# Serve's status message for replicas waiting for resources (ray/serve/_private/deployment_state.py).
_UNSCHEDULED = re.compile(
    r"taken more than \d+s to be scheduled.*Resources required for each replica: (?P<required>\{.*?\}), "
    r"total resources available: (?P<available>\{.*?\})",
    re.DOTALL,
)
WATCH_TIMEOUT_S = 10.0  # a gateway long poll; Serve waits for it when the manager stops


class ModelManager(StopsOnShutdown):
    # Ray Serve awaits a deployment's async __init__ (mypy wants __init__ to return None, hence the ignore)
    async def __init__(  # type: ignore[misc]
        self, settings: ServerSettings, token: bytes, router: Any, gpus: ClusterGpus | None = None
    ) -> None:
        self.settings = settings
        quiet_router(settings)
        self._token = token
        self._router = router
        self._repo = ModelRepository(
            settings.model_repository, settings.model_config_name, complete=not settings.strict_model_config
        )
        self.mode = parse_control_mode(settings.model_control_mode)
        self.control = ModelControl(
            self._repo,
            self.mode,
            settings.load_model,
            allow_code_upload=settings.allow_model_code_upload,
            on_demand=settings.load_on_demand,
        )
        # Models load on their first request (and the least recently used make room): see on_demand.py.
        self._on_demand = OnDemand(self, settings, self._gateway_usage) if settings.load_on_demand else None
        self._demanding = False  # the models loading now were asked for by requests, not by the operator
        self._placing: dict[str, str] = {}  # the models loading now on demand -> the node they go to
        self._scaling_overrides: dict[str, dict[str, Any]] = (
            load_override_file(settings.autoscaling_file) if settings.autoscaling_file else {}
        )
        self._poller: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        # Revisions only grow, also across manager restarts (gateways ignore states older than theirs).
        self._revision = time.time_ns() // 1_000_000
        self._books = ModelBooks()  # what each model serves and on what, and why the others don't
        self._pools = PoolContent(settings)
        self._diagnostics = DiagnosticsOwner(settings)  # trace and log settings, for every gateway
        self._next_generation = time.time_ns() // 1_000_000  # unique across manager restarts
        self._gpus = gpus if gpus is not None else await asyncio.to_thread(wait_for_gpus, settings, logger.info)
        orphans = await asyncio.to_thread(self._own_apps)
        if orphans:  # a previous manager of this server died: its models load again, from the repository
            logger.warning("deleting %d model application(s) a previous model manager left", len(orphans))
            await asyncio.to_thread(_delete_apps, orphans)
        async with self._lock:
            await self._load_models(self._startup_sources())
        self._poller = (
            asyncio.get_running_loop().create_task(self._poll_forever()) if self.mode is ControlMode.POLL else None
        )
        if self._on_demand is not None:
            self._on_demand.start()

    @property
    def lock(self) -> asyncio.Lock:
        return self._lock

    # -- what gateways read ------------------------------------------------------------------
    async def state(self) -> ServingState:
        return self._snapshot()

    async def wait_state(self, revision: int, timeout_s: float = WATCH_TIMEOUT_S) -> ServingState:
        """The state once its revision passes ``revision`` (a long poll), or the current one after the timeout."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self._revision > revision), timeout_s)
            except asyncio.TimeoutError:
                pass
        return self._snapshot()

    async def sequence_models(self) -> tuple[int, tuple[SequenceModelSpec, ...]]:
        """For the sequence router (also when Serve restarts it): the loaded sequence models, and as of when."""
        return self._revision, self._books.sequence_models()

    async def hosting(self, pool: str) -> tuple[int, tuple[InstanceLoad, ...]]:
        """What every host of ``pool`` holds (as of a revision)."""
        return self._pools.content(pool)

    async def wait_hosting(self, pool: str, revision: int) -> tuple[int, tuple[InstanceLoad, ...]]:
        """A host's long poll: ``pool``'s content once it changes after ``revision`` (or after a while)."""
        return await self._pools.wait(pool, revision, WATCH_TIMEOUT_S)

    async def hosting_taken(self, pool: str, statuses: dict[str, str]) -> int:
        """A host that took its pool's content as it started (a gateway) says how each group loaded (group id
        -> its error, "" when loaded): failures as :meth:`hosting_failed`; the models it was the first to
        load get their line.  Returns the new revision of the serving state."""
        self._pools.awaiting -= set(statuses)
        failures = {group: error for group, error in statuses.items() if error}
        revision = await self.hosting_failed(pool, failures) if failures else self._revision
        loaded = set(statuses) - set(failures)
        books = self._books
        for name, groups in list(books.unannounced.items()):
            if groups & loaded:
                del books.unannounced[name]
                if name in books.served:
                    models_log.info(loaded_line(name, _versions(books.served[name])))
        return revision

    async def hosting_failed(self, pool: str, failures: dict[str, str]) -> int:
        """A host that took its pool's content as it started (a gateway) could not load some groups (group id ->
        why): their models fail, as a failed load does.  Returns the new revision of the serving state."""
        async with self._lock:
            models = self._pools.models_of(pool, set(failures))
            reasons = {name: failures[gid] for gid, name in models.items() if name in self._books.served}
            for name, reason in reasons.items():
                self._books.unannounced.pop(name, None)
                models_log.error(failed_line(name, reason))
            if reasons:
                await self._remove(sorted(reasons), "", failures=reasons)
            return self._revision

    async def index(self, ready_only: bool = False) -> list[IndexEntry]:
        return self.control.index(ready_only, self._books.states())

    # -- trace and log settings (see rayserve/diagnostics.py) ----------------------------------
    async def diagnostics(self) -> Record:
        return self._diagnostics.record()

    async def update_trace(self, model: str, new: NewSetting) -> None:
        await self._diagnostics.update_trace(model, new)

    async def update_logs(self, settings: LogSettings) -> None:
        await self._diagnostics.update_logs(settings)

    # -- the repository API --------------------------------------------------------------------
    async def load(self, name: str, config_json: str | None = None, files: Mapping[str, bytes] | None = None) -> None:
        """Load (or reload) ``name``; returns once it serves, or raises why it doesn't."""
        async with self._lock:
            plan = self.control.prepare_load(name, config_json, dict(files or {}))
            if self._on_demand is not None and self.control.is_explicit(name):
                self._on_demand.residency.pin(name)  # the operator's model now: never evicted; deployed everywhere
            failures = await self._load_models(dict(plan.sources)) if plan.sources else {}
            if plan.unload:  # ensembles the reload left without the steps they need
                await self._remove(list(plan.unload), reason="unloaded")
            if self._on_demand is not None and self.control.is_explicit(name):
                self._on_demand.residency.pin(name)
        if name in failures:
            raise _load_error(name, failures[name])

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        async with self._lock:
            names = self.control.prepare_unload(name, unload_dependents)
            await self._remove(names, reason="unloaded")

    # -- load on demand (see on_demand.py) ---------------------------------------------------------
    async def demand(self, name: str) -> None:
        """A request for ``name``, which a gateway doesn't serve: returns once it serves, or raises why not."""
        if self._on_demand is None:
            raise unknown_model(name)
        await self._on_demand.demand(name)

    async def demand_load(
        self, names: list[str], nodes: Mapping[str, str] | None = None
    ) -> tuple[dict[str, str], list[str]]:
        """Load ``names`` (and their steps) for the requests waiting for them, each on its node in ``nodes``
        (absent: on every node); returns the models that failed (and why) and those that loaded.  The caller
        holds the lock."""
        sources: dict[str, ModelSource] = {}
        failures: dict[str, str] = {}
        placing: dict[str, str] = {}
        for name in names:
            try:
                plan = self.control.prepare_demand(name)
            except Exception as exc:
                failures[name] = as_serve_error(exc).message
                models_log.error(failed_line(name, failures[name]))
                self._books.load_failed(name, failures[name])
                continue
            sources.update(plan.sources)
            if nodes and name in nodes:
                placing.update(dict.fromkeys(plan.sources, nodes[name]))  # its steps go with it
        self._demanding = True
        self._placing = placing
        try:
            failures.update(await self._load_models(sources) if sources else {})
        finally:
            self._demanding = False
            self._placing = {}
        if failures:  # the gateways learn why (a request after the wait resolves it there)
            await self._publish([])
        return failures, [n for n in sources if n not in failures]

    async def evict(self, names: list[str]) -> None:
        """Unload ``names`` (and what can't serve without them) to make room; the caller holds the lock."""
        going: list[str] = []
        for name in names:
            going += [n for n in self.control.unload_plan(name) if n not in going]
        if going:
            await self._remove(going, reason="unloaded")

    async def on_demand_stats(self) -> OnDemandStats:
        return self._on_demand.stats if self._on_demand is not None else OnDemandStats()

    async def host_nodes(self) -> list[str]:
        """The nodes a model loaded on demand can go to, each with a budget of its own: those of the hosts of
        the CPU instances (none when they are not known)."""
        if self.settings.cpu_instances_in_gateway:
            nodes = await self._pools.nodes_of("gateway", self.settings.app_name)
        elif "cpu" in self._pools.deployed:
            pool = self._pools.deployed["cpu"]
            nodes = await self._pools.nodes_of(pool.deployment, self._pools.app_name(pool))
        else:  # no CPU host runs yet: they will, one on each node with CPUs
            nodes = await asyncio.to_thread(cpu_nodes)
        return nodes

    async def _gateway_usage(self) -> dict[str, Usage]:
        try:
            handle = serve.get_deployment_handle("gateway", self.settings.app_name)
            answers = await handle.broadcast("usage").results_async(return_exceptions=True)
        except Exception as exc:
            answers = [exc]
        return usage_of(answers)

    # -- deploying -------------------------------------------------------------------------------
    def _startup_sources(self) -> dict[str, ModelSource]:
        sources: dict[str, ModelSource] = {}
        for name in self.control.startup():
            try:
                sources[name] = self._repo.load(name)
            except Exception as exc:
                err = as_serve_error(exc)
                models_log.error(failed_line(name, err.message))
                self._books.failed[name] = err.message
                self.control.load_failed(name, err.message)
        return sources

    async def _load_models(self, sources: dict[str, ModelSource]) -> dict[str, str]:
        """Deploy ``sources`` in waves of at most ``model_load_thread_count`` models, each ensemble no earlier
        than its steps; a model that fails is deployed again up to ``model_load_retry_count`` times.  Returns
        the models that failed in the end, and why."""
        retries = self.settings.model_load_retry_count
        failures: dict[str, str] = {}
        configs = {name: source.config for name, source in sources.items()}
        for wave in load_waves(configs, self.settings.model_load_thread_count):
            pending = {name: sources[name] for name in wave}
            for attempt in range(retries + 1):
                last = attempt == retries
                failed = await self._deploy(pending, final=last)
                if last or not failed:
                    failures.update(failed)
                    break
                for name, reason in sorted(failed.items()):
                    again = f"{attempt + 1} of {retries}"
                    logger.warning("model '%s' failed to load (%s); trying again (%s)", name, reason, again)
                pending = {name: source for name, source in pending.items() if name in failed}
        return failures

    async def _deploy(self, sources: dict[str, ModelSource], *, final: bool = True) -> dict[str, str]:
        """Deploy a new generation of each model in ``sources``; publish those that came up.
        Returns the models that failed, and why (a failed reload keeps the old generation serving).
        ``final``: the failures are the models' outcome (otherwise they are tried again: only their
        instances are cleaned up)."""
        requested = sources
        sources, scaling, failures = self._checked(sources)
        generations = {}
        for name in sources:
            self._next_generation += 1
            generations[name] = self._next_generation
        plan = plan_model_apps(
            sources,
            generations,
            self.settings,
            self._gpus,
            self._token,
            scaling,
            self._pools.app_name,
            self._on_one_node(sources),
        )
        for message in plan.messages:
            logger.info(message)
        failures.update(plan.failed)
        apps = dict(plan.apps)
        rollout = pool_rollout(plan.pools, self._pools.deployed)
        for pool in rollout.adopt:
            self._pools.deployed[pool.name] = pool
        for pool in rollout.start:
            manager = serve.get_deployment_handle("model_manager", self.settings.app_name)
            options = pool_options(pool, self.settings)
            apps[self._pools.app_name(pool)] = self._pools.bound(pool, self._token, manager, options)
        app_errors = await asyncio.to_thread(self._run_apps, apps) if apps else {}
        up, failed_pools = started_pools(rollout.start, {a for a, e in app_errors.items() if e}, self._pools.app_name)
        for pool in up:
            self._pools.deployed[pool.name] = pool
        group_errors = await self._pools.add(plan.hosted, self.settings.load_timeout_s) if plan.hosted else {}
        results = DeployResults(app_errors, group_errors, await self._instance_states(plan))
        new = plan.generations()
        configs = {name: source.config for name, source in requested.items()}
        books = self._books
        kept = books.failures(configs, new, plan.group_models(), results, failures, self.settings.keep_failed_instances)
        stale = Stale(list(failed_pools))
        for name, source in requested.items():
            generation = new.get(name, Generation())
            if name in failures:
                stale.add(generation.apps, generation.groups)
                if not final:
                    continue
                models_log.error(failed_line(name, failures[name]))
                self.control.load_failed(name, failures[name], source.versions)
                books.load_failed(name, failures[name])
                continue
            books.serve(name, generation, kept, stale)
            awaiting = generation.groups & self._pools.awaiting
            if awaiting:  # loaded once a starting gateway says so (hosting_taken)
                books.unannounced[name] = awaiting
            else:
                books.unannounced.pop(name, None)
                models_log.info(loaded_line(name, _versions(books.served[name])))
            self.control.loaded(name, source)
            if self._on_demand is not None:
                where = [plan.on_node[name]] if name in plan.on_node else None
                self._on_demand.residency.loaded(name, pinned=not self._demanding, nodes=where)
        await self._publish(stale.apps, stale.groups)
        return failures

    def _on_one_node(self, sources: Mapping[str, ModelSource]) -> dict[str, str]:
        """The models of ``sources`` that go to one node: those loading on demand now, and those it placed
        before (a reload keeps its node)."""
        out = {name: self._placing[name] for name in sources if name in self._placing}
        if self._on_demand is not None:
            for name in sources:
                node = self._on_demand.residency.kept_on(name)
                if name not in out and node is not None:
                    out[name] = node
        return out

    def _checked(
        self, sources: dict[str, ModelSource]
    ) -> tuple[dict[str, ModelSource], dict[str, Any], dict[str, str]]:
        """Drop (and record) models whose ensemble steps, resource needs or autoscaling settings can't be
        served (``service/admission.py``)."""
        loaded = {n: s for n, s in ((n, self.control.source(n)) for n in self.control.loaded_names()) if s}
        out = admit(sources, loaded, self.settings.rate_limit_resources(), self._autoscaling)
        return out.admitted, out.scaling, out.failures

    def _autoscaling(self, name: str, source: ModelSource) -> AutoscalingSpec | None:
        return autoscaling_spec(
            source.config,
            self._scaling_overrides.get(name),
            path=str(source.directory / self._repo.config_file(source.directory)),
            override_path=self.settings.autoscaling_file or "autoscaling override",
        )

    def _run_apps(self, apps: dict[str, Any]) -> dict[str, str]:
        """Start the applications and wait until each runs; returns why those that didn't, didn't."""
        from ray.serve import RunTarget

        serve.run_many(
            [RunTarget(target=bound, name=name, route_prefix=None) for name, bound in apps.items()],
            wait_for_ingress_deployment_creation=False,
            wait_for_applications_running=False,
        )
        start = time.monotonic()
        deadline = start + self.settings.load_timeout_s
        errors: dict[str, str] = {}
        waiting = set(apps)
        reported = 0
        while waiting:
            overview = serve.status().applications
            for name in list(waiting):
                app = overview.get(name)
                status = str(getattr(app, "status", "")) if app is not None else ""
                if status.endswith("RUNNING"):
                    waiting.discard(name)
                elif status.endswith(("DEPLOY_FAILED", "UNHEALTHY")):
                    errors[name] = f"its instances failed to start: {app.message}" if app else "failed to start"
                    waiting.discard(name)
                elif app is not None and time.monotonic() - start > self.settings.placement_timeout_s:
                    unplaced = _unplaced(app)
                    if unplaced:  # Ray can't place them: fail now, with what they ask and what the cluster has
                        errors[name] = unplaced
                        waiting.discard(name)
            done = len(apps) - len(waiting)
            if len(apps) > 1 and done != reported and (done == len(apps) or done - reported >= max(1, len(apps) // 10)):
                logger.info("%d/%d model deployments running (%.0f s)", done, len(apps), time.monotonic() - start)
                reported = done
            if waiting and time.monotonic() > deadline:
                for name in waiting:
                    errors[name] = f"its instances did not start within {self.settings.load_timeout_s:g}s"
                break
            if waiting:
                time.sleep(APP_POLL_S)
        return errors

    async def _instance_states(self, plan: ModelApps) -> dict[ModelKey, str]:
        """Why a version's dedicated instances failed to load their model (its load error), keyed by version
        (shared hosts report theirs as they take their content)."""
        out: dict[ModelKey, str] = {}
        for sv in plan.served:
            reasons = []
            for ref in sv.deployments:
                if ref.hosted:
                    continue
                try:
                    handle = serve.get_deployment_handle(ref.name, ref.app)
                    answers = await handle.broadcast("status").results_async(return_exceptions=True)
                except Exception as exc:
                    answers = [exc]
                for answer in answers:
                    if isinstance(answer, BaseException):
                        reasons.append(as_serve_error(answer).message)
                    elif not answer[0]:
                        reasons.append(answer[1])
            if reasons:
                out[sv.key.version_key] = reasons[0]
        return out

    async def _remove(self, names: list[str], reason: str, failures: dict[str, str] | None = None) -> None:
        """Stop serving ``names`` (unloaded with ``reason``, or failed: ``failures`` gives why)."""
        stale = Stale()
        for name in names:
            if failures and name in failures:  # it never really served: listed as failed to load, with why
                self._books.remove(name, failures[name], stale)
                self.control.unloaded(name)
                self.control.load_failed(name, failures[name])
            else:
                served = self._books.remove(name, reason, stale)
                self.control.unloaded(name)
                if self._on_demand is not None:
                    self._on_demand.residency.unloaded(name)
                if served:
                    models_log.info(unloaded_line(name))
        await self._publish(stale.apps, stale.groups, unloading=True)

    async def _publish(self, stale: list[str], stale_groups: set[str] | None = None, unloading: bool = False) -> None:
        """New revision: the router first (so STARTs find new models), then every gateway (each returns
        once it drained what it no longer serves), then the applications nobody uses are deleted."""
        self._revision += 1
        async with self._changed:
            self._changed.notify_all()
        revision, specs = await self.sequence_models()
        await self._router.set_models.remote(specs, revision)
        await self._push_to_gateways()
        if stale:
            await _prepare_unload(stale)
            await asyncio.to_thread(_delete_apps, stale)
        if stale_groups:  # the hosts stop them (not waiting for live sequences) and free their memory
            await self._pools.remove(stale_groups, self.settings.load_timeout_s)

    async def _push_to_gateways(self) -> None:

        try:
            handle = serve.get_deployment_handle("gateway", self.settings.app_name)
            answers = await handle.broadcast("apply_state", self._snapshot()).results_async(return_exceptions=True)
        except Exception as exc:  # no gateway yet (startup): they pull the state when they start
            answers = [exc]
        for answer in answers:
            if isinstance(answer, BaseException):
                logger.info("a gateway did not take revision %d now (it pulls it later): %s", self._revision, answer)

    def _snapshot(self) -> ServingState:
        return self._books.snapshot(self._revision)

    # -- poll mode --------------------------------------------------------------------------------
    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.repository_poll_secs)
            try:
                await self.poll_now()
            except Exception:
                logger.exception("polling the model repository failed")

    async def poll_now(self) -> None:
        """Load added and changed models, unload removed ones (poll mode)."""
        async with self._lock:
            changes = await asyncio.to_thread(self.control.poll)
            sources: dict[str, ModelSource] = {}
            for name in [*changes.added, *changes.changed]:
                try:
                    sources[name] = await asyncio.to_thread(self._repo.load, name)
                except Exception as exc:
                    message = as_serve_error(exc).message
                    models_log.error(failed_line(name, message))
                    self.control.load_failed(name, message)
                    self._books.load_failed(name, message)
            if sources:
                await self._load_models(sources)
            if changes.removed:
                await self._remove(list(changes.removed), reason="unloaded")

    # -- housekeeping -----------------------------------------------------------------------------
    def _own_apps(self) -> list[str]:

        prefix = f"{self.settings.app_name}--"
        return [name for name in serve.status().applications if name.startswith(prefix)]

    async def check_health(self) -> None:
        if self._poller is not None and self._poller.done():
            raise RuntimeError("the repository poller stopped")
        if self._on_demand is not None and not self._on_demand.running:
            raise RuntimeError("the load-on-demand loop stopped")

    async def stop_once(self) -> None:
        """The server's application is going away: so do its models' applications."""
        if self._poller is not None:
            self._poller.cancel()
        if self._on_demand is not None:
            self._on_demand.stop()
        apps = [a for names in self._books.apps.values() for a in names]
        apps += [self._pools.app_name(pool) for pool in self._pools.deployed.values()]
        if apps:
            try:
                await asyncio.to_thread(_delete_apps, apps, False)
            except Exception:
                logger.exception("deleting the model applications failed")


def _unplaced(app: Any) -> str:
    """Why Ray has not placed an application's replicas, from Serve's own account (its deployments' status
    messages name what each replica asks and what the cluster has available); "" when none is waiting for
    resources (it may just be slow to start).  Serve says "not scheduled" of a replica whose worker process
    is still starting too (a busy machine): one whose ask the cluster has available is waited for."""
    for deployment in getattr(app, "deployments", {}).values():
        message = str(getattr(deployment, "message", ""))
        match = _UNSCHEDULED.search(message)
        if match and not _fits(match["required"], match["available"]):
            return (
                f"Ray could not place its instances: each asks for {match['required']}, and the cluster has "
                f"{match['available']} available (more nodes, or smaller instance_group / --instance-cpus asks, "
                "would let it load)"
            )
    return ""


def _fits(required: str, available: str) -> bool:
    """Whether the cluster has each resource of a replica's ask (Serve's JSON objects); False when unreadable."""
    try:
        ask, free = json.loads(required), json.loads(available)
        return all(float(free.get(k, 0.0)) >= float(v) for k, v in ask.items())
    except (ValueError, TypeError, AttributeError):
        return False


def _versions(served: list[ServedVersion]) -> list[tuple[int, str, str]]:
    return [(v.version, v.state, v.reason) for v in served]


def _load_error(name: str, reason: str) -> ServeError:
    from serve_app.errors import InvalidArgument

    return InvalidArgument(f"load failed for model '{name}': {reason}")


async def _prepare_unload(apps: list[str]) -> None:
    """Tell the instances they are being unloaded: they stop without waiting for live sequences."""

    for app in apps:
        try:
            handle = serve.get_app_handle(app)
            await handle.broadcast("prepare_unload").results_async(return_exceptions=True)
        except Exception:
            pass


def _delete_apps(apps: list[str], blocking: bool = True) -> None:
    from ray.serve.context import _get_global_client

    _get_global_client().delete_apps(list(apps), blocking=blocking)
