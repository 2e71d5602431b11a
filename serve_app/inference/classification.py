"""Triton's classification extension: an output asked for with ``classification: k`` comes back as its top k.

Each class is the string ``"<value>:<index>:<label>"`` (``"<value>:<index>"``
when the output has no ``label_filename``), with the value printed the way
C++'s ``std::to_string`` prints it (``%f`` for floating point, ``%d`` for
integers), highest value first.  The result is a BYTES tensor of shape
``[batch, min(k, classes)]`` for a batching model (each batch row is classified
on its own, flattened), ``[min(k, classes)]`` otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from serve_app.errors import InvalidArgument
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor

PARAM = "classification"


def classification_count(request: InferRequest, sig: ModelSignature) -> dict[str, int]:
    """The outputs the request wants classified, with their k; checked before the request is queued."""
    wanted: dict[str, int] = {}
    for out in request.outputs:
        if PARAM not in out.parameters:
            continue
        k = out.parameters[PARAM]
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidArgument(
                f"parameter 'classification' of output '{out.name}' for model '{sig.name}' must be a positive "
                f"integer, got {k!r}"
            )
        spec = sig.outputs.get(out.name)
        if spec is not None and spec.datatype.wire_name == "BYTES":
            raise InvalidArgument(
                f"class result not available for output '{out.name}' of model '{sig.name}' due to non-numeric type "
                "'BYTES'"
            )
        wanted[out.name] = k
    return wanted


def _format(value: np.generic, floating: bool) -> str:
    return f"{float(value):f}" if floating else str(int(value))


def classify(data: np.ndarray, k: int, labels: Sequence[str], batched: bool) -> np.ndarray:
    """The top ``k`` classes of ``data`` as a BYTES (object) array."""
    rows = data.reshape(data.shape[0], -1) if batched and data.ndim else data.reshape(1, -1)
    floating = np.issubdtype(data.dtype, np.floating)
    n = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], n), dtype=np.object_)
    for r, row in enumerate(rows):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:n]
        for j, idx in enumerate(order):
            text = f"{_format(row[idx], floating)}:{int(idx)}"
            if int(idx) < len(labels):
                text += f":{labels[int(idx)]}"
            out[r, j] = text.encode()
    return out if batched else out.reshape(n)


def apply_classification(
    response: InferResponse, wanted: Mapping[str, int], labels: Mapping[str, Sequence[str]], batched: bool
) -> None:
    """Replace each classified output of ``response`` with its top-k strings, in place."""
    for i, t in enumerate(response.outputs):
        k = wanted.get(t.name)
        if k is None:
            continue
        data = classify(t.data, k, labels.get(t.name, ()), batched)
        response.outputs[i] = InferTensor(t.name, "BYTES", tuple(data.shape), data, t.parameters)
