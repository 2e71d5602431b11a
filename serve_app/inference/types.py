"""The request/response model shared by both front ends and every backend.

Front ends decode wire messages into these; the gateway validates them once
(:mod:`serve_app.inference.validate`) and sends them, numpy arrays and all, to a
model replica.  Arrays are usually zero-copy views of the request bytes
(read-only); a backend that writes must copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from serve_app.errors import ServeError
from serve_app.inference.cancel import CancelSignal

ParamValue = bool | int | float | str


@dataclass(slots=True)
class InferTensor:
    """A named tensor.  ``data`` has ``shape``; BYTES is an object array of ``bytes``."""

    name: str
    datatype: str  # v2 wire name, e.g. "FP32"
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, ParamValue] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for; ``parameters`` carries wire hints such as
    ``binary_data`` and ``classification``."""

    name: str
    parameters: dict[str, ParamValue] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""  # "" lets the version policy choose
    id: str = ""
    inputs: list[InferTensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)  # empty = all
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    # Fired to cancel the request while its responses keep coming (a BLS ``ResponseIterator.cancel()``).
    cancel: CancelSignal | None = field(default=None, compare=False, repr=False)

    def input(self, name: str) -> InferTensor | None:
        for t in self.inputs:
            if t.name == name:
                return t
        return None


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str = ""
    outputs: list[InferTensor] = field(default_factory=list)
    parameters: dict[str, ParamValue] = field(default_factory=dict)


@dataclass(slots=True)
class StreamItem:
    """One response of a decoupled model's request, as it comes: a response, or an error, or (``response``
    None, no error) the final flag alone; ``final`` marks the request's last one."""

    response: InferResponse | None = None
    error: ServeError | None = None
    final: bool = False
