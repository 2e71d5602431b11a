"""Triton's response cache: a repeated request to a model that enables it is answered from memory.

The key is Triton's (the model's name and version, then each input in name order: its name and its raw
bytes), with the inputs' data types and shapes and the requested outputs (with their classification
counts) added, so that a hit never answers a different question (Triton's key leaves them out).  The
cache holds at most ``size`` bytes of output data; the least recently used entries make room, and an
answer larger than the whole cache is not kept.  One cache serves every model of a gateway process.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import replace

import numpy as np

from serve_app.inference.types import InferRequest, InferResponse

ENTRY_OVERHEAD = 64  # bytes counted per entry beyond its tensors (the key and bookkeeping)


def cache_key(request: InferRequest, model: str, version: str) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    _field(h, model.encode())
    _field(h, version.encode())
    for tensor in sorted(request.inputs, key=lambda t: t.name):
        _field(h, tensor.name.encode())
        _field(h, tensor.datatype.encode())
        _field(h, repr(tuple(tensor.shape)).encode())
        data = tensor.data
        if isinstance(data, np.ndarray) and data.dtype == object:  # BYTES: each element, length first
            for item in data.flat:
                _field(h, item if isinstance(item, bytes) else str(item).encode())
        else:
            _field(h, np.ascontiguousarray(data).tobytes())
    for out in sorted(request.outputs, key=lambda o: o.name):
        _field(h, f"{out.name}:{out.parameters.get('classification', 0)}".encode())
    return h.digest()


def _field(h: hashlib.blake2b, data: bytes) -> None:
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


def response_size(response: InferResponse) -> int:
    size = ENTRY_OVERHEAD
    for t in response.outputs:
        data = t.data
        if isinstance(data, np.ndarray) and data.dtype == object:
            size += sum(len(x) if isinstance(x, (bytes, str)) else 8 for x in data.flat)
        else:
            size += int(getattr(data, "nbytes", 0))
    return size


class ResponseCache:
    def __init__(self, size_bytes: int) -> None:
        self.size_bytes = size_bytes
        self.used = 0
        self._entries: OrderedDict[bytes, tuple[InferResponse, int]] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def lookup(self, key: bytes, request_id: str) -> InferResponse | None:
        """The cached answer, as a response to the request ``request_id`` (None on a miss)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        cached = entry[0]
        return replace(cached, id=request_id, outputs=list(cached.outputs), parameters=dict(cached.parameters))

    def insert(self, key: bytes, response: InferResponse) -> bool:
        """Keep ``response`` (a copy of its lists: the caller may change its own); False when it is larger
        than the whole cache or already there."""
        if key in self._entries:
            return False
        size = response_size(response)
        if size > self.size_bytes:
            return False
        while self.used + size > self.size_bytes:
            _, (_, freed) = self._entries.popitem(last=False)
            self.used -= freed
            self.evictions += 1
        kept = replace(response, outputs=list(response.outputs), parameters=dict(response.parameters))
        self._entries[key] = (kept, size)
        self.used += size
        return True
