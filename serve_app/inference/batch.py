"""Merge requests into one batch and split the results back: pure numpy.

Requests batch together only when every input's shape past the batch
dimension agrees (:func:`shape_key`), so merging is a concatenation along the
first axis and splitting hands each request a view of its rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from serve_app.inference.types import InferRequest

ShapeKey = tuple[tuple[str, tuple[int, ...]], ...]


def shape_key(request: InferRequest, batched: bool) -> ShapeKey:
    """Input names and shapes without the batch dimension: equal keys may share a batch."""
    skip = 1 if batched else 0
    return tuple((t.name, tuple(t.shape[skip:])) for t in sorted(request.inputs, key=lambda t: t.name))


def merge_inputs(requests: Sequence[InferRequest]) -> dict[str, np.ndarray]:
    """One array per input with the requests' rows in order (no copy for a single request)."""
    first = requests[0]
    if len(requests) == 1:
        return {t.name: t.data for t in first.inputs}
    merged: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(first.inputs):
        parts = []
        for req in requests:
            t = req.inputs[i] if i < len(req.inputs) and req.inputs[i].name == tensor.name else req.input(tensor.name)
            assert t is not None, "requests of one batch share their input names"
            parts.append(t.data)
        merged[tensor.name] = np.concatenate(parts, axis=0)
    return merged


def union_outputs(requests: Sequence[InferRequest], all_outputs: tuple[str, ...]) -> tuple[str, ...]:
    """The outputs to compute for a batch: all of them if any request wants all, else the union in model order."""
    wanted: set[str] = set()
    for req in requests:
        if not req.outputs:
            return all_outputs
        wanted.update(o.name for o in req.outputs)
    return tuple(name for name in all_outputs if name in wanted)


def split_outputs(outputs: dict[str, np.ndarray], sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Each request's rows of every output, as views, in request order."""
    if len(sizes) == 1:
        return [outputs]
    parts: list[dict[str, np.ndarray]] = [{} for _ in sizes]
    for name, arr in outputs.items():
        start = 0
        for i, n in enumerate(sizes):
            parts[i][name] = arr[start : start + n]
            start += n
    return parts
