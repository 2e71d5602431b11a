"""Server settings shared by the CLI, the `serve run` builder and the configs/ file.

Each field carries its own help (``metadata["help"]``): the CLI's flags and
``docs/configuration.md`` are generated from these fields, so the three ways
to run the server share one set of names and defaults.
"""

from __future__ import annotations

from dataclasses import Field, asdict, dataclass, field, fields
from typing import Any

from serve_app.cache_config import CacheConfig
from serve_app.errors import InvalidArgument
from serve_app.limits import DEFAULT_LIMITS, RequestLimits
from serve_app.metrics_options import MetricsOptions
from serve_app.observability.log_settings import LogSettings
from serve_app.observability.trace_startup import TraceStartup
from serve_app.rate_limit_config import RATE_LIMIT_MODES, parse_resources
from serve_app.security.paths import is_plain_name
from serve_app.security.restricted import RestrictedApis
from serve_app.security.tls import TlsSettings, optional_tls

CONTROL_MODES = ("none", "poll", "explicit")


def setting(default: Any, help: str, **meta: Any) -> Any:
    """A settings field: its default, its help, and how the CLI spells it.

    ``flag``: the CLI flag when it is not ``--<field-name>`` (Triton's own names win);
    ``path``: made absolute by the CLI; ``repeat``: a repeatable flag (tuple fields);
    ``choices``: the values the CLI accepts; ``sep``: the separator of a tuple given as one
    string in `serve run key=value` args (default ",")."""
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True, slots=True)
class ServerSettings:
    model_repository: str = field(metadata={"help": "path to a Triton model repository", "path": True})
    host: str = setting("0.0.0.0", "address the HTTP, gRPC and metrics servers bind")
    http_port: int = setting(8000, "HTTP/REST port (KServe v2 and Triton's extensions)")
    grpc_port: int = setting(8001, "gRPC port (inference.GRPCInferenceService)")
    metrics_port: int = setting(8002, "Prometheus metrics port")
    openai_port: int = setting(
        0,
        "OpenAI-compatible port (/v1/models, /v1/completions, /v1/chat/completions) over the models that follow "
        "Triton's LLM conventions (docs/openai.md); 0: off.  Triton's OpenAI front end uses 9000",
    )
    openai_tokenizer: str = setting(
        "",
        "tokenizer directory (tokenizer_config.json or chat_template.jinja) whose chat template renders chat "
        "messages for the models whose config names no `tokenizer` parameter; empty: the plain default template",
        path=True,
    )
    gateway_replicas: int = setting(1, "front-end (gateway) replicas; they share the ports with SO_REUSEPORT")
    instance_cpus: float = setting(
        0.01,
        "logical CPUs each process holding model instances (a shared host, or a dedicated replica) reserves in "
        "Ray: a token amount by default, so that instances land where CPUs are and share them, as Triton's do; "
        "raise it to reserve cores",
    )
    cpu_instances_in_gateway: bool = setting(
        True,
        "shared KIND_CPU instances live in the gateway processes themselves, as a Triton server serves and runs "
        "its models in one process: no hop between front end and instance (each gateway holds `count` of each "
        "group); off: in a host process of their own on each node (clusters whose gateways run on nodes kept "
        "free of models, as the KubeRay manifests do)",
    )
    shared_hosts: bool = setting(
        True,
        "model instances are threads of shared host processes (one per node for CPU instances, one per GPU), as "
        "in Triton; off: every instance is a Serve replica of its own (as models with the dedicated_process "
        "parameter, and autoscaled ones, always are)",
    )
    max_inflight_per_instance: int = setting(
        1,
        "batches in flight per model instance from each gateway: 1 is Triton's rule (a batch is formed when an "
        "instance is free, so batches grow while it works); 2 also hides the hop behind the previous execution",
    )
    direct_channel: bool = setting(
        True, "gateways send batches to model instances over a direct channel (off: through Serve handles)"
    )
    app_name: str = setting("serve_app", "name of the Serve application")
    server_name: str = setting(
        "serve_app",
        "the name server metadata reports (GET /v2, gRPC ServerMetadata); 'triton' for scripts that check it",
    )
    gpu_resource_prefix: str = setting(
        "gpu_idx_",
        "custom Ray resources naming one GPU each: a node with GPUs 0 and 1 declares "
        '{"<prefix>0": 1, "<prefix>1": 1}; with them, instance groups may list `gpus` and every GPU instance is '
        "pinned to its GPU index",
    )
    wait_for_gpus: int = setting(
        0,
        "before planning instances, wait until the cluster shows at least this many GPUs (GPU nodes may join "
        "after the head, e.g. on KubeRay); 0: plan with what is there",
    )
    wait_for_gpus_s: float = setting(600.0, "longest wait for wait_for_gpus")
    model_control_mode: str = setting(
        "none",
        "Triton's model control: none (load all at start), poll (also follow the repository's changes every "
        "repository_poll_secs) or explicit (load what load_model names, then the repository API decides)",
        choices=CONTROL_MODES,
    )
    load_model: tuple[str, ...] = setting(
        (), "explicit mode: a model to load at start ('*': every model)", repeat=True, metavar="NAME"
    )
    allow_model_code_upload: bool = setting(
        False,
        "explicit mode: the repository load API may bring code the server runs (a Python model's files, a "
        "requirements.txt, a shared library, EXECUTION_ENV_PATH or a TensorRT plugin path in the config); any "
        "client that may load models can then run code in the server, so turn it on only with the repository "
        "API restricted (http_restricted_api, grpc_restricted_protocol) or for trusted clients; off: such loads "
        "are refused (model files backends only read, such as ONNX, stay allowed)",
    )
    repository_poll_secs: float = setting(15.0, "poll mode: seconds between repository polls")
    load_on_demand: bool = setting(
        False,
        "explicit or poll mode: a request for a repository model that is not loaded loads it (concurrent first "
        "requests share one load), waits for it up to on_demand_wait_s, then is served; the start loads only the "
        "load_model names (poll mode: none), and the poll reloads changed models that are loaded",
    )
    on_demand_wait_s: float = setting(
        120.0, "load_on_demand: longest a request waits for its model to load (and for room on a node)"
    )
    max_loaded_models_per_node: int = setting(
        0,
        "load_on_demand: models one node holds at most (every loaded model counts; the operator's count on every "
        "node); a load goes to the node with the most room, or unloads the least recently used idle model loaded "
        "on demand first (0: no limit)",
    )
    on_demand_min_resident_s: float = setting(
        30.0,
        "load_on_demand: a model loaded on demand is not evicted sooner than this after its load, so a working "
        "set larger than the budget answers slower instead of loading and unloading in turn",
    )
    model_load_thread_count: int = setting(
        0,
        "Triton's --model-load-thread-count: models whose instances start at once (the others wait their turn, "
        "ensembles after their steps); 0: all at once, as Ray places them (Triton's default is 4)",
    )
    model_load_retry_count: int = setting(
        0,
        "Triton's --model-load-retry-count: times a model whose instances failed to start is started again "
        "before its load fails",
    )
    model_config_name: str = setting(
        "",
        "Triton's --model-config-name: load each model from configs/<name>.pbtxt in its directory where that "
        "file exists, from config.pbtxt elsewhere",
    )
    autoscaling_file: str = setting(
        "",
        "YAML/JSON file of per-model autoscaling settings ({model: {min_replicas: 1, max_replicas: 4, ...}}) that "
        "win over the models' autoscaling.* config parameters",
        path=True,
    )
    load_timeout_s: float = setting(
        600.0, "longest wait for a model's instances to start (placement included) before its load fails"
    )
    placement_timeout_s: float = setting(
        40.0,
        "a model whose instances Ray has not placed after this many seconds, for want of resources, fails its "
        "load with what they ask and what the cluster has (the others serve); raise it when an autoscaler adds "
        "nodes (Serve reports unplaced replicas after 30 s)",
    )
    max_queue_size: int = setting(
        4096,
        "requests one model version may hold queued in a gateway before new ones get 503 / UNAVAILABLE "
        '"Exceeds maximum queue size" (the model\'s own max_queue_size still applies per priority level); '
        "0: unbounded.  Triton queues without bound; we don't, so overload sheds load instead of growing memory "
        "and latency",
    )
    keep_failed_instances: bool = setting(
        False,
        "a model whose instances fail to load is unloaded, as in Triton (its index entry keeps the reason); on: "
        "keep its instances running, UNAVAILABLE, to inspect where they were placed",
    )
    instance_timeout_s: float = setting(
        300.0,
        "a batch whose instance doesn't answer within this many seconds fails with 503 / UNAVAILABLE (a hung "
        "instance; a dead one fails its calls at once); 0: wait for ever",
    )
    strict_model_config: bool = setting(
        False,
        "Triton's --strict-model-config (or --disable-auto-complete-config): on, a config is not completed from "
        "the model (inputs, outputs, batching, a Python model's auto_complete_config); the platform or backend "
        "and Triton's defaults still are",
    )
    strict_readiness: bool = setting(
        False,
        "Triton's --strict-readiness: on, /v2/health/ready says ready only while every model of the repository "
        "is READY; off, once no model is still loading (failed models aside).  Triton's default is on",
    )
    exit_on_error: bool = setting(
        False,
        "Triton's --exit-on-error: on, the server exits (status 1) when a model fails to load at start-up; off, "
        "it serves the others.  Triton's default is on",
    )
    backend_config: tuple[str, ...] = setting(
        (),
        "Triton's --backend-config=<backend>,<setting>=<value> (or <setting>=<value> for all backends), "
        "repeatable: checked and accepted; serve_app's backends are built in and have none of Triton's "
        "backend settings to act on (shared memory sizes, stub timeouts...)",
        repeat=True,
    )
    backend_directory: str = setting(
        "", "Triton's --backend-directory: accepted; serve_app's backends are built in, none is loaded from there"
    )
    cuda_memory_pool_byte_size: tuple[str, ...] = setting(
        (),
        "Triton's --cuda-memory-pool-byte-size=<GPU id>:<bytes>, repeatable: checked and accepted; tensors "
        "between the server and its instances live in host memory, so there is no CUDA pool to size",
        repeat=True,
    )
    allow_client_shm: bool = setting(
        False,
        "Triton's system shared memory extension: clients on the server's host may register POSIX shared memory "
        "regions (/dev/shm) and have inputs read from and outputs written to them.  A client can then make the "
        "server read and write any shared memory object it can name, so turn it on only for trusted local "
        "clients; off, registering a region or naming one in a request is refused",
    )
    tls_cert: str = setting("", "PEM certificate chain: serve HTTP and gRPC over TLS (with tls_key)", path=True)
    tls_key: str = setting("", "PEM private key of tls_cert", path=True)
    tls_ca: str = setting("", "PEM CA bundle that signs client certificates", path=True)
    tls_require_client_cert: bool = setting(False, "mutual TLS: clients must present a certificate signed by tls_ca")
    http_restricted_api: tuple[str, ...] = setting(
        (),
        "Triton's --http-restricted-api, '<category>[,<category>...]:<key>=<value>': those APIs answer only "
        "requests with header <key>: <value>, others get 403 (repeatable; separated by ';' in serve run args)",
        repeat=True,
        sep=";",
        metavar="CATEGORIES:KEY=VALUE",
    )
    grpc_restricted_protocol: tuple[str, ...] = setting(
        (),
        "Triton's --grpc-restricted-protocol: as http_restricted_api, with the metadata key "
        "triton-grpc-protocol-<key>; refused calls get UNAVAILABLE",
        repeat=True,
        sep=";",
        metavar="CATEGORIES:KEY=VALUE",
    )
    max_body_bytes: int = setting(
        DEFAULT_LIMITS.max_body_bytes, "limit: request body bytes (HTTP) and message bytes (gRPC); more: 413"
    )
    max_tensor_elements: int = setting(DEFAULT_LIMITS.max_tensor_elements, "limit: tensor elements in one request")
    max_json_depth: int = setting(
        DEFAULT_LIMITS.max_json_depth,
        "limit: nesting depth of a tensor's JSON data (Triton's 100; the body may nest 4 levels more)",
    )
    max_inputs: int = setting(DEFAULT_LIMITS.max_inputs, "limit: inputs in one request")
    max_outputs: int = setting(DEFAULT_LIMITS.max_outputs, "limit: requested outputs in one request")
    exit_timeout_s: float = setting(
        30.0,
        "on SIGTERM/SIGINT: stop accepting requests (503), then wait this long for those in progress",
        flag="--exit-timeout-secs",
    )
    ray_logs: bool = setting(
        False,
        "print Ray's and Serve's own INFO logs (Ray's start, the Serve controller, deployments and replicas, "
        "each line prefixed with its process); off: they log warnings and errors only, and the server prints "
        "one line per model, its table of models and its ready line",
    )
    trace_config: tuple[str, ...] = setting(
        (),
        "Triton's --trace-config, '[<mode>,]<setting>=<value>': level=OFF|TIMESTAMPS|TENSORS, rate=N (every "
        "N-th request), count=N (-1: no limit), mode=opentelemetry, opentelemetry,url=<host:port/v1/traces> (the "
        "OTLP/HTTP collector), opentelemetry,resource=<key>=<value>, opentelemetry,bsp_max_queue_size=N / "
        "bsp_schedule_delay=MS / bsp_max_export_batch_size=N (repeatable; ';' in serve run args)",
        repeat=True,
        sep=";",
        metavar="[MODE,]SETTING=VALUE",
    )
    metrics_config: tuple[str, ...] = setting(
        (),
        "Triton's --metrics-config, '<setting>=<value>': histogram_latencies=true (the "
        "nv_inference_first_response_histogram_ms histogram; buckets from the model config's model_metrics), "
        "summary_latencies=true (the nv_inference_*_summary_us summaries of the last minute), "
        "summary_quantiles=<q>:<error>,... (default 0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001), "
        "counter_latencies=false (drops the *_duration_us counters) (repeatable)",
        repeat=True,
        sep=";",
        metavar="SETTING=VALUE",
    )
    rate_limit: str = setting(
        "off",
        "Triton's --rate-limit: execution_count makes each execution of a model whose instance groups have a "
        "rate_limiter hold its resources (counted per gateway process) and wait its turn by priority",
        choices=RATE_LIMIT_MODES,
    )
    rate_limit_resource: tuple[str, ...] = setting(
        (),
        "Triton's --rate-limit-resource, '<name>:<count>[:<device>]': units of a rate-limiter resource "
        "(default: the largest count a model needs); the device is accepted and counts as the process's",
        repeat=True,
        metavar="NAME:COUNT[:DEVICE]",
    )
    cache_config: tuple[str, ...] = setting(
        (),
        "Triton's --cache-config, '<cache>,<setting>=<value>': local,size=N keeps up to N bytes of answers for "
        "the models whose config says response_cache { enable: true } (one cache in each gateway process)",
        repeat=True,
        sep=";",
        metavar="CACHE,SETTING=VALUE",
    )
    log_verbose: int = setting(0, "Triton's --log-verbose: a level above 0 logs debug messages too")
    log_info: bool = setting(True, "Triton's --log-info: log info messages")
    log_warning: bool = setting(True, "Triton's --log-warning: log warning messages")
    log_error: bool = setting(True, "Triton's --log-error: log error messages")
    log_format: str = setting("default", "Triton's --log-format: default or ISO8601", choices=("default", "ISO8601"))
    log_file: str = setting("", "Triton's --log-file: write the server's log there instead of stderr", path=True)

    def __post_init__(self) -> None:
        if self.model_control_mode not in CONTROL_MODES:
            raise InvalidArgument(
                f"model_control_mode '{self.model_control_mode}' is not one of {', '.join(CONTROL_MODES)}"
            )
        if not 0 <= self.openai_port <= 65535:
            raise InvalidArgument(f"openai_port {self.openai_port} is not a port number (0: off)")
        if self.repository_poll_secs <= 0:
            raise InvalidArgument("repository_poll_secs must be positive")
        if self.model_load_thread_count < 0 or self.model_load_retry_count < 0:
            raise InvalidArgument("model_load_thread_count and model_load_retry_count must be 0 or more")
        if self.load_on_demand and self.model_control_mode == "none":
            raise InvalidArgument("load_on_demand needs model_control_mode explicit or poll")
        if self.max_loaded_models_per_node < 0 or self.on_demand_wait_s <= 0 or self.on_demand_min_resident_s < 0:
            raise InvalidArgument(
                "max_loaded_models_per_node and on_demand_min_resident_s must be 0 or more, on_demand_wait_s positive"
            )
        if self.model_config_name and (not is_plain_name(self.model_config_name) or self.model_config_name[0] == "."):
            raise InvalidArgument(
                f"model_config_name {self.model_config_name!r} must be a file name (without .pbtxt) of a model's "
                "configs/ directory"
            )
        self.tls()  # a half-given TLS setting fails here, not in the gateway
        self.limits()
        self.restricted_apis()
        self.trace_startup()
        self.log_settings()
        self.backend_settings()
        self.cuda_memory_pools()
        self.metrics_options()
        self.response_cache()
        if self.rate_limit not in RATE_LIMIT_MODES:
            raise InvalidArgument(f"rate_limit '{self.rate_limit}' is not one of {', '.join(RATE_LIMIT_MODES)}")
        self.rate_limit_resources()

    def limits(self) -> RequestLimits:
        """The request limits both front ends enforce."""
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

    def tls(self) -> TlsSettings | None:
        """The TLS settings, or None without a certificate."""
        return optional_tls(self.tls_cert, self.tls_key, self.tls_ca, self.tls_require_client_cert)

    def restricted_apis(self) -> tuple[RestrictedApis, RestrictedApis]:
        """(HTTP, gRPC) restricted APIs, parsed as Triton parses its flags."""
        return (
            RestrictedApis.parse(list(self.http_restricted_api)),
            RestrictedApis.parse(list(self.grpc_restricted_protocol), grpc=True),
        )

    def trace_startup(self) -> TraceStartup:
        """The start-up trace settings (``trace_config`` parsed as Triton parses --trace-config)."""
        return TraceStartup.parse(self.trace_config)

    def backend_settings(self) -> dict[str, dict[str, str]]:
        """``backend_config`` by backend ("" for the settings given to all), parsed as Triton parses it."""
        parsed: dict[str, dict[str, str]] = {}
        for item in self.backend_config:
            comma = item.find(",")
            if comma == 0:
                raise InvalidArgument(
                    "No backend specified. --backend-config option format is <backend name>,<setting>=<value> or "
                    f"<setting>=<value>. Got {item}"
                )
            backend, pair = (item[:comma], item[comma + 1 :]) if comma > 0 else ("", item)
            key, eq, value = pair.partition("=")
            if not eq or not key or not value:
                raise InvalidArgument(
                    f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {item}"
                )
            parsed.setdefault(backend, {})[key] = value
        return parsed

    def cuda_memory_pools(self) -> dict[int, int]:
        """``cuda_memory_pool_byte_size`` by GPU id."""
        pools: dict[int, int] = {}
        for item in self.cuda_memory_pool_byte_size:
            gpu, colon, size = item.partition(":")
            if not colon or not gpu.strip().isdigit() or not size.strip().isdigit():
                raise InvalidArgument(
                    f"--cuda-memory-pool-byte-size option format is '<GPU device ID>:<pool byte size>'. Got {item}"
                )
            pools[int(gpu)] = int(size)
        return pools

    def metrics_options(self) -> MetricsOptions:
        """Which latency metrics the metrics port shows (``metrics_config`` parsed as Triton's --metrics-config)."""
        return MetricsOptions.parse(self.metrics_config)

    def response_cache(self) -> CacheConfig:
        """The response cache (``cache_config`` parsed as Triton's --cache-config)."""
        return CacheConfig.parse(self.cache_config)

    def rate_limit_resources(self) -> dict[str, int] | None:
        """The rate limiter's explicit resource counts, or None when it is off."""
        if self.rate_limit == "off":
            return None
        return parse_resources(self.rate_limit_resource)

    def log_settings(self) -> LogSettings:
        return LogSettings(
            log_file=self.log_file,
            log_info=self.log_info,
            log_warning=self.log_warning,
            log_error=self.log_error,
            log_verbose_level=self.log_verbose,
            log_format=self.log_format,
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
                    values[key] = parse_bool(raw)
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


def setting_fields() -> list[Field[Any]]:
    """The settings, in order, for the CLI and the configuration reference."""
    return list(fields(ServerSettings))


def _names(raw: Any, sep: str = ",") -> tuple[str, ...]:
    """A list, or one string of items separated by ``sep`` (as `serve run key=value` gives it)."""
    items = raw if isinstance(raw, (list, tuple)) else str(raw).split(sep)
    return tuple(str(i).strip() for i in items if str(i).strip())


def parse_bool(raw: Any) -> bool:
    """A boolean as Triton's flags and `serve run` arguments write it."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)
