"""Server settings shared by the CLI, the `serve run` builder and the configs/ file."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from serve_app.errors import InvalidArgument

CONTROL_MODES = ("none", "poll", "explicit")


@dataclass(frozen=True, slots=True)
class ServerSettings:
    model_repository: str
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    # Gateway replicas (our HTTP/gRPC front end); they share the ports with SO_REUSEPORT.
    gateway_replicas: int = 1
    # Logical CPUs each KIND_CPU/KIND_GPU model instance reserves in Ray.
    instance_cpus: float = 1.0
    # Calls (batches) in flight per model instance from each gateway.  1 is Triton's rule (a batch is
    # formed when an instance is free, so batches grow while it works); 2 also hides the Ray hop.
    max_inflight_per_instance: int = 1
    # Gateways send batches to model instances over a direct channel (False: through Serve handles).
    direct_channel: bool = True
    # Name of the Serve application.
    app_name: str = "serve_app"
    # Custom resources naming one GPU each: a node with GPUs 0 and 1 declares {"<prefix>0": 1, "<prefix>1": 1}.
    # With them, instance groups may list `gpus` and every GPU instance is pinned to its GPU index.
    gpu_resource_prefix: str = "gpu_idx_"
    # Before planning instances, wait until the cluster shows at least this many GPUs (GPU nodes may join
    # after the head, e.g. on KubeRay), for at most wait_for_gpus_s seconds; 0: plan with what is there.
    wait_for_gpus: int = 0
    wait_for_gpus_s: float = 600.0
    # Triton's model control: none (load all at start), poll (also follow the repository's changes every
    # repository_poll_secs) or explicit (load what load_model names, then the repository API decides).
    model_control_mode: str = "none"
    load_model: tuple[str, ...] = ()  # explicit mode's startup models; "*" is every model
    repository_poll_secs: float = 15.0
    # YAML/JSON file of per-model autoscaling settings ({model: {min_replicas: 1, max_replicas: 4, ...}})
    # that win over the models' `autoscaling.*` config parameters.
    autoscaling_file: str = ""
    # Longest wait for a model's instances to start (placement included) before its load fails.
    load_timeout_s: float = 600.0
    # Requests one model version may hold queued in a gateway before new ones get 503 / UNAVAILABLE
    # "Exceeds maximum queue size" (the model's own max_queue_size still applies per priority level).
    # Triton queues without bound; we don't, so overload sheds load instead of growing memory and latency.
    # 0: unbounded.
    max_queue_size: int = 4096
    # A model whose instances fail to load is unloaded, as in Triton (its index entry keeps the reason).
    # True keeps its instances running, UNAVAILABLE, for inspecting where they were placed (tests, debugging).
    keep_failed_instances: bool = False
    # A batch whose instance doesn't answer within this many seconds fails with 503 / UNAVAILABLE (a hung
    # instance; a dead one fails its calls at once). 0: wait for ever.
    instance_timeout_s: float = 300.0
    # TLS for the HTTP and gRPC ports (PEM files; both cert and key, or neither). With tls_ca and
    # tls_require_client_cert, clients must present a certificate signed by that CA (mutual TLS).
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_require_client_cert: bool = False
    # Triton's --http-restricted-api / --grpc-restricted-protocol values, "<category>[,<category>...]:<key>=<value>":
    # those APIs answer only requests carrying that header (gRPC: triton-grpc-protocol-<key>). Several
    # groups: a list, or separated by ";" in `serve run key=value` args.
    http_restricted_api: tuple[str, ...] = field(default=(), metadata={"sep": ";"})
    grpc_restricted_protocol: tuple[str, ...] = field(default=(), metadata={"sep": ";"})
    # Request limits, enforced before allocating (413 / RESOURCE_EXHAUSTED for the body, 400 for the rest);
    # defaults: serve_app.protocol.limits.DEFAULT_LIMITS.
    max_body_bytes: int = 256 * 1024 * 1024
    max_tensor_elements: int = 2**28
    max_json_depth: int = 64
    max_inputs: int = 1024
    max_outputs: int = 1024
    # On SIGTERM: stop accepting (503), then wait this long for requests in progress (Triton's --exit-timeout-secs).
    exit_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.model_control_mode not in CONTROL_MODES:
            raise InvalidArgument(
                f"model_control_mode '{self.model_control_mode}' is not one of {', '.join(CONTROL_MODES)}"
            )
        if self.repository_poll_secs <= 0:
            raise InvalidArgument("repository_poll_secs must be positive")
        self.tls()  # a half-given TLS setting fails here, not in the gateway
        self.limits()
        self.restricted_apis()

    def limits(self) -> Any:
        """The request limits both front ends enforce."""
        from serve_app.limits import RequestLimits

        try:
            return RequestLimits(
                max_body_bytes=self.max_body_bytes,
                max_tensor_elements=self.max_tensor_elements,
                max_json_depth=self.max_json_depth,
                max_inputs=self.max_inputs,
                max_outputs=self.max_outputs,
            )
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    def tls(self) -> Any:
        """The TLS settings, or None without a certificate."""
        from serve_app.security.tls import optional_tls

        return optional_tls(self.tls_cert, self.tls_key, self.tls_ca, self.tls_require_client_cert)

    def restricted_apis(self) -> tuple[Any, Any]:
        """(HTTP, gRPC) restricted APIs, parsed as Triton parses its flags."""
        from serve_app.security.restricted import RestrictedApis

        return (
            RestrictedApis.parse(list(self.http_restricted_api)),
            RestrictedApis.parse(list(self.grpc_restricted_protocol), grpc=True),
        )

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> ServerSettings:
        """From `serve run` key=value args or a config file's `args` (strings are converted)."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise InvalidArgument(f"unknown serve_app argument(s): {', '.join(unknown)}; known: {', '.join(known)}")
        if "model_repository" not in args:
            raise InvalidArgument("serve_app needs model_repository=<path to a Triton model repository>")
        values: dict[str, Any] = {}
        for key, raw in args.items():
            kind = known[key].type
            try:
                if kind in ("bool", bool):
                    values[key] = _boolean(raw)
                elif kind in ("int", int):
                    values[key] = int(raw)
                elif kind in ("float", float):
                    values[key] = float(raw)
                elif str(kind).startswith("tuple"):
                    values[key] = _names(raw, known[key].metadata.get("sep", ","))
                else:
                    values[key] = str(raw)
            except (TypeError, ValueError):
                raise InvalidArgument(f"serve_app argument {key}={raw!r} is not a valid {kind}") from None
        return cls(**values)

    def to_args(self) -> dict[str, Any]:
        return asdict(self)


def _names(raw: Any, sep: str = ",") -> tuple[str, ...]:
    """A list, or one string of items separated by ``sep`` (as `serve run key=value` gives it)."""
    items = raw if isinstance(raw, (list, tuple)) else str(raw).split(sep)
    return tuple(str(i).strip() for i in items if str(i).strip())


def _boolean(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)
