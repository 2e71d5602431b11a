"""Per-model autoscaling driven by the instances' own load.

Gateways reach instances over the direct channel, so Serve's request counts
can't see the traffic: each instance measures its load (``LoadMeter``) and
reports it as Serve custom metrics, and ``InstanceLoadPolicy`` turns the
reports into a replica count within the model's ``AutoscalingSpec``.
"""

from serve_app.autoscale.load_meter import (
    BACKLOG,
    BUSY,
    LIVE_SEQUENCES,
    METRIC_NAMES,
    QUEUE_DELAY_US,
    SLOTS,
    LoadMeter,
)
from serve_app.autoscale.policy import InstanceLoadPolicy, desired_replicas
from serve_app.autoscale.spec import (
    POLICY_IMPORT_PATH,
    AutoscalingSpec,
    autoscaling_spec,
    load_override_file,
    serve_autoscaling_config,
)

__all__ = [
    "BACKLOG",
    "BUSY",
    "LIVE_SEQUENCES",
    "METRIC_NAMES",
    "POLICY_IMPORT_PATH",
    "QUEUE_DELAY_US",
    "SLOTS",
    "AutoscalingSpec",
    "InstanceLoadPolicy",
    "LoadMeter",
    "autoscaling_spec",
    "desired_replicas",
    "load_override_file",
    "serve_autoscaling_config",
]
