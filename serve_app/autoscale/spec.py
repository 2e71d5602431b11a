"""Which models autoscale, between which bounds, towards which load: read from the
model's config parameters, overridden by a server-side file, turned into Serve's
``autoscaling_config``.

In ``config.pbtxt``::

    parameters { key: "autoscaling.max_replicas" value: { string_value: "4" } }
    parameters { key: "autoscaling.target_utilization" value: { string_value: "0.6" } }

In the override file (YAML or JSON; its values win, key by key)::

    my_model: {min_replicas: 2, max_replicas: 8}
    other_model: {enabled: false}

A model autoscales when ``max_replicas`` is given (in either place), unless
``enabled`` is ``false``; ``enabled: true`` without ``max_replicas``, or other
autoscaling keys without it, is an error rather than a silent no-op.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, overload

from serve_app.autoscale.policy import DEFAULT_TARGET_SLOT_UTILIZATION, DEFAULT_TARGET_UTILIZATION, InstanceLoadPolicy
from serve_app.config.pbtxt import config_error
from serve_app.errors import InvalidConfig
from serve_app.protos import model_config_pb2 as mc

PREFIX = "autoscaling."
POLICY_IMPORT_PATH = f"{InstanceLoadPolicy.__module__}:{InstanceLoadPolicy.__qualname__}"

# Serve samples a replica's metrics every min(look_back_period_s * this, metrics_interval_s)
# (ray/serve/_private/replica.py start_metrics_pusher; env RAY_SERVE_AUTOSCALING_METRIC_RECORD_INTERVAL_FACTOR).
SERVE_RECORD_INTERVAL_FACTOR = 0.2

_INT_KEYS = ("min_replicas", "max_replicas", "initial_replicas")
_FLOAT_KEYS = (
    "target_utilization",
    "target_queue_delay_us",
    "target_slot_utilization",
    "upscale_delay_s",
    "downscale_delay_s",
    "metrics_interval_s",
    "look_back_period_s",
)
KEYS = ("enabled", *_INT_KEYS, *_FLOAT_KEYS)


@dataclass(frozen=True, slots=True)
class AutoscalingSpec:
    """One model's autoscaling.  Every replica count is of one deployment (one instance group)."""

    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None  # None: start at min_replicas
    target_utilization: float = DEFAULT_TARGET_UTILIZATION  # fraction of time an instance executes
    target_queue_delay_us: float | None = None  # also scale up when batches wait longer than this
    target_slot_utilization: float = DEFAULT_TARGET_SLOT_UTILIZATION  # sequence models: live / slots
    # A batching server's load moves in seconds and a new instance takes seconds to load, so scale up
    # after 3 s of sustained demand (Serve's 30 s default reacts too late); scale down only after 30 s
    # of slack (Serve's 600 s keeps idle GPUs too long), since a stopped instance costs a reload and, for
    # sequence models, drains its sequences.  Sample every second over a 5 s window: long enough to
    # average out single batches, short enough for the 3 s upscale delay to mean something.
    upscale_delay_s: float = 3.0
    downscale_delay_s: float = 30.0
    metrics_interval_s: float = 1.0
    look_back_period_s: float = 5.0

    @property
    def sample_interval_s(self) -> float:
        """How often Serve samples ``record_autoscaling_stats``: a good ``LoadMeter`` window, so that
        the samples' time-weighted mean over the look-back is the true mean."""
        return min(self.look_back_period_s * SERVE_RECORD_INTERVAL_FACTOR, self.metrics_interval_s)


def autoscaling_spec(
    config: mc.ModelConfig,
    override: Mapping[str, Any] | None = None,
    *,
    path: str = "config.pbtxt",
    override_path: str = "autoscaling override",
) -> AutoscalingSpec | None:
    """The model's autoscaling, or None when it does not autoscale.

    ``override`` (keys without the ``autoscaling.`` prefix) wins over the
    config's parameters key by key.  Errors are ``InvalidConfig`` naming the
    model, the file the value came from (``path`` or ``override_path``) and the
    parameter.
    """
    model = config.name
    given: dict[str, tuple[Any, str]] = {}  # key -> (raw value, file it came from)
    for full in sorted(config.parameters):
        if not full.startswith(PREFIX):
            continue
        key = full[len(PREFIX) :]
        if key not in KEYS:
            raise config_error(model, path, f"parameters: unknown key '{full}' (known: {_known(PREFIX)})")
        given[key] = (config.parameters[full].string_value, path)
    for key, value in (override or {}).items():
        if key not in KEYS:
            raise config_error(model, override_path, f"unknown autoscaling key '{key}' (known: {_known('')})")
        given[key] = (value, override_path)
    return _Reader(model, path, given).spec(config)


def serve_autoscaling_config(spec: AutoscalingSpec, *, sequence: bool) -> dict[str, Any]:
    """Serve's ``autoscaling_config`` deployment option for ``spec``, with our policy and its targets."""
    out: dict[str, Any] = {
        "min_replicas": spec.min_replicas,
        "max_replicas": spec.max_replicas,
        "upscale_delay_s": spec.upscale_delay_s,
        "downscale_delay_s": spec.downscale_delay_s,
        "metrics_interval_s": spec.metrics_interval_s,
        "look_back_period_s": spec.look_back_period_s,
        "aggregation_function": "mean",
        "policy": {
            "policy_function": POLICY_IMPORT_PATH,
            "policy_kwargs": {
                "target_utilization": spec.target_utilization,
                "target_queue_delay_us": spec.target_queue_delay_us,
                "target_slot_utilization": spec.target_slot_utilization,
                "sequence": sequence,
            },
        },
    }
    if spec.initial_replicas is not None:
        out["initial_replicas"] = spec.initial_replicas
    return out


def load_override_file(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """``{model: {key: value}}`` from a YAML or JSON file (``.json`` is read as JSON, anything else as YAML).

    Checks the shape and the key names; the values are checked per model by ``autoscaling_spec``.
    """
    import yaml

    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise InvalidConfig(f"file '{name}': cannot read the autoscaling file: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise InvalidConfig(f"file '{name}': not valid {'JSON' if name.endswith('.json') else 'YAML'}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidConfig(f"file '{name}': expected a mapping of model name to settings, got {type(data).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for model, settings in data.items():
        if not isinstance(model, str):
            raise InvalidConfig(f"file '{name}': model names must be strings, got {model!r}")
        if settings is None:
            settings = {}
        if not isinstance(settings, dict):
            raise InvalidConfig(f"model '{model}', file '{name}': expected a mapping of settings, got {settings!r}")
        for key in settings:
            if key not in KEYS:
                raise InvalidConfig(f"model '{model}', file '{name}': unknown key '{key}' (known: {_known('')})")
        out[model] = dict(settings)
    return out


def _known(prefix: str) -> str:
    return ", ".join(prefix + k for k in KEYS)


class _Reader:
    """Typed values out of the given raw ones, each error naming the file and parameter it came from."""

    def __init__(self, model: str, path: str, given: dict[str, tuple[Any, str]]) -> None:
        self.model = model
        self.path = path
        self.given = given

    def spec(self, config: mc.ModelConfig) -> AutoscalingSpec | None:
        enabled = self._bool("enabled")
        if enabled is False:
            return None
        if "max_replicas" not in self.given:
            others = [k for k in self.given if k != "enabled"]
            if enabled or others:
                key = "enabled" if enabled else others[0]
                raise self._error(key, f"is given without {self._name('max_replicas', key)}, which autoscaling needs")
            return None
        d = AutoscalingSpec()
        s = AutoscalingSpec(
            min_replicas=self._int("min_replicas", d.min_replicas),
            max_replicas=self._int("max_replicas", d.max_replicas),
            initial_replicas=self._int("initial_replicas", None),
            target_utilization=self._fraction("target_utilization", d.target_utilization),
            target_queue_delay_us=self._float("target_queue_delay_us", None),
            target_slot_utilization=self._fraction("target_slot_utilization", d.target_slot_utilization),
            upscale_delay_s=self._float("upscale_delay_s", d.upscale_delay_s),
            downscale_delay_s=self._float("downscale_delay_s", d.downscale_delay_s),
            metrics_interval_s=self._float("metrics_interval_s", d.metrics_interval_s),
            look_back_period_s=self._float("look_back_period_s", d.look_back_period_s),
        )
        self._check(s, config)
        return s

    def _check(self, s: AutoscalingSpec, config: mc.ModelConfig) -> None:
        if s.max_replicas < 1:
            raise self._error("max_replicas", f"must be at least 1, got {s.max_replicas}")
        if s.min_replicas < 1:
            # Instances report the load; with none running nothing reports, and the gateways' queue
            # (the only other sign of demand) is invisible to Serve, so the model would never come back.
            raise self._error(
                "min_replicas",
                f"must be at least 1, got {s.min_replicas} (scaling to zero is not supported: with no instance "
                "running nothing reports the load that would start one)",
            )
        if s.min_replicas > s.max_replicas:
            raise self._error(
                "min_replicas",
                f"({s.min_replicas}) must not exceed {self._name('max_replicas', 'min_replicas')} ({s.max_replicas})",
            )
        if s.initial_replicas is not None and not s.min_replicas <= s.initial_replicas <= s.max_replicas:
            raise self._error(
                "initial_replicas",
                f"({s.initial_replicas}) must lie between min_replicas ({s.min_replicas}) "
                f"and max_replicas ({s.max_replicas})",
            )
        if s.target_queue_delay_us is not None:
            if not s.target_queue_delay_us > 0:
                raise self._error("target_queue_delay_us", f"must be positive, got {s.target_queue_delay_us:g}")
            batcher_delay = _batcher_delay_us(config)
            if s.target_queue_delay_us <= batcher_delay:
                # Batches wait up to the batcher's delay on purpose, even when idle: such a target scales up forever.
                raise self._error(
                    "target_queue_delay_us",
                    f"({s.target_queue_delay_us:g}) must exceed the batcher's max_queue_delay_microseconds "
                    f"({batcher_delay}), which batches wait on purpose",
                )
        for key in ("upscale_delay_s", "downscale_delay_s"):
            if getattr(s, key) < 0:
                raise self._error(key, f"must not be negative, got {getattr(s, key):g}")
        if not s.metrics_interval_s > 0:
            raise self._error("metrics_interval_s", f"must be positive, got {s.metrics_interval_s:g}")
        if not s.look_back_period_s > s.metrics_interval_s:
            raise self._error(
                "look_back_period_s",
                f"({s.look_back_period_s:g}) must be longer than metrics_interval_s ({s.metrics_interval_s:g})",
            )

    def _error(self, key: str, detail: str) -> InvalidConfig:
        return config_error(self.model, self._source(key), f"{self._name(key)} {detail}")

    def _source(self, key: str, near: str | None = None) -> str:
        """The file ``key``'s value came from; for a key not given, the file of ``near``."""
        if key in self.given:
            return self.given[key][1]
        return self.given[near][1] if near in self.given else self.path

    def _name(self, key: str, near: str | None = None) -> str:
        """``key`` as written in its file (the config's keys carry the prefix), and the file when it
        is not the one of ``near``, the key the message is about."""
        source = self._source(key, near)
        name = f"parameter '{PREFIX}{key}'" if source == self.path else f"'{key}'"
        if near is not None and source != self._source(near):
            name += f" (in '{source}')"
        return name

    def _raw(self, key: str) -> Any:
        value, _ = self.given.get(key, (None, None))
        return value.strip() if isinstance(value, str) else value

    def _bool(self, key: str) -> bool | None:
        raw = self._raw(key)
        if raw is None:
            return None
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise self._error(key, f"must be true or false, got {raw!r}")

    @overload
    def _float(self, key: str, default: float) -> float: ...
    @overload
    def _float(self, key: str, default: None) -> float | None: ...
    def _float(self, key: str, default: float | None) -> float | None:
        raw = self._raw(key)
        if raw is None:
            return default
        value: float | None = None
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            value = float(raw)
        elif isinstance(raw, str):
            try:
                value = float(raw)
            except ValueError:
                value = None
        if value is None or not math.isfinite(value):
            raise self._error(key, f"must be a number, got {raw!r}")
        return value

    def _fraction(self, key: str, default: float) -> float:
        value = self._float(key, default)
        assert value is not None
        if not 0 < value <= 1:
            raise self._error(key, f"must be in (0, 1], got {value:g}")
        return value

    @overload
    def _int(self, key: str, default: int) -> int: ...
    @overload
    def _int(self, key: str, default: None) -> int | None: ...
    def _int(self, key: str, default: int | None) -> int | None:
        raw = self._raw(key)
        if raw is None:
            return default
        value: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        elif isinstance(raw, float) and raw.is_integer():
            value = int(raw)
        elif isinstance(raw, str):
            try:
                value = int(raw)
            except ValueError:
                value = None
        if value is None:
            raise self._error(key, f"must be an integer, got {raw!r}")
        return value


def _batcher_delay_us(config: mc.ModelConfig) -> int:
    """How long the model's batcher may hold a batch back on purpose, in microseconds."""
    if config.HasField("dynamic_batching"):
        return config.dynamic_batching.max_queue_delay_microseconds
    if config.HasField("sequence_batching"):
        sb = config.sequence_batching
        strategy = sb.oldest if sb.HasField("oldest") else sb.direct
        return strategy.max_queue_delay_microseconds
    return 0
