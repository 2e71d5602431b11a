"""Offline checks of the KubeRay manifests in deploy/k8s (no cluster, no network).

Every YAML document is validated against the JSON Schema of its kind from the shared offline
schema folder (``../shared/k8s-schemas`` beside the repository: KubeRay v1.7.0 CRDs, Kubernetes
1.36 core kinds, prometheus-operator, and Ray 2.60's Serve config).  The embedded Serve config is
validated with Ray's own ``ServeDeploySchema``, checked against configs/serve_app.yaml (it is
generated from it by scripts/gen_k8s.py) and against ``ServerSettings``, and the design rules of
the manifests (where the gateway runs, which pods the Services and probes reach) are asserted.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from scripts import gen_k8s
from serve_app.settings import ServerSettings
from tests.support.paths import ROOT

K8S_DIR = ROOT / "deploy" / "k8s"
SCHEMA_DIR = ROOT / "tests" / "data" / "k8s-schemas"
MANIFESTS = sorted(K8S_DIR.glob("*.yaml"))

TRITON_PORTS = {"serve": "http_port", "serve-grpc": "grpc_port", "serve-metrics": "metrics_port"}
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _ray_pin() -> str:
    """The ray[serve] version pinned in pyproject.toml (no tomllib: Python 3.10 is supported)."""
    (version,) = re.findall(r'"ray\[serve\]==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    return version


RAY_VERSION = _ray_pin()


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in MANIFESTS:
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                docs.append((f"{path.name}#{i}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}", doc))
    return docs


DOCS = _documents()
RAYSERVICES = [(label, doc) for label, doc in DOCS if doc.get("kind") == "RayService"]
RAYSERVICE_IDS = [label.split("#")[0] for label, _ in RAYSERVICES]


def _docs_of(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in DOCS if doc.get("kind") == kind]


# ----------------------------------------------------------------------------- validation helpers
@pytest.fixture(scope="module")
def schema_dir() -> Path:
    if not SCHEMA_DIR.is_dir():
        pytest.skip(f"offline Kubernetes schemas not found at {SCHEMA_DIR} (CI keeps shared/ beside the clone)")
    return SCHEMA_DIR


def schema_file_name(api_version: str, kind: str) -> str:
    """``ray.io/v1 RayService`` -> ``rayservice.ray.io_v1.json``, ``v1 Service`` -> ``service_v1.json``."""
    group, _, version = api_version.rpartition("/")
    return f"{kind.lower()}{'.' + group if group else ''}_{version}.json"


@cache
def _validator(path: Path) -> jsonschema.protocols.Validator:
    schema = json.loads(path.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _message(error: jsonschema.ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return f"{path or '.'}: {error.message}"


def schema_errors(instance: Any, schema: Path) -> list[str]:
    """Every violation as ``.json.path: message``, in document order."""
    found = _validator(schema).iter_errors(instance)
    return [_message(e) for e in sorted(found, key=lambda e: [str(p) for p in e.absolute_path])]


def manifest_errors(doc: dict[str, Any], schemas: Path) -> list[str]:
    schema = schemas / schema_file_name(doc["apiVersion"], doc["kind"])
    if not schema.exists():
        return [f"no schema {schema.name} for {doc['apiVersion']} {doc['kind']} in {schemas}"]
    return schema_errors(doc, schema)


def serve_config_errors(config: Any) -> list[str]:
    """Ray Serve's own validation (pydantic), which is what Ray applies to serveConfigV2."""
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    try:
        ServeDeploySchema.model_validate(config)
    except ValidationError as exc:
        return [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return []


# ----------------------------------------------------------------------------- RayService accessors
def cluster(rs: dict[str, Any]) -> dict[str, Any]:
    return rs["spec"]["rayClusterConfig"]


def groups(rs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``head`` and each worker group by name."""
    out = {"head": cluster(rs)["headGroupSpec"]}
    out.update({g["groupName"]: g for g in cluster(rs)["workerGroupSpecs"]})
    return out


def ray_container(group: dict[str, Any]) -> dict[str, Any]:
    return group["template"]["spec"]["containers"][0]  # KubeRay's Ray container is the first


def pod_labels(group: dict[str, Any]) -> dict[str, str]:
    return group["template"].get("metadata", {}).get("labels", {})


def custom_resources(group: dict[str, Any]) -> dict[str, float]:
    """rayStartParams.resources as `ray start` receives it (the value is quoted for bash)."""
    raw = group.get("rayStartParams", {}).get("resources")
    if raw is None:
        return {}
    (value,) = shlex.split(raw)
    return json.loads(value)


def gpu_limit(group: dict[str, Any]) -> int:
    return int(ray_container(group).get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))


def serve_config(rs: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(rs["spec"]["serveConfigV2"])


def application(rs: dict[str, Any]) -> dict[str, Any]:
    (app,) = serve_config(rs)["applications"]
    return app


def gateway_group_name(rs: dict[str, Any]) -> str:
    (name,) = [n for n, g in groups(rs).items() if gen_k8s.GATEWAY_RESOURCE in custom_resources(g)]
    return name


def gpu_group_names(rs: dict[str, Any]) -> list[str]:
    return [n for n, g in groups(rs).items() if gpu_limit(g)]


def ports_by_name(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}


def http_probe(container: dict[str, Any], kind: str) -> tuple[str, Any] | None:
    probe = container.get(kind)
    if probe is None:
        return None
    get = probe.get("httpGet") or {}
    return get.get("path"), get.get("port")


# ----------------------------------------------------------------------------- schemas
def test_manifests_exist() -> None:
    kinds = sorted(doc["kind"] for _, doc in DOCS)
    assert kinds.count("RayService") == 2 and "Service" in kinds and "PersistentVolumeClaim" in kinds, kinds


@pytest.mark.parametrize(("label", "doc"), DOCS, ids=[label for label, _ in DOCS])
def test_document_matches_its_schema(label: str, doc: dict[str, Any], schema_dir: Path) -> None:
    assert manifest_errors(doc, schema_dir) == [], label


@pytest.mark.parametrize(("label", "rs"), RAYSERVICES, ids=RAYSERVICE_IDS)
def test_rayservice_passes_kuberay_controller_rules(label: str, rs: dict[str, Any]) -> None:
    """Rules KubeRay's controller enforces (utils/validation.go) or pods need, not in the CRD schema."""
    name = rs["metadata"]["name"]
    assert len(name) <= 47 and DNS1035.match(name), name
    for gname, group in groups(rs).items():
        params = group.get("rayStartParams", {})
        assert not (group.get("resources") and any(params.get(k) for k in ("num-cpus", "num-gpus", "resources"))), (
            f"{gname}: resources in rayStartParams and in `resources`"
        )
        assert all(isinstance(v, str) for v in params.values()), gname
        pod = group["template"]["spec"]
        containers = pod["containers"] + pod.get("initContainers", [])
        names = [c["name"] for c in containers]
        assert len(names) == len(set(names)), names
        volumes = [v["name"] for v in pod.get("volumes", [])]
        assert len(volumes) == len(set(volumes)), volumes
        for c in containers:
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{gname}/{c['name']} mounts unknown volume {mount['name']}"
        if gname != "head":
            assert group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"], gname


# ----------------------------------------------------------------------------- the Serve config
@pytest.mark.parametrize(("label", "rs"), RAYSERVICES, ids=RAYSERVICE_IDS)
def test_serve_config_is_accepted_by_ray(label: str, rs: dict[str, Any]) -> None:
    assert serve_config_errors(serve_config(rs)) == []


@pytest.mark.parametrize(("label", "rs"), RAYSERVICES, ids=RAYSERVICE_IDS)
def test_serve_config_matches_the_strict_json_schema(label: str, rs: dict[str, Any], schema_dir: Path) -> None:
    # Ray ignores unknown keys (a typo is dropped silently); the strict schema rejects them.
    assert schema_errors(serve_config(rs), schema_dir / f"serve-config.ray-{RAY_VERSION}.json") == []


def test_manifests_are_generated_from_the_configs_file() -> None:
    stale = [p.name for p, text in gen_k8s.rendered().items() if p.read_text() != text]
    assert not stale, f"{stale} out of date with configs/serve_app.yaml: run python scripts/gen_k8s.py"


@pytest.mark.parametrize(("label", "rs"), RAYSERVICES, ids=RAYSERVICE_IDS)
def test_serve_config_differs_from_the_configs_file_only_where_documented(label: str, rs: dict[str, Any]) -> None:
    source = yaml.safe_load((ROOT / "configs" / "serve_app.yaml").read_text())
    embedded = serve_config(rs)
    assert {k: v for k, v in embedded.items() if k != "applications"} == {
        k: v for k, v in source.items() if k != "applications"
    }
    assert embedded["proxy_location"] == "Disabled"  # the gateway serves the ports, not Ray's proxy
    (src_app,) = source["applications"]
    app = application(rs)
    for key in set(src_app) | set(app):
        if key not in ("args", "deployments"):
            assert app.get(key) == src_app.get(key), key
    assert app["import_path"] == "serve_app.app:build_app"
    assert set(app["args"]) == set(src_app["args"]) | set(gen_k8s.K8S_ARGS)
    changed = {k for k in app["args"] if app["args"][k] != src_app["args"].get(k)}
    assert changed <= set(gen_k8s.K8S_ARGS), changed
    assert all(app["args"][k] == v for k, v in gen_k8s.K8S_ARGS.items())
    assert [d["name"] for d in app["deployments"]] == ["gateway"]


@pytest.mark.parametrize(("label", "rs"), RAYSERVICES, ids=RAYSERVICE_IDS)
def test_args_are_accepted_by_server_settings(label: str, rs: dict[str, Any]) -> None:
    app = application(rs)
    settings = ServerSettings.from_args(app["args"])
    assert settings.app_name == app["name"]  # the gateway finds its peers under this name
    assert settings.model_repository == gen_k8s.MODEL_REPOSITORY
    assert settings.host == "0.0.0.0"
    for gname, group in groups(rs).items():
        mounts = {m["mountPath"]: m for m in ray_container(group).get("volumeMounts", [])}
        assert settings.model_repository in mounts, f"{gname} does not mount the repository"
        assert mounts[settings.model_repository].get("readOnly") is True, gname
        for port_name, field in TRITON_PORTS.items():
            assert ports_by_name(ray_container(group)).get(port_name) == getattr(settings, field), (gname, port_name)


# ----------------------------------------------------------------------------- where the gateway runs
@pytest.mark.parametrize(("label", "rs"), RAYSERVICES, ids=RAYSERVICE_IDS)
def test_gateway_is_pinned_to_the_gateway_group(label: str, rs: dict[str, Any]) -> None:
    from serve_app.placement import ClusterGpus
    from serve_app.rayserve.app_builder import build_application

    (override,) = application(rs)["deployments"]
    options = override["ray_actor_options"]
    assert options["resources"] == {gen_k8s.GATEWAY_RESOURCE: 1}
    # A config's ray_actor_options replace the code's: everything else must be the code's own.
    with tempfile.TemporaryDirectory() as empty:
        app = build_application(ServerSettings(model_repository=empty), gpus=ClusterGpus())
    gateway = app._bound_deployment
    assert override["name"] == gateway.name
    assert {k: v for k, v in options.items() if k != "resources"} == gateway.ray_actor_options
    # Only the gateway group offers the resource: not the head (its readiness must not wait for
    # the gateway) and not the GPU pods.
    gname = gateway_group_name(rs)
    group = groups(rs)[gname]
    assert gname != "head" and not gpu_limit(group)
    per_pod = custom_resources(group)[gen_k8s.GATEWAY_RESOURCE]
    gateways = ServerSettings.from_args(application(rs)["args"]).gateway_replicas
    assert group["maxReplicas"] * per_pod >= gateways, "the gateway group cannot hold every gateway replica"
    assert group["minReplicas"] * per_pod >= gateways, "gateway pods would be created only on demand"
    assert group["rayStartParams"]["num-cpus"] == "0", "model instances must not land on gateway pods"


@pytest.mark.parametrize(("label", "rs"), RAYSERVICES, ids=RAYSERVICE_IDS)
def test_gpu_groups_declare_one_resource_per_device(label: str, rs: dict[str, Any]) -> None:
    prefix = getattr(ServerSettings(model_repository="/m"), "gpu_resource_prefix", "gpu_idx_")
    names = gpu_group_names(rs)
    assert names, "no worker group with nvidia.com/gpu limits"
    for gname in names:
        group = groups(rs)[gname]
        gpus = gpu_limit(group)
        assert group["rayStartParams"]["num-gpus"] == str(gpus), gname
        indexed = {k: v for k, v in custom_resources(group).items() if k.startswith(prefix)}
        assert indexed == {f"{prefix}{i}": 1 for i in range(gpus)}, gname
        requests = ray_container(group)["resources"].get("requests", {})
        assert int(requests.get("nvidia.com/gpu", gpus)) == gpus, gname


@pytest.mark.parametrize(("label", "rs"), RAYSERVICES, ids=RAYSERVICE_IDS)
def test_probes_follow_the_gateway(label: str, rs: dict[str, Any]) -> None:
    all_groups = groups(rs)
    head = ray_container(all_groups["head"])
    # KubeRay sends the Serve config once the head is ready: its probes stay KubeRay's (GCS, raylet).
    assert not any(head.get(k) for k in ("readinessProbe", "livenessProbe", "startupProbe"))
    gateway = ray_container(all_groups[gateway_group_name(rs)])
    assert http_probe(gateway, "readinessProbe") == ("/v2/health/ready", "serve")
    assert http_probe(gateway, "livenessProbe") == ("/v2/health/live", "serve")
    assert http_probe(gateway, "startupProbe") == ("/v2/health/live", "serve")
    for gname in gpu_group_names(rs):
        worker = ray_container(all_groups[gname])
        # Unready without a gateway, so KubeRay's serve Service (all worker pods) never picks them.
        assert http_probe(worker, "readinessProbe") == ("/v2/health/ready", "serve"), gname
        # A liveness probe on the gateway would restart pods that never host one.
        assert "livenessProbe" not in worker, gname
    assert set(all_groups) == {"head", gateway_group_name(rs), *gpu_group_names(rs)}


@pytest.mark.parametrize(("label", "rs"), RAYSERVICES, ids=RAYSERVICE_IDS)
def test_autoscaling_is_enabled(label: str, rs: dict[str, Any]) -> None:
    spec = cluster(rs)
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] > 0
    for group in spec["workerGroupSpecs"]:
        assert 1 <= group["minReplicas"] <= group["maxReplicas"], group["groupName"]


# ----------------------------------------------------------------------------- Services
@pytest.mark.parametrize(("label", "rs"), RAYSERVICES, ids=RAYSERVICE_IDS)
def test_kuberay_serve_service_carries_the_three_ports(label: str, rs: dict[str, Any]) -> None:
    # KubeRay builds its serve Service from the head container's ports named serve / serve-*.
    head_ports = ports_by_name(ray_container(groups(rs)["head"]))
    assert {n: head_ports[n] for n in TRITON_PORTS} == {"serve": 8000, "serve-grpc": 8001, "serve-metrics": 8002}
    assert rs["spec"]["excludeHeadPodFromServeSvc"] is True
    assert rs["spec"]["serveService"]["metadata"]["name"] == "serve-app"


def test_services_select_only_ready_gateway_pods() -> None:
    (rs,) = [doc for label, doc in RAYSERVICES if label.startswith("rayservice.yaml")]
    all_groups = groups(rs)
    gateway = all_groups[gateway_group_name(rs)]
    services = _docs_of("Service")
    assert {p["port"] for s in services for p in s["spec"]["ports"]} == {8000, 8001, 8002}
    for svc in services:
        selector = svc["spec"]["selector"]
        name = svc["metadata"]["name"]
        assert selector.items() <= pod_labels(gateway).items(), name
        for gname, group in all_groups.items():
            if group is not gateway:
                assert not selector.items() <= pod_labels(group).items(), f"{name} selects {gname} pods"
        container_ports = ports_by_name(ray_container(gateway))
        for port in svc["spec"]["ports"]:
            assert container_ports[port["targetPort"]] == port["port"], (name, port)


def test_servicemonitor_scrapes_the_metrics_service() -> None:
    (monitor,) = _docs_of("ServiceMonitor")
    wanted = monitor["spec"]["selector"]["matchLabels"]
    (svc,) = [s for s in _docs_of("Service") if wanted.items() <= s["metadata"]["labels"].items()]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert svc["spec"]["clusterIP"] == "None"  # headless: every gateway pod is scraped


# ----------------------------------------------------------------------------- the model repository
def test_model_repository_comes_from_a_read_only_many_claim() -> None:
    (claim,) = _docs_of("PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    (rs,) = [doc for label, doc in RAYSERVICES if label.startswith("rayservice.yaml")]
    for gname, group in groups(rs).items():
        (volume,) = [v for v in group["template"]["spec"]["volumes"] if v["name"] == "model-repository"]
        assert volume["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"], "readOnly": True}, gname


def _without_object_storage(rs: dict[str, Any]) -> dict[str, Any]:
    rs = copy.deepcopy(rs)
    for group in groups(rs).values():
        pod = group["template"]["spec"]
        syncs = [c for c in pod.pop("initContainers", []) if c["name"] == "sync-model-repository"]
        assert len(syncs) == 1
        (mount,) = syncs[0]["volumeMounts"]
        assert mount == {"name": "model-repository", "mountPath": gen_k8s.MODEL_REPOSITORY}
        for volume in pod["volumes"]:
            if volume["name"] == "model-repository":
                assert "emptyDir" in volume
                volume.pop("emptyDir")
    return rs


def _without_claim(rs: dict[str, Any]) -> dict[str, Any]:
    rs = copy.deepcopy(rs)
    for group in groups(rs).values():
        for volume in group["template"]["spec"]["volumes"]:
            if volume["name"] == "model-repository":
                volume.pop("persistentVolumeClaim")
    return rs


def test_object_storage_variant_differs_only_in_the_model_source() -> None:
    by_file = {label.split("#")[0]: doc for label, doc in RAYSERVICES}
    base, variant = by_file["rayservice.yaml"], by_file["rayservice-object-storage.yaml"]
    assert _without_object_storage(variant) == _without_claim(base)
    (config_map,) = _docs_of("ConfigMap")
    ref = groups(variant)["head"]["template"]["spec"]["initContainers"][0]["env"][0]["valueFrom"]["configMapKeyRef"]
    assert config_map["metadata"]["name"] == ref["name"] and ref["key"] in config_map["data"]


# ----------------------------------------------------------------------------- versions
def test_ray_versions_agree() -> None:
    for _, rs in RAYSERVICES:
        assert cluster(rs)["rayVersion"] == RAY_VERSION
        images = {ray_container(g)["image"] for g in groups(rs).values()}
        assert len(images) == 1, images  # one image for every Ray pod (and the autoscaler sidecar)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"rayproject/ray:{RAY_VERSION}-py311" in dockerfile


# ----------------------------------------------------------------------------- broken manifests fail
def test_broken_rayservice_is_rejected_with_a_readable_message(schema_dir: Path) -> None:
    (rs,) = [doc for label, doc in RAYSERVICES if label.startswith("rayservice.yaml")]
    broken = copy.deepcopy(rs)
    gpu_index = [g["groupName"] for g in cluster(broken)["workerGroupSpecs"]].index(gpu_group_names(rs)[0])
    cluster(broken)["workerGroupSpecs"][gpu_index]["rayStartParams"]["num-gpus"] = 1  # must be a string
    cluster(broken)["enableInTreeAutoscaling"] = "yes"
    broken["spec"]["serveConfigv2"] = broken["spec"].pop("serveConfigV2")  # a typo
    errors = manifest_errors(broken, schema_dir)
    assert (
        f".spec.rayClusterConfig.workerGroupSpecs[{gpu_index}].rayStartParams.num-gpus: 1 is not of type 'string'"
        in errors
    )
    assert ".spec.rayClusterConfig.enableInTreeAutoscaling: 'yes' is not of type 'boolean', 'null'" in errors
    assert ".spec: Additional properties are not allowed ('serveConfigv2' was unexpected)" in errors
    assert len(errors) == 3, errors


def test_broken_serve_config_is_rejected_with_a_readable_message(schema_dir: Path) -> None:
    (_, rs), *_ = RAYSERVICES
    config = serve_config(rs)
    app = config["applications"][0]
    app["route_prefx"] = "/"  # a typo Ray itself would drop silently
    app["deployments"][0]["ray_actor_options"]["num_cpus"] = -1
    errors = schema_errors(config, schema_dir / f"serve-config.ray-{RAY_VERSION}.json")
    assert ".applications[0]: Additional properties are not allowed ('route_prefx' was unexpected)" in errors
    assert any(e.startswith(".applications[0].deployments[0].ray_actor_options.num_cpus: -1") for e in errors), errors
    ray_errors = serve_config_errors(config)
    assert any("num_cpus" in e and "greater than or equal to 0" in e for e in ray_errors), ray_errors
