"""Trace and log settings on Ray: one owner (the model manager), applied in every gateway replica.

Several gateway replicas serve one set of ports, and a settings request reaches one of them; what
it changes must hold for all.  The gateway checks the request (Triton's errors), then hands the
change to the model manager (:class:`ManagerDiagnostics`), which records it after the changes before
it (:class:`~serve_app.observability.diagnostics.DiagnosticsLog`) and pushes the record to every gateway
replica, waiting for them, before the request is answered.  A gateway applies the changes it has not
applied yet, in order, so each one's settings (and sampling counters) evolve as Triton's do; one that
starts later, or missed a push, takes the record when it starts and again with each state poll.  A
model manager that Serve restarts starts a new record: running gateways keep their settings and
apply the new record's changes over them; a gateway that starts after that has lost the older ones.
"""

from __future__ import annotations

import logging
from typing import Any

from ray import serve

from serve_app.observability.diagnostics import DiagnosticsLog
from serve_app.observability.log_settings import LogSettings
from serve_app.observability.trace_settings import NewSetting
from serve_app.settings import ServerSettings

logger = logging.getLogger("ray.serve")

Record = tuple[int, tuple[tuple[str, NewSetting], ...], LogSettings]


class ManagerDiagnostics:
    """A gateway's :class:`~serve_app.observability.diagnostics.DiagnosticsControl`: changes go through the manager."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager

    async def update_trace(self, model: str, new: NewSetting) -> None:
        await self._manager.update_trace.remote(model, new)

    async def update_logs(self, settings: LogSettings) -> None:
        await self._manager.update_logs.remote(settings)


class DiagnosticsOwner:
    """The model manager's part: the record of changes, and its push to the gateways."""

    def __init__(self, settings: ServerSettings) -> None:
        self._app = settings.app_name
        self.log = DiagnosticsLog(settings.trace_startup(), settings.log_settings())

    def record(self) -> Record:
        return self.log.snapshot()

    async def update_trace(self, model: str, new: NewSetting) -> None:
        self.log.record_trace(model, new)
        await self._push()

    async def update_logs(self, settings: LogSettings) -> None:
        self.log.logs = settings
        await self._push()

    async def _push(self) -> None:
        try:
            handle = serve.get_deployment_handle("gateway", self._app)
            call = handle.broadcast("apply_diagnostics", *self.log.snapshot())
            answers = await call.results_async(return_exceptions=True)
        except Exception as exc:
            answers = [exc]
        for answer in answers:
            if isinstance(answer, BaseException):
                logger.info("a gateway did not take the trace or log settings now (it pulls them later): %s", answer)
