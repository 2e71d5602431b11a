"""Models for the model control tests: the repository API (explicit mode), poll mode and autoscaling."""

from __future__ import annotations

import pathlib

from scripts import example_models
from tests.e2e.models import slow_identity
from tests.e2e.sequence_models import accumulator

# Explicit mode (the session server): each test owns its model, so the tests don't depend on their order.
TOGGLE = "ctl_toggle"  # unloaded and loaded again over HTTP
GRPC = "ctl_grpc"  # the same over gRPC
OVERRIDE = "ctl_override"  # versions 1 and 2 (the policy serves 2); a config override serves 1
RELOAD = "ctl_reload"  # reloaded with a new config while clients keep sending
UPLOADED = "ctl_uploaded"  # not in the repository: loaded from files sent with the request

# Poll mode (a second server).
POLLED = "poll_grows"  # gets a version 2 while the server runs
REMOVED = "poll_removed"  # its directory is deleted while the server runs
SCALED = "scale_slow"  # autoscaling 1..2 instances, a few hundred ms per execution
SCALED_SEQ = "scale_seq"  # an accumulator sequence model (2 slots per instance) autoscaling 1..2

AUTOSCALING = """parameters { key: "autoscaling.min_replicas" value: { string_value: "1" } }
parameters { key: "autoscaling.max_replicas" value: { string_value: "2" } }
parameters { key: "autoscaling.upscale_delay_s" value: { string_value: "1" } }
parameters { key: "autoscaling.downscale_delay_s" value: { string_value: "4" } }
parameters { key: "autoscaling.metrics_interval_s" value: { string_value: "0.5" } }
parameters { key: "autoscaling.look_back_period_s" value: { string_value: "2" } }
"""


def build_explicit(repo: pathlib.Path) -> None:
    for name in (TOGGLE, GRPC, RELOAD):
        example_models.add_sub(repo, name=name)
    example_models.add_sub(repo, name=OVERRIDE, versions=(1, 2))


def build_poll(repo: pathlib.Path) -> None:
    example_models.add_sub(repo, name=POLLED)
    example_models.add_sub(repo, name=REMOVED)
    slow_identity(repo, SCALED, AUTOSCALING, matmuls=8)
    d = accumulator(repo, SCALED_SEQ, max_batch_size=2, instances=1, idle_us=60_000_000)
    config = d / "config.pbtxt"
    config.write_text(config.read_text() + AUTOSCALING)
