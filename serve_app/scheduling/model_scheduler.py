"""One model version's scheduler: queue, batch, dispatch, split, count.

It runs where requests arrive (the gateway), before the hop to the model
instances: a batch is formed only when an instance can take it (at most
``capacity`` calls in flight), merged into one execution, and sent in one
call.  So one Ray hop carries a whole batch, and queueing, priorities, queue
policies and statistics see every request of the model at once, as in Triton's
per-model dynamic batcher.  The decisions themselves are the pure
:class:`~serve_app.scheduling.dynamic_batcher.DynamicBatcher`; this class only
drives it with asyncio and a clock.

- A request whose caller is cancelled (its client cancelled the call or closed
  the connection) while it waits in the queue leaves the queue at once, never
  executes, and counts as failed with reason CANCELED; one already sent to an
  instance runs to its end, and a model that answers request by request (the
  Python backend) sees it cancelled through its request's cancel signal.
- With a response cache (the model's ``response_cache { enable: true }`` and
  the server's ``--cache-config``), a request whose answer is cached is
  answered at once, without queueing or executing; the others' answers are kept.
- With a rate limiter (``--rate-limit execution_count`` and the model's
  ``rate_limiter``), each execution first waits for its model's resources
  (:mod:`~serve_app.scheduling.rate_limiter`) and gives them back when it ends.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from serve_app import datatypes
from serve_app.errors import Cancelled, InternalError, ServeError, Unavailable, as_serve_error
from serve_app.inference.batch import merge_inputs, shape_key, split_outputs, union_outputs
from serve_app.inference.cancel import CancelSignal
from serve_app.inference.execution import FLAG_END, FLAG_START, Execution, ExecutionResult, PartResult, RequestPart
from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor
from serve_app.observability import spans
from serve_app.observability.trace_settings import TraceLink
from serve_app.protos import model_config_pb2 as mc
from serve_app.scheduling.dynamic_batcher import BatchingConfig, DynamicBatcher
from serve_app.scheduling.priority_queue import CANCELLED_MESSAGE, TIMEOUT_MESSAGE, PriorityQueue, QueuedRequest
from serve_app.scheduling.rate_limiter import Needs, RateLimiter
from serve_app.scheduling.response_cache import ResponseCache, cache_key
from serve_app.stats import ModelStats

Dispatch = Callable[[list[Execution]], Awaitable[list[ExecutionResult]]]
Outcome = InferResponse | ServeError


@dataclass(slots=True, eq=False)
class Job:
    request: InferRequest
    batch_size: int  # as validated: 0 when the model does not batch
    arrival_ns: int
    future: asyncio.Future[InferResponse]
    dispatch_ns: int = 0
    outcome: Outcome | None = field(default=None)  # held back when responses must keep their order
    part: RequestPart | None = None  # the request as a backend that answers requests one by one sees it
    trace: TraceLink | None = None  # a traced request's model span, for the instance's compute span
    cache_key: bytes = b""  # its key in the response cache, when the model's answers are cached
    lookup_ns: int = 0  # how long the cache lookup that missed took


class ModelScheduler:
    def __init__(
        self,
        config: mc.ModelConfig,
        signature: ModelSignature,
        dispatch: Dispatch,
        *,
        capacity: int,
        executions_per_call: int = 0,
        max_queued: int = 0,
        per_request: bool = False,
        clock: Callable[[], int] = time.monotonic_ns,
        cache: ResponseCache | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        """``per_request``: the backend answers each request of a batch on its own (the Python backend): an
        execution carries the requests' own tensors, not merged ones.  ``capacity``: calls in flight at once.
        ``executions_per_call``: executions one call may carry (default: 1 with a dynamic batcher, which forms
        a batch per free instance; 64 for the default scheduler, where each request is its own execution and
        several share the hop).
        ``max_queued``: requests it holds before refusing new ones with UNAVAILABLE (0: no bound).
        ``cache``: the response cache that answers this model's repeated requests (None: not cached).
        ``limiter``: the rate limiter whose resources each execution holds (None, or a model whose instance
        groups name no ``rate_limiter``: not limited)."""
        batching = BatchingConfig.from_model_config(config)
        queue: PriorityQueue[Job] = (
            PriorityQueue.from_config(config.dynamic_batching, max_queued)
            if config.HasField("dynamic_batching")
            else PriorityQueue(max_total=max_queued)
        )
        self.batcher: DynamicBatcher[Job] = DynamicBatcher(batching, queue)
        self.signature = signature
        self.stats = ModelStats(signature.name, signature.version)
        self._batched = signature.max_batch_size > 0
        self._per_request = per_request
        self._shape_keys = batching.batches and not per_request  # requests of any shape share a batch
        self._ordered = batching.preserve_ordering
        self._order: deque[Job] = deque()
        self._dispatch = dispatch
        self.capacity = max(1, capacity)
        self._per_call = executions_per_call or (1 if config.HasField("dynamic_batching") else 64)
        self._clock = clock
        self.inflight = 0
        self._all_outputs = tuple(signature.outputs)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._cache = cache
        self._limiter: RateLimiter | None = None
        needs = Needs.from_config(config) if limiter is not None else None
        if limiter is not None and needs is not None:
            self._limiter = limiter
            limiter.register(self, needs)
            self._per_call = 1  # each execution holds the resources on its own, as each waits its own turn
        self._grants = 0  # executions the rate limiter allowed that have not started yet
        self._asked = False  # a request for the next one waits in the rate limiter
        self._in_limiter = False  # calling the rate limiter: a grant it makes now needs no later pump

    # -- admission -------------------------------------------------------------
    async def submit(self, request: InferRequest, options: RequestOptions, arrival_ns: int) -> InferResponse:
        """Queue a validated request and wait for its response."""
        batch_size = options.batch_size
        key = b""
        lookup_ns = 0
        if self._cache is not None:
            start = self._clock()
            key = cache_key(request, self.signature.name, self.signature.version)
            hit = self._cache.lookup(key, request.id)
            lookup_ns = self._clock() - start
            if hit is not None:
                now_ms = time.time_ns() // 1_000_000
                self.stats.record_cache_hit(self._clock() - arrival_ns, start - arrival_ns, lookup_ns, now_ms)
                return hit
        loop = asyncio.get_running_loop()
        job = Job(request, batch_size, arrival_ns, loop.create_future(), trace=spans.current_link())
        job.cache_key, job.lookup_ns = key, lookup_ns
        if self._per_request:
            if request.cancel is None:  # fired when the caller goes away while the request executes
                request.cancel = CancelSignal()
            job.part = request_part(request, options)
        batch_key: object = None
        if self._shape_keys:
            # A request without a batch dimension (shape tensors only) never shares a batch.
            batch_key = shape_key(request, self._batched) if batch_size else object()
        now = self._clock()
        try:
            entry = self.batcher.queue.push(
                job,
                batch_size=batch_size,
                shape_key=batch_key,
                priority=options.priority,
                timeout_us=options.timeout_us,
                now_ns=now,
            )
        except Unavailable:
            self.stats.record_failure("REJECTED", self._clock() - arrival_ns, time.time_ns() // 1_000_000)
            raise
        self.stats.pending += 1
        if self._ordered:
            self._order.append(job)
        self._pump()
        try:
            return await job.future
        except asyncio.CancelledError:
            self._withdraw(job, entry)
            raise

    def _withdraw(self, job: Job, entry: QueuedRequest[Job]) -> None:
        """The caller went away: drop its request if it still waits, and count it as Triton counts a
        cancelled request (failed, reason CANCELED)."""
        if not self.batcher.queue.remove(entry):
            # Already sent to an instance: it runs, its response goes nowhere, and a model that answers
            # request by request sees it cancelled (``request.is_cancelled()``), as in Triton.
            if job.part is not None and job.part.cancel is not None:
                job.part.cancel.fire()
            return
        self.stats.pending -= 1
        self.stats.record_failure("CANCELED", self._clock() - job.arrival_ns, time.time_ns() // 1_000_000)
        if self._ordered:
            self._finish(job, Cancelled(CANCELLED_MESSAGE))  # the responses held behind it may go
        self._pump()  # the batch being gathered may now be complete

    # -- the loop ----------------------------------------------------------------
    def _pump(self) -> None:
        now = self._clock()
        self._reject(self.batcher.queue.expire(now))
        wait = 0
        while self.inflight < self.capacity and len(self.batcher.queue):
            if self._limiter is not None and not self._grants:
                if not self._asked:
                    self._asked = self._in_limiter = True
                    self._limiter.request(self, self._on_grant)  # may grant at once
                    self._in_limiter = False
                if not self._grants:
                    break  # the rate limiter calls back when this model's resources are free
            batches: list[list[QueuedRequest[Job]]] = []
            while len(batches) < self._per_call and len(self.batcher.queue):
                decision = self.batcher.next_batch(now)
                self._reject(decision.rejected)
                if not decision.batch:
                    wait = decision.wait_ns
                    break
                batches.append(decision.batch)
            if not batches:
                break
            if self._limiter is not None:
                self._grants -= 1
            self._launch(batches, now)
        if self._limiter is not None and not len(self.batcher.queue):
            self._give_back()
        if not wait and len(self.batcher.queue):
            wait = self.batcher.expiry_wait_ns(now)  # instances busy: still reject timed-out requests on time
        if wait:
            self._arm(now, wait)

    def _on_grant(self) -> None:
        """The rate limiter allocated this model's resources: launch when the loop next runs (the grant may
        come from inside another scheduler's call)."""
        self._asked = False
        self._grants += 1
        if not self._in_limiter:
            asyncio.get_running_loop().call_soon(self._pump)

    def _give_back(self) -> None:
        """Nothing left to send: grants not used go back, a request still waiting is withdrawn."""
        assert self._limiter is not None
        if self._asked:
            self._limiter.withdraw(self)
            self._asked = False
        while self._grants:
            self._grants -= 1
            self._limiter.release(self)

    def _arm(self, now: int, wait_ns: int) -> None:
        at = now + wait_ns
        if self._timer is not None:
            if self._timer_at <= at and not self._timer.cancelled():
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_later(wait_ns / 1e9, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._pump()

    def _launch(self, batches: list[list[QueuedRequest[Job]]], now: int) -> None:
        executions: list[Execution] = []
        jobs: list[list[Job]] = []
        for batch in batches:
            group = [q.item for q in batch]
            requests = [j.request for j in group]
            for j in group:
                j.dispatch_ns = now
            size = sum(j.batch_size for j in group) if self._batched else 0
            waited = now - min(j.arrival_ns for j in group)  # the oldest request's wait: autoscaling reads it
            outputs = union_outputs(requests, self._all_outputs)
            traces = tuple(j.trace for j in group if j.trace is not None)
            if self._per_request:
                parts = tuple(j.part for j in group if j.part is not None)
                executions.append(Execution({}, outputs, size, max(0, waited), parts, traces))
            else:
                executions.append(Execution(merge_inputs(requests), outputs, size, max(0, waited), traces=traces))
            jobs.append(group)
            self.stats.pending -= len(group)
        self.inflight += 1
        task = asyncio.get_running_loop().create_task(self._run(executions, jobs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, executions: list[Execution], jobs: list[list[Job]]) -> None:
        reason = "BACKEND"
        try:
            results = await self._dispatch(executions)
            if len(results) != len(executions):
                raise RuntimeError(f"instance returned {len(results)} results for {len(executions)} executions")
        except Exception as exc:  # the call failed: every request it carried gets the error
            err = as_serve_error(exc)
            results = [ExecutionResult(error=err) for _ in executions]
            reason = "OTHER"
        finally:
            self.inflight -= 1
            if self._limiter is not None:
                again = bool(len(self.batcher.queue)) and not self._asked and not self._grants
                self._asked = self._asked or again
                self._in_limiter = True
                self._limiter.release(self, self._on_grant if again else None)
                self._in_limiter = False
        # The next batch leaves before this one's answers are written, as Triton's instance takes its next
        # batch while the last one's responses go out: the instance computes while the answers are encoded.
        try:
            if len(self.batcher.queue) or self._limiter is not None:  # nothing waits: nothing to send or arm
                self._pump()
        finally:
            now, now_ms = self._clock(), time.time_ns() // 1_000_000
            for execution, result, group in zip(executions, results, jobs, strict=True):
                self._complete(execution, result, group, reason, now, now_ms)

    # -- completion ---------------------------------------------------------------
    def _complete(
        self, execution: Execution, result: ExecutionResult, group: list[Job], reason: str, now: int, now_ms: int
    ) -> None:
        stats = self.stats
        if result.error is not None:
            executed = result.compute_infer_ns + result.compute_output_ns
            for job in group:
                stats.record_failure(reason, now - job.arrival_ns, now_ms, executed_ns=executed)
                self._finish(job, result.error)
            return
        ci, cf, co = result.compute_input_ns, result.compute_infer_ns, result.compute_output_ns
        stats.record_execution(max(1, execution.batch_size), ci, cf, co)
        if result.parts is not None:
            self._complete_parts(result, group, now, now_ms)
            return
        parts = split_outputs(result.outputs, [j.batch_size for j in group]) if len(group) > 1 else [result.outputs]
        sig = self.signature
        for job, produced in zip(group, parts, strict=True):
            req = job.request
            names = [o.name for o in req.outputs] if req.outputs else self._all_outputs
            outputs = []
            for name in names:
                arr = produced[name]
                outputs.append(InferTensor(name, sig.outputs[name].datatype.wire_name, tuple(arr.shape), arr))
            queue_ns = job.dispatch_ns - job.arrival_ns + result.wait_ns
            stats.record_success(max(1, job.batch_size), now - job.arrival_ns, queue_ns, ci, cf, co, now_ms)
            response = InferResponse(sig.name, sig.version, req.id, outputs)
            self._keep(job, response)
            self._finish(job, response)

    def _complete_parts(self, result: ExecutionResult, group: list[Job], now: int, now_ms: int) -> None:
        """Each request's own answer (a backend that answers requests one by one)."""
        assert result.parts is not None
        if len(result.parts) != len(group):
            err = InternalError(f"model '{self.signature.name}' answered {len(result.parts)} of {len(group)} requests")
            for job in group:
                self.stats.record_failure("BACKEND", now - job.arrival_ns, now_ms)
                self._finish(job, err)
            return
        ci, cf, co = result.compute_input_ns, result.compute_infer_ns, result.compute_output_ns
        sig = self.signature
        for job, part in zip(group, result.parts, strict=True):
            if part.error is not None:
                self.stats.record_failure("BACKEND", now - job.arrival_ns, now_ms, executed_ns=cf)
                self._finish(job, part.error)
                continue
            response = InferResponse(
                sig.name, sig.version, job.request.id, part_outputs(part, job.request, self._all_outputs)
            )
            response.parameters.update(part.parameters)
            queue_ns = job.dispatch_ns - job.arrival_ns + result.wait_ns
            self.stats.record_success(max(1, job.batch_size), now - job.arrival_ns, queue_ns, ci, cf, co, now_ms)
            self._keep(job, response)
            self._finish(job, response)

    def _keep(self, job: Job, response: InferResponse) -> None:
        """A computed answer goes into the cache; the miss is counted as Triton counts it (lookup and insert
        time, unless another request put the same answer there first)."""
        if self._cache is None or not job.cache_key:
            return
        start = self._clock()
        stored = self._cache.insert(job.cache_key, response)
        if stored or job.cache_key not in self._cache:
            self.stats.record_cache_miss(job.lookup_ns + self._clock() - start)

    def _reject(self, rejected: list[QueuedRequest[Job]]) -> None:
        if not rejected:
            return
        now, now_ms = self._clock(), time.time_ns() // 1_000_000
        for q in rejected:
            job = q.item
            self.stats.pending -= 1
            self.stats.record_failure("REJECTED", now - job.arrival_ns, now_ms)
            self._finish(job, Unavailable(TIMEOUT_MESSAGE))

    def _finish(self, job: Job, outcome: Outcome) -> None:
        if not self._ordered:
            _resolve(job.future, outcome)
            return
        job.outcome = outcome
        order = self._order
        while order and order[0].outcome is not None:
            done = order.popleft()
            assert done.outcome is not None  # the loop's condition
            _resolve(done.future, done.outcome)

    @property
    def queued(self) -> int:
        return len(self.batcher.queue)

    def drained(self) -> bool:
        return self.inflight == 0 and len(self.batcher.queue) == 0


def request_part(request: InferRequest, options: RequestOptions) -> RequestPart:
    """A request as a backend that answers requests one by one receives it: its own tensors and metadata."""
    flags = options.sequence
    bits = 0
    if flags is not None:
        bits = (FLAG_START if flags.start else 0) | (FLAG_END if flags.end else 0)
    return RequestPart(
        max(1, options.batch_size),
        tuple(o.name for o in request.outputs),
        request.id,
        request.parameters,
        flags.corr_id if flags is not None else 0,
        bits,
        options.timeout_us,
        {t.name: t.data for t in request.inputs},
        request.cancel,
    )


def part_outputs(part: PartResult, request: InferRequest, all_outputs: tuple[str, ...]) -> list[InferTensor]:
    """A request's outputs from its own answer, in the order it asked for them (those the model produced)."""
    names = [o.name for o in request.outputs] if request.outputs else all_outputs
    out = []
    for name in names:
        arr = part.outputs.get(name)
        if arr is not None:
            out.append(InferTensor(name, datatypes.from_numpy(arr.dtype).wire_name, tuple(arr.shape), arr))
    return out


def _resolve(future: asyncio.Future[InferResponse], outcome: Outcome) -> None:
    if future.done():  # the client went away
        return
    if isinstance(outcome, ServeError):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
