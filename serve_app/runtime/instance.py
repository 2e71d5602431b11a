"""Runs executions on one backend instance and times them.

Everything that can be known at load (signature, dtypes, reshapes) is computed
in ``__init__`` so the per-execution path is short.  The three timings are the
statistics extension's compute_input (preparing the backend's inputs),
compute_infer (the backend itself) and compute_output (checking and shaping
what it produced).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from serve_app.backends import Backend, BackendContext, create_backend
from serve_app.errors import InternalError, as_serve_error
from serve_app.inference import custom_metrics
from serve_app.inference.execution import Execution, ExecutionResult, PartResult
from serve_app.inference.signature import ModelSignature
from serve_app.observability import spans
from serve_app.runtime.warmup import WarmupReport, warm_up


class ModelInstance:
    """One execution instance of one model version (Triton's TritonModelInstance)."""

    def __init__(self, ctx: BackendContext, backend: Backend | None = None) -> None:
        self.ctx = ctx
        self.signature = ModelSignature.from_config(ctx.config, str(ctx.version))
        self.backend = backend if backend is not None else create_backend(ctx)
        sig = self.signature
        self._reshape_in = {n: s.reshape for n, s in sig.inputs.items() if s.reshape is not None}
        self._reshape_out = {n: s.dims for n, s in sig.outputs.items() if s.reshape is not None}
        self._dtypes = {n: s.datatype for n, s in sig.outputs.items() if s.datatype.wire_name != "BYTES"}
        self._batched = sig.max_batch_size > 0
        self.warmup_report: WarmupReport | None = None  # what warm_up() ran (Triton counts it in the statistics)

    def run(self, execution: Execution) -> ExecutionResult:
        """Execute one (possibly merged) batch; a failure is returned, never raised.  Its traced requests get
        a compute span each, recorded here."""
        if execution.traces:
            start = time.time_ns()
            result = self._run(execution)
            timings = {
                "input": result.compute_input_ns,
                "infer": result.compute_infer_ns,
                "output": result.compute_output_ns,
            }
            spans.record_compute(execution.traces, start, timings)
            return result
        return self._run(execution)

    def _run(self, execution: Execution) -> ExecutionResult:
        t0 = time.perf_counter_ns()
        result = ExecutionResult()
        try:
            feed = self._inputs(execution)
            t1 = time.perf_counter_ns()
            result.compute_input_ns = t1 - t0
            if self.backend.per_request:  # each request answered on its own (the Python backend)
                parts = self.backend.execute_parts(feed, execution)
                result.compute_infer_ns = time.perf_counter_ns() - t1
                if execution.parts:
                    result.parts = parts
                elif parts[0].error is not None:
                    result.error = parts[0].error
                else:
                    result.outputs = parts[0].outputs
                return result
            produced = self.backend.execute(feed, list(execution.outputs))
            t2 = time.perf_counter_ns()
            result.compute_infer_ns = t2 - t1
            result.outputs = self._outputs(execution, produced)
            result.compute_output_ns = time.perf_counter_ns() - t2
        except Exception as exc:  # one bad execution must not fail the others
            result.error = as_serve_error(exc)
        return result

    def stream(
        self, execution: Execution, emit: Callable[[int, PartResult], None], cancelled: Callable[[int], bool]
    ) -> None:
        """Start a decoupled execution: its responses go to ``emit`` as the model sends them (any thread)."""
        self.backend.stream(self._inputs(execution), execution, emit, cancelled)

    def warm_up(self, model_dir: Path | None = None) -> WarmupReport:
        """Run the config's ``model_warmup`` samples, in order, through :meth:`run` (Triton warms up every
        instance before it serves).  ``model_dir`` holds ``warmup/`` (default: the version directory's
        parent).  Raises :class:`~serve_app.runtime.warmup.WarmupError`, naming the sample, on a failure."""
        model_dir = model_dir if model_dir is not None else self.ctx.model_file.parent.parent
        self.warmup_report = warm_up(self.ctx.config, self.signature, self.run, model_dir)
        return self.warmup_report

    def run_all(self, executions: list[Execution], arrived_ns: int = 0) -> list[ExecutionResult]:
        """Run ``executions`` one after the other, recording how long each waited (since ``arrived_ns``,
        a ``perf_counter_ns`` reading taken when the call reached the instance, or since now)."""
        start = arrived_ns or time.perf_counter_ns()
        results = []
        for ex in executions:
            waited = time.perf_counter_ns() - start
            res = self.run(ex)
            res.wait_ns = waited
            results.append(res)
        if self.backend.per_request and results:  # a Python model may keep metrics of its own
            results[-1].custom_metrics = custom_metrics.REGISTRY.snapshot()
        return results

    def _inputs(self, execution: Execution) -> dict[str, np.ndarray]:
        if not self._reshape_in:
            return execution.inputs
        feed = dict(execution.inputs)
        for name, shape in self._reshape_in.items():
            arr = feed.get(name)
            if arr is not None:
                lead = (arr.shape[0],) if self._batched else ()
                feed[name] = arr.reshape(lead + tuple(shape))
        return feed

    def _outputs(self, execution: Execution, produced: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sig = self.signature
        out: dict[str, np.ndarray] = {}
        for name in execution.outputs:
            arr = produced.get(name)
            if arr is None:
                raise InternalError(f"model '{sig.name}' did not produce output '{name}'")
            dims = self._reshape_out.get(name)
            if dims is not None:
                lead = (arr.shape[0],) if self._batched else ()
                arr = arr.reshape(lead + tuple(dims))
            dt = self._dtypes.get(name)
            if dt is not None and arr.dtype != dt.numpy:
                raise InternalError(
                    f"model '{sig.name}' output '{name}' has data type {arr.dtype}, config says {dt.config_name}"
                )
            out[name] = arr
        return out

    def close(self) -> None:
        self.backend.close()
