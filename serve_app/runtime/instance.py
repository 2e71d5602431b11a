"""Turns validated requests into backend executions and responses.

Everything that can be known at load (signature, dtypes, reshapes, default
output list) is computed in ``__init__`` so the per-request path is short.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from serve_app.backends import Backend, BackendContext, create_backend
from serve_app.errors import InternalError, ServeError, as_serve_error
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor


class ModelInstance:
    """One execution instance of one model version (Triton's TritonModelInstance)."""

    def __init__(self, ctx: BackendContext, backend: Backend | None = None) -> None:
        self.ctx = ctx
        self.signature = ModelSignature.from_config(ctx.config, str(ctx.version))
        self.backend = backend if backend is not None else create_backend(ctx)
        self._all_outputs = list(self.signature.outputs)
        self._version = str(ctx.version)

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse | ServeError]:
        """Default scheduler: each request is its own execution, in order."""
        results: list[InferResponse | ServeError] = []
        for req in requests:
            try:
                results.append(self._execute_one(req))
            except Exception as exc:  # one bad execution must not fail the others
                results.append(as_serve_error(exc))
        return results

    def _execute_one(self, req: InferRequest) -> InferResponse:
        sig = self.signature
        feed: dict[str, np.ndarray] = {}
        batched = sig.max_batch_size > 0
        for tensor in req.inputs:
            spec = sig.inputs[tensor.name]
            arr = tensor.data
            if spec.reshape is not None:
                lead = (arr.shape[0],) if batched else ()
                arr = arr.reshape(lead + tuple(spec.reshape))
            feed[tensor.name] = arr
        names = [o.name for o in req.outputs] if req.outputs else self._all_outputs
        produced = self.backend.execute(feed, names)
        outputs: list[InferTensor] = []
        for name in names:
            arr = produced.get(name)
            if arr is None:
                raise InternalError(f"model '{sig.name}' did not produce output '{name}'")
            spec = sig.outputs[name]
            if spec.reshape is not None:
                lead = (arr.shape[0],) if batched else ()
                arr = arr.reshape(lead + tuple(d for d in spec.dims))
            want = spec.datatype.numpy
            if spec.datatype.wire_name != "BYTES" and arr.dtype != want:
                raise InternalError(
                    f"model '{sig.name}' output '{name}' has data type {arr.dtype}, config says "
                    f"{spec.datatype.config_name}"
                )
            outputs.append(InferTensor(name, spec.datatype.wire_name, tuple(arr.shape), arr))
        return InferResponse(sig.name, self._version, req.id, outputs)

    def close(self) -> None:
        self.backend.close()
