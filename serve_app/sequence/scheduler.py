"""A sequence model's scheduler in the gateway: route each step to its instance and slot, count it.

Batching for sequence models happens in the instance (its slots are only
visible there); the gateway's part is to find where a sequence lives and send
each step there, in order:

- a START asks the sequence router for a slot (waiting there while the
  sequence is backlogged, for at most the request's ``timeout``, or that of a
  step queued behind it, which the router is told of: then they all fail with
  Triton's backlog-timeout error); the answer is cached, so the other steps of
  the sequence go straight to their instance without asking the router;
- a step whose gateway has no cached place asks the router where its
  sequence is (another gateway may have started it);
- a request its client cancels before it was handed to its instance (waiting
  in the backlog, or behind its sequence's earlier steps) never runs and
  counts as failed with reason CANCELED; a START cancelled in the backlog may
  still be given a slot by the router, which it keeps as any sequence that
  stops sending does;
- an instance that answers "not here" (the sequence ended, timed out, or moved)
  makes the gateway ask the router once more; if the router names the same
  place, the step gets Triton's START-flag error;
- steps of one sequence are handed to the transport in arrival order, so they
  reach their slot's queue in order even when several are in flight;
- with state backup (``config/state_backup.py``), each answer carries its
  sequence's new state, which the gateway passes on to the router before the
  answer leaves; a step that fails with its instance asks the router where
  the sequence was restored and is sent there again (or answered from the
  router, if a snapshot showed it had run).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import OrderedDict
from collections.abc import Callable

from serve_app.config.state_backup import state_backup_enabled
from serve_app.errors import InternalError, InvalidArgument, NotFound, ServeError, Unavailable
from serve_app.inference.options import CorrId, RequestOptions, SequenceFlags
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor
from serve_app.protos import model_config_pb2 as mc
from serve_app.sequence.controls import SequenceControls
from serve_app.sequence.messages import BACKLOG_TIMEOUT, Assignment, Recovery, SequenceStep, StepResult
from serve_app.sequence.port import SequencePort
from serve_app.stats import ModelStats

CACHE_SIZE = 100_000  # cached sequence places per model version (stale entries only cost a router lookup)


class SequenceScheduler:
    def __init__(
        self,
        config: mc.ModelConfig,
        signature: ModelSignature,
        port: SequencePort,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.signature = signature
        self.stats = ModelStats(signature.name, signature.version)
        self.controls = SequenceControls.from_model_config(config)
        self._port = port
        self._clock = clock
        self._all_outputs = tuple(signature.outputs)
        self._batched = signature.max_batch_size > 0
        self._places: OrderedDict[CorrId, Assignment] = OrderedDict()
        # The last step of each sequence on its way to the transport; its result: the START's backlog timeout, if
        # that is how it ended (the steps queued behind it share that fate).
        self._tails: dict[CorrId, asyncio.Future[ServeError | None]] = {}
        self._assigning: dict[CorrId, int] = {}  # sequences whose START waits for the router's answer (how many)
        self._backed_up = state_backup_enabled(config)
        self._recovering: dict[CorrId, tuple[asyncio.Lock, list[int]]] = {}
        self._answered: OrderedDict[CorrId, int] = OrderedDict()  # the step number of each sequence's last answer
        self._sent: set[int] = set()  # step ids of the requests handed to their instance, until answered

    async def submit(self, request: InferRequest, options: RequestOptions, arrival_ns: int) -> InferResponse:
        """Send a validated request to the slot of its sequence and wait for its response."""
        flags = options.sequence
        if flags is None:
            raise InternalError(f"a request to sequence model '{self.signature.name}' came without its sequence flags")
        self.controls.check_corr_id(flags.corr_id)
        outputs = tuple(o.name for o in request.outputs) if request.outputs else self._all_outputs
        step = SequenceStep(
            flags.corr_id,
            0,
            0,
            flags.start,
            flags.end,
            {t.name: t.data for t in request.inputs},
            outputs,
            options.batch_size,
            random.getrandbits(63) | 1,
            request_id=request.id,
            parameters=request.parameters,
        )
        self.stats.pending += 1
        try:
            result, sent_ns = await self._send(flags, step, options.timeout_us)
        except ServeError as exc:
            reason = "REJECTED" if exc.message == BACKLOG_TIMEOUT else "OTHER"
            self.stats.record_failure(reason, self._clock() - arrival_ns, time.time_ns() // 1_000_000)
            raise
        except asyncio.CancelledError:
            if step.step_id not in self._sent:  # it waited (the backlog, or its sequence's earlier steps): never ran
                self.stats.record_failure("CANCELED", self._clock() - arrival_ns, time.time_ns() // 1_000_000)
            raise
        finally:
            self.stats.pending -= 1
            self._sent.discard(step.step_id)
        if result.backup is not None and result.error is None:
            self._port.backup(result.backup)  # before the answer leaves: the router learns it first
            self._answered[flags.corr_id] = result.backup.no
            self._answered.move_to_end(flags.corr_id)
            if len(self._answered) > CACHE_SIZE:
                self._answered.popitem(last=False)
        elif flags.end:
            self._answered.pop(flags.corr_id, None)
        return self._complete(request, result, arrival_ns, sent_ns)

    # -- routing ----------------------------------------------------------------------
    async def _send(self, flags: SequenceFlags, step: SequenceStep, timeout_us: int = 0) -> tuple[StepResult, int]:
        corr = flags.corr_id
        loop = asyncio.get_running_loop()
        previous = self._tails.get(corr)
        gate: asyncio.Future[ServeError | None] = loop.create_future()
        self._tails[corr] = gate
        expired: ServeError | None = None
        try:
            if previous is not None:
                if timeout_us > 0 and not flags.start and corr in self._assigning:
                    self._port.backlog_deadline(corr, timeout_us)  # its timeout bounds the backlog's wait too
                expired = await asyncio.shield(previous)
                if expired is not None and not flags.start:
                    raise Unavailable(expired.message)  # queued behind a START that timed out in the backlog
                expired = None
            try:
                place = await self._place(corr, flags.start, timeout_us)
            except Unavailable as exc:
                if exc.message == BACKLOG_TIMEOUT:
                    expired = exc
                raise
            step.slot, step.slot_token, step.instance = place.slot, place.slot_token, place.instance
            self._sent.add(step.step_id)
            try:
                pending: asyncio.Future[StepResult] | Unavailable = await self._port.dispatch(place, step)
            except Unavailable as exc:
                pending = exc
        finally:
            gate.set_result(expired)
            if self._tails.get(corr) is gate:
                del self._tails[corr]
        sent_ns = self._clock()
        try:
            if isinstance(pending, Unavailable):
                raise pending
            result = await pending
        except Unavailable as exc:
            if self._places.get(corr) == place:  # a step in flight with it may have moved the sequence already
                self._forget(corr)
            if not self._backed_up:
                raise self._lost(corr, exc) from None
            result = await self._recover(flags, step, place)
            if flags.end:
                self._forget(corr)
            return result, sent_ns
        if result.not_here and flags.start:  # not expected: a START's place comes from the router itself
            self._forget(corr)
            raise Unavailable(
                f"sequence {corr} of model '{self.signature.name}' could not start in the slot the "
                "sequence router gave it; send the START again"
            )
        if result.not_here:
            self._forget(corr)
            moved = await self._port.lookup(corr)
            if moved == place:
                raise self._not_started(corr) from None
            result = await self._last_try(corr, moved, step)
        if flags.end:
            self._forget(corr)
        return result, sent_ns

    async def _recover(self, flags: SequenceFlags, step: SequenceStep, failed: Assignment) -> StepResult:
        """The step failed with its instance: go on where the router restored the sequence."""
        corr = flags.corr_id
        lock, users = self._recovering.setdefault(corr, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:  # steps in flight together are sent again in the order they failed
                moved = self._places.get(corr)
                if moved is not None and moved.instance != failed.instance and not flags.start:
                    # A step in flight with this one failed first and went on where the router restored the
                    # sequence: that place holds the state of every step answered since, so this one goes on
                    # there too (the router may not have the other step's backup yet).
                    return await self._last_try(corr, moved, step)
                try:
                    recovery: Recovery | None = await self._port.recover(corr, failed.instance, step.step_id)
                except NotFound as exc:  # the model was unloaded meanwhile
                    raise self._lost(corr, Unavailable(exc.message)) from None
                except ServeError:
                    if not flags.start:
                        raise  # the router's "was lost" (no backup, no slot) or START-flag error
                    recovery = None
                if recovery is not None and recovery.outputs is not None:  # it ran: its answer was backed up
                    self._remember(corr, recovery.assignment)
                    return StepResult(outputs={n: recovery.outputs[n] for n in step.outputs if n in recovery.outputs})
                answered = self._answered.get(corr, 0)
                if recovery is not None and not flags.start and recovery.no < answered:
                    # The state this gateway last passed on never reached the router: running the step on an
                    # older state would silently skip a step the client was answered.
                    raise self._lost(
                        corr,
                        Unavailable(f"its restored state is from step {recovery.no}, its last answer from {answered}"),
                    )
                place = await self._port.assign(corr) if flags.start or recovery is None else recovery.assignment
                return await self._last_try(corr, place, step)
        finally:
            users[0] -= 1
            if not users[0]:
                self._recovering.pop(corr, None)

    async def _last_try(self, corr: CorrId, place: Assignment, step: SequenceStep) -> StepResult:
        """Send ``step`` to the sequence's new ``place``: a broken channel or "not here" there ends the request."""
        self._remember(corr, place)
        pending = await self._dispatch(place, step)
        try:
            result = await pending
        except Unavailable as exc:
            self._forget(corr)
            raise self._lost(corr, exc) from None
        if result.not_here:
            self._forget(corr)
            raise self._not_started(corr)
        return result

    async def _place(self, corr: CorrId, start: bool, timeout_us: int = 0) -> Assignment:
        if start:
            self._assigning[corr] = self._assigning.get(corr, 0) + 1
            try:
                place = await self._port.assign(corr, timeout_us)
            finally:
                self._assigning[corr] -= 1
                if not self._assigning[corr]:
                    del self._assigning[corr]
        else:
            cached = self._places.get(corr)
            place = cached if cached is not None else await self._port.lookup(corr, timeout_us)
        self._remember(corr, place)
        return place

    async def _dispatch(self, place: Assignment, step: SequenceStep) -> asyncio.Future[StepResult]:
        step.slot, step.slot_token, step.instance = place.slot, place.slot_token, place.instance
        try:
            return await self._port.dispatch(place, step)
        except Unavailable as exc:
            self._forget(step.corr_id)
            raise self._lost(step.corr_id, exc) from None

    def _remember(self, corr: CorrId, place: Assignment) -> None:
        self._places[corr] = place
        self._places.move_to_end(corr)
        if len(self._places) > CACHE_SIZE:
            self._places.popitem(last=False)

    def _forget(self, corr: CorrId) -> None:
        self._places.pop(corr, None)

    def _lost(self, corr: CorrId, exc: Unavailable) -> Unavailable:
        return Unavailable(
            f"sequence {corr} of model '{self.signature.name}' was lost: {exc.message}; send its next "
            "request with the START flag to start it again"
        )

    def _not_started(self, corr: CorrId) -> InvalidArgument:
        return InvalidArgument(
            f"inference request for sequence {corr} to model '{self.signature.name}' must specify the "
            "START flag on the first request of the sequence"
        )

    # -- completion ----------------------------------------------------------------------
    def _complete(self, request: InferRequest, result: StepResult, arrival_ns: int, sent_ns: int) -> InferResponse:
        now, now_ms = self._clock(), time.time_ns() // 1_000_000
        ci, cf, co = result.compute_input_ns, result.compute_infer_ns, result.compute_output_ns
        if result.execution_batch:
            self.stats.record_execution(result.execution_batch, ci, cf, co)
        if result.error is not None:
            self.stats.record_failure("BACKEND", now - arrival_ns, now_ms, executed_ns=cf + co)
            raise result.error
        sig = self.signature
        outputs = [
            InferTensor(name, sig.outputs[name].datatype.wire_name, tuple(arr.shape), arr)
            for name, arr in result.outputs.items()
        ]
        queue_ns = sent_ns - arrival_ns + result.queue_ns
        self.stats.record_success(1, now - arrival_ns, queue_ns, ci, cf, co, now_ms)
        return InferResponse(sig.name, sig.version, request.id, outputs)

    @property
    def queued(self) -> int:
        return self.stats.pending

    @property
    def live_sequences(self) -> int:
        """Sequences started here and not ended (as far as this front end knows)."""
        return len(self._places)

    def drained(self) -> bool:
        """Always: steps go straight to their instances, which finish them (or end them on unload)."""
        return True
