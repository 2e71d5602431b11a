"""Where a model version's executions run: the port the service schedules onto.

Two executors implement it: the Ray gateway's (instances in Serve replicas,
reached over direct channels, or held by the gateway itself) and the
in-process one (``hosting/in_process.py``: the local server's instances, in
its own process, for tests, tools and Ray-free serving).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from serve_app.inference.execution import Execution, ExecutionResult, PartResult
from serve_app.keys import ModelKey
from serve_app.sequence.port import SequencePort


class ModelExecutor(Protocol):
    def capacity(self, key: ModelKey) -> int:
        """How many calls may be in flight to the version's instances at once."""
        ...

    def instances(self, key: ModelKey) -> int:
        """How many instances of the version can take work now (for the metrics)."""
        ...

    async def execute(self, key: ModelKey, executions: list[Execution]) -> list[ExecutionResult]: ...

    def stream(self, key: ModelKey, execution: Execution) -> AsyncGenerator[tuple[int, PartResult], None]:
        """A decoupled execution's responses, (request index, response), as the instance sends them."""
        ...

    def sequence_port(self, key: ModelKey) -> SequencePort:
        """How a sequence model's steps reach the router and its instances."""
        ...
