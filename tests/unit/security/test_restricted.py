"""Triton's restricted API categories: the flag parser, the path and method tables, the header check."""

from __future__ import annotations

import pytest

from serve_app.errors import InvalidArgument
from serve_app.grpc_server.servicer import _METHODS
from serve_app.security.restricted import (
    CATEGORIES,
    RestrictedApis,
    Restriction,
    grpc_category,
    http_category,
)


def headers(**values: str) -> dict[str, str]:
    return {k.replace("_", "-"): v for k, v in values.items()}


def test_parse_groups_as_triton_does() -> None:
    apis = RestrictedApis.parse(["model-repository,statistics:admin-key=s3cr=et", "inference:infer-key=v"])
    assert apis.restriction("model-repository") == Restriction("admin-key", "s3cr=et")  # the value may hold '='
    assert apis.restriction("statistics") == Restriction("admin-key", "s3cr=et")
    assert apis.restriction("inference") == Restriction("infer-key", "v")
    assert apis.restriction("health") is None
    assert apis and not RestrictedApis.parse([]) and not RestrictedApis()


def test_grpc_keys_get_tritons_prefix_in_lower_case() -> None:
    apis = RestrictedApis.parse(["health,inference:Infer-Key=V"], grpc=True)
    assert apis.restriction("health") == Restriction("triton-grpc-protocol-infer-key", "V")


@pytest.mark.parametrize(
    ("arg", "grpc", "message"),
    [
        ("model-repository", False, "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got"),
        ("model-repository:key", False, "option format is"),
        ("model-repository:=v", False, "option format is"),
        ("model-repository:k=", False, "option format is"),
        (":k=v", True, "--grpc-restricted-protocol option format is"),
        ("model-reposit,health:k1=v1", False, "unknown restricted api 'model-reposit'"),
        ("model-reposit:k1=v1", True, "unknown restricted protocol 'model-reposit'"),
        ("inference,inference:k=v", False, "restricted api 'inference' can not be specified in multiple config groups"),
        ("Health:k=v", False, "unknown restricted api 'Health'"),  # names are case-sensitive, as in Triton
    ],
)
def test_parse_errors(arg: str, grpc: bool, message: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        RestrictedApis.parse([arg], grpc=grpc)
    assert message in err.value.message


def test_category_in_two_groups_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="restricted protocol 'health' can not be specified in multiple"):
        RestrictedApis.parse(["model-repository,health:k1=v1", "metadata,health:k2=v2"], grpc=True)


def test_refusal() -> None:
    apis = RestrictedApis.parse(["model-repository:admin-key=secret"])
    get = headers(admin_key="secret").get
    assert apis.refusal("model-repository", get) is None
    assert apis.refusal("model-repository", headers(admin_key="wrong").get) == Restriction("admin-key", "secret")
    assert apis.refusal("model-repository", headers(admin_key="secret2").get) is not None
    assert apis.refusal("model-repository", headers(admin_key="").get) is not None
    assert apis.refusal("model-repository", {}.get) is not None
    assert apis.refusal("inference", {}.get) is None  # not restricted
    assert apis.refusal(None, {}.get) is None  # not a category (unknown path)


def test_repr_hides_the_values() -> None:
    apis = RestrictedApis.parse(["model-repository:admin-key=topsecret"])
    for text in (repr(apis), repr(apis.restriction("model-repository"))):
        assert "admin-key" in text and "topsecret" not in text


def test_plain_data_for_ray() -> None:
    import pickle

    apis = pickle.loads(pickle.dumps(RestrictedApis.parse(["inference:k=v"], grpc=True)))
    assert apis.restriction("inference") == Restriction("triton-grpc-protocol-k", "v")


def test_unknown_category_in_constructor() -> None:
    with pytest.raises(InvalidArgument, match="unknown restricted categories"):
        RestrictedApis({"nope": Restriction("k", "v")})


@pytest.mark.parametrize(
    ("path", "category"),
    [
        ("/v2", "metadata"),
        ("/v2/health/live", "health"),
        ("/v2/health/ready", "health"),
        ("/v2/models/m", "metadata"),
        ("/v2/models/m/versions/2", "metadata"),
        ("/v2/models/m/ready", "health"),
        ("/v2/models/m/versions/2/ready", "health"),
        ("/v2/models/m/config", "model-config"),
        ("/v2/models/m/versions/2/config", "model-config"),
        ("/v2/models/m/infer", "inference"),
        ("/v2/models/m/versions/2/infer", "inference"),
        ("/v2/models/m/versions/x/infer", "inference"),  # any version: our router takes it
        ("/v2/models/m/generate", "inference"),
        ("/v2/models/m/generate_stream", "inference"),
        ("/v2/models/m/stats", "statistics"),
        ("/v2/models/m/versions/1/stats", "statistics"),
        ("/v2/models/stats", "statistics"),
        ("/v2/models/m/trace/setting", "trace"),
        ("/v2/trace/setting", "trace"),
        ("/v2/logging", "logging"),
        ("/v2/repository/index", "model-repository"),
        ("/v2/repository/r/index", "model-repository"),
        ("/v2/repository/models/m/load", "model-repository"),
        ("/v2/repository/models/m/unload", "model-repository"),
        ("/v2/repository/r/models/m/load", "model-repository"),
        ("/v2/systemsharedmemory/status", "shared-memory"),
        ("/v2/systemsharedmemory/region/r/register", "shared-memory"),
        ("/v2/cudasharedmemory/region/r/unregister", "shared-memory"),
        ("/v2/cudasharedmemory/status", "shared-memory"),
        ("/metrics", None),
        ("/v2/", None),
        ("/v2/health", None),
        ("/v2/models", None),
        ("/v2/models/m/unknown", None),
        ("/v2/repository/models/m", None),
        ("/", None),
    ],
)
def test_http_category(path: str, category: str | None) -> None:
    assert http_category(path) == category


def test_every_grpc_method_has_a_category() -> None:
    for name in _METHODS:
        assert grpc_category(f"/inference.GRPCInferenceService/{name}") in CATEGORIES, name


@pytest.mark.parametrize(
    ("method", "category"),
    [
        ("/inference.GRPCInferenceService/ServerLive", "health"),
        ("/inference.GRPCInferenceService/ModelReady", "health"),
        ("/inference.GRPCInferenceService/ServerMetadata", "metadata"),
        ("/inference.GRPCInferenceService/ModelMetadata", "metadata"),
        ("/inference.GRPCInferenceService/ModelInfer", "inference"),
        ("/inference.GRPCInferenceService/ModelStreamInfer", "inference"),
        ("/inference.GRPCInferenceService/ModelConfig", "model-config"),
        ("/inference.GRPCInferenceService/ModelStatistics", "statistics"),
        ("/inference.GRPCInferenceService/RepositoryIndex", "model-repository"),
        ("/inference.GRPCInferenceService/RepositoryModelLoad", "model-repository"),
        ("/inference.GRPCInferenceService/RepositoryModelUnload", "model-repository"),
        ("/inference.GRPCInferenceService/CudaSharedMemoryRegister", "shared-memory"),
        ("/inference.GRPCInferenceService/TraceSetting", "trace"),
        ("/inference.GRPCInferenceService/LogSettings", "logging"),
        ("/grpc.health.v1.Health/Check", "health"),
        ("/inference.GRPCInferenceService/Nope", None),
        ("/other.Service/ModelInfer", None),
    ],
)
def test_grpc_category(method: str, category: str | None) -> None:
    assert grpc_category(method) == category
