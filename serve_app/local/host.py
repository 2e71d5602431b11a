"""A model repository served in this process, without Ray.

The same repository loading, validation, service and schedulers as the Ray
gateway, with every model instance in this process
(:class:`~serve_app.local.executor.LocalModelExecutor`): what tests, the
fuzzer and ``python -m serve_app --local`` run.  Models load as the model
manager loads them: one that fails is listed UNAVAILABLE with its reason and
does not stop the others; ensembles whose steps can't be served fail; every
instance runs its warmup samples, which count in the statistics.
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any

from serve_app.backends import BackendContext
from serve_app.config.ensemble_deps import ensemble_problems
from serve_app.errors import ServeError, as_serve_error
from serve_app.keys import ModelKey
from serve_app.local.devices import local_device
from serve_app.local.executor import LocalModelExecutor
from serve_app.repository import ModelRepository
from serve_app.runtime import ModelInstance
from serve_app.scheduling.rate_limiter import Needs, check_resources
from serve_app.service import FailedModel, InferenceService, ModelRegistry, ServedModel
from serve_app.service.registry import ensemble_readiness
from serve_app.service.server_link import ServiceLink

logger = logging.getLogger("serve_app")


class LocalHost:
    """The service over a repository's models, and what it holds (close it when done)."""

    def __init__(
        self, service: InferenceService, executor: LocalModelExecutor, instances: dict[ModelKey, ModelInstance]
    ) -> None:
        self.service = service
        self.executor = executor
        self.instances = instances  # its one instance per version (generation 0), e.g. to patch a backend in tests

    @classmethod
    def from_repository(
        cls,
        repo_dir: str | pathlib.Path,
        *,
        complete_config: bool = True,
        model_config_name: str = "",
        **service_options: Any,
    ) -> LocalHost:
        """Load every model of ``repo_dir`` (``complete_config``: as :class:`ModelRepository` says;
        ``model_config_name``: Triton's --model-config-name);
        ``service_options`` go to :class:`InferenceService`."""
        registry = ModelRegistry()
        link = ServiceLink()  # what Python models' BLS calls reach (the service, once it exists)
        instances: dict[ModelKey, ModelInstance] = {}
        sources = {}
        for name, source in ModelRepository(repo_dir, model_config_name, complete=complete_config).load_all().items():
            if isinstance(source, ServeError):
                registry.add_failed(FailedModel(name, source.message))
            else:
                sources[name] = source
        problems = ensemble_problems(
            {n: s.config for n, s in sources.items()}, {n: set(s.versions) for n, s in sources.items()}
        )
        warmups: list[tuple[ServedModel, list[tuple[int, int, int, int]]]] = []
        limits = service_options.get("rate_limits")
        for name, source in sources.items():
            if name in problems:
                registry.add_failed(FailedModel(name, problems[name]))
                continue
            try:
                if limits is not None:
                    check_resources(name, Needs.from_config(source.config), limits)
                models = []
                for version, model_file in source.versions.items():
                    model = ServedModel.create(name, version, source.config, labels=source.labels)
                    if not model.is_ensemble:
                        device = local_device(source.config)
                        ctx = BackendContext(
                            model_name=name,
                            version=version,
                            config=source.config,
                            model_file=model_file,
                            device_kind=device.kind,
                            gpu_ids=device.gpu_ids,
                            instance_group=device.group_index,
                            instance_name=f"{name}_0_0",
                            server_link=link,
                        )
                        instance = instances[ModelKey(name, version)] = ModelInstance(ctx)
                        warmups.append((model, instance.warm_up().figures()))
                    models.append(model)
            except Exception as exc:
                reason = as_serve_error(exc).message
                logger.warning("model '%s': failed to load: %s", name, reason)
                for version in source.versions:
                    failed = instances.pop(ModelKey(name, version), None)
                    if failed is not None:
                        failed.close()
                warmups = [(m, f) for m, f in warmups if m.name != name]
                registry.add_failed(FailedModel(name, reason))
                continue
            for model in models:
                registry.add(model)
        ensemble_readiness(registry)
        executor = LocalModelExecutor(instances, link)
        service = link.service = InferenceService(registry, executor, **service_options)
        for model, figures in warmups:
            if figures:
                service.record_warmup(model, figures)
        return cls(service, executor, instances)

    def close(self) -> None:
        self.service.shared_memory.close(forget=True)
        self.executor.close()
        for instance in self.instances.values():
            instance.close()
