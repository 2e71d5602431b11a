"""What a host is asked to load, and how a batch names the instance that runs it."""

from __future__ import annotations

from dataclasses import dataclass, field

from serve_app.inference.cancel import CancelSignal
from serve_app.inference.execution import Execution
from serve_app.keys import ModelKey
from serve_app.observability.log_settings import LogSettings
from serve_app.placement import InstanceSpec
from serve_app.transport import pickling


@dataclass(frozen=True, slots=True)
class InstanceLoad:
    """One instance group of one model version (one load of it): ``count`` instances in each host.

    Plain data: it crosses from the model manager to the hosts as one pickle.
    """

    key: ModelKey
    config_bytes: bytes
    model_file: str
    kind: str  # KIND_CPU | KIND_GPU | KIND_MODEL
    spec: InstanceSpec = field(default_factory=lambda: InstanceSpec(""))
    count: int = 1
    nodes: tuple[str, ...] = ()  # the addresses of the nodes whose hosts hold it (none: every host of the pool)

    def held_on(self, node: str) -> bool:
        return not self.nodes or node in self.nodes

    @property
    def group(self) -> int:
        return self.spec.group_index or 0

    def instance_key(self, number: int) -> str:
        """``<name>:<version>.<generation>.<group>.<number>``: one instance, the same in every host."""
        return f"{self.key.label}.{self.key.generation}.{self.group}.{number}"


@pickling.register  # every call to a Python model carries one
@dataclass(frozen=True, slots=True)
class ExecuteOn:
    """Gateway to host: run ``executions`` (in order) on instance ``instance``."""

    instance: str
    executions: list[Execution]
    logs: LogSettings | None = None  # the server's log settings, when they changed since this instance last had them

    def cancel_signals(self) -> tuple[CancelSignal | None, ...]:
        """Its requests' cancel signals, execution after execution, which the channel forwards by index."""
        return tuple(part.cancel for execution in self.executions for part in execution.parts)


@dataclass(frozen=True, slots=True)
class StreamOn:
    """Gateway to host: run a decoupled ``execution`` on instance ``instance`` and stream its responses back,
    as (request index, :class:`~serve_app.inference.execution.PartResult`), while the model sends them."""

    instance: str
    execution: Execution
    logs: LogSettings | None = None  # as ExecuteOn's

    def cancel_signals(self) -> tuple[CancelSignal | None, ...]:
        """Its requests' cancel signals, which the channel forwards (by request index)."""
        return tuple(part.cancel for part in self.execution.parts)
