"""A model repository served in this process, without Ray.

The same repository loading, validation, service and schedulers as the Ray
gateway, and the same in-process host as the Ray replicas
(:class:`~serve_app.hosting.InstanceHost`), holding one instance of each
model version: what tests, the fuzzer and ``python -m serve_app --local``
run.  Models load as the model manager loads them: one that fails is listed
UNAVAILABLE with its reason and does not stop the others; ensembles whose
steps can't be served fail; every instance runs its warmup samples, which
count in the statistics.
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any

from serve_app.errors import ServeError, as_serve_error
from serve_app.hosting import InProcessExecutor, InstanceHost, InstanceLoad
from serve_app.keys import ModelKey
from serve_app.local.devices import local_device
from serve_app.placement import InstanceSpec
from serve_app.protos import model_config_pb2 as mc
from serve_app.repository import ModelRepository
from serve_app.runtime import ModelInstance
from serve_app.sequence.router import SequenceRouter
from serve_app.service import FailedModel, InferenceService, ModelRegistry, ServedModel
from serve_app.service.admission import admit
from serve_app.service.registry import ensemble_readiness
from serve_app.service.server_link import ServiceLink

logger = logging.getLogger("serve_app")


class LocalService:
    """The service over a repository's models, and the host that holds their instances (close it when done)."""

    def __init__(self, service: InferenceService, executor: InProcessExecutor) -> None:
        self.service = service
        self.executor = executor

    @property
    def host(self) -> InstanceHost:
        return self.executor.host

    @property
    def instances(self) -> dict[ModelKey, ModelInstance]:
        """(model, version) -> its one loaded instance, e.g. to patch a backend in tests."""
        return {i.key.version_key: i.instance for i in self.host.instances() if i.instance is not None}

    @classmethod
    def from_repository(
        cls,
        repo_dir: str | pathlib.Path,
        *,
        complete_config: bool = True,
        model_config_name: str = "",
        **service_options: Any,
    ) -> LocalService:
        """Load every model of ``repo_dir`` (``complete_config``: as :class:`ModelRepository` says;
        ``model_config_name``: Triton's --model-config-name);
        ``service_options`` go to :class:`InferenceService`."""
        registry = ModelRegistry()
        link = ServiceLink()  # what Python models' BLS calls reach (the service, once it exists)
        router = SequenceRouter()
        host = InstanceHost("local", None, link, on_release=router.released)  # sees every GPU, as Triton does
        sources = {}
        for name, source in ModelRepository(repo_dir, model_config_name, complete=complete_config).load_all().items():
            if isinstance(source, ServeError):
                registry.add_failed(FailedModel(name, source.message))
            else:
                sources[name] = source
        admission = admit(sources, {}, service_options.get("rate_limits"))
        warmups: list[tuple[ServedModel, list[tuple[int, int, int, int]]]] = []
        for name, source in sources.items():
            if name in admission.failures:
                logger.warning("model '%s': failed to load: %s", name, admission.failures[name])
                registry.add_failed(FailedModel(name, admission.failures[name]))
                continue
            loads: list[InstanceLoad] = []
            try:
                models = []
                for version, model_file in source.versions.items():
                    model = ServedModel.create(name, version, source.config, labels=source.labels)
                    if not model.is_ensemble:
                        load = _instance_load(ModelKey(name, version), source.config, model_file)
                        loads.append(load)
                        error = host.add_blocking(load)
                        if error:
                            raise ServeError(error)
                        warmups.extend((model, i.warmup_figures) for i in host.of(load.key))
                    models.append(model)
            except Exception as exc:
                reason = as_serve_error(exc).message
                logger.warning("model '%s': failed to load: %s", name, reason)
                for load in loads:
                    host.discard(load)
                warmups = [(m, f) for m, f in warmups if m.name != name]
                registry.add_failed(FailedModel(name, reason))
                continue
            for model in models:
                registry.add(model)
        ensemble_readiness(registry)
        executor = InProcessExecutor(host, router, link)
        service = link.service = InferenceService(registry, executor, **service_options)
        service.prepare(registry.all_models())
        for model, figures in warmups:
            if figures:
                service.record_warmup(model, figures)
        return cls(service, executor)

    def close(self) -> None:
        self.service.shared_memory.close(forget=True)
        for instance in self.host.instances():
            instance.close()


def _instance_load(key: ModelKey, config: mc.ModelConfig, model_file: pathlib.Path) -> InstanceLoad:
    """One instance of the version, on its first instance group's device (``local/devices.py``)."""
    device = local_device(config)
    spec = InstanceSpec(f"{key.name}_0", device.gpu_ids[0] if device.gpu_ids else None, device.group_index)
    return InstanceLoad(key, config.SerializeToString(), str(model_file), device.kind, spec)
