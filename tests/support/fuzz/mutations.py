"""Valid requests and the mutations that break them, the same for both protocols: the per-protocol
generators start from these, so that an HTTP and a gRPC case share their mistakes."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from typing import Any

from serve_app.limits import RequestLimits
from tests.support.fuzz.cases import (
    DATATYPES,
    INT_RANGES,
    NUMPY_ITEMSIZE,
    REQUEST_KEYS,
    SEQUENCE_KEYS,
    Request,
    Tensor,
    junk,
    odd_name,
    odd_version,
)
from tests.support.fuzz.discovery import ModelInfo


class RequestGenerator:
    """Valid requests for one server's models, and the mutations that break them."""

    def __init__(self, models: list[ModelInfo], limits: RequestLimits, *, remote: bool) -> None:
        self.models = models
        self.ready = [m for m in models if m.ready and m.inputs]
        self.limits = limits
        self.remote = remote
        self.served = {m.name for m in models}

    # -- valid requests, the starting point of every mutation
    def values(self, rng: random.Random, datatype: str, n: int) -> list[Any]:
        if datatype == "BOOL":
            return [rng.random() < 0.5 for _ in range(n)]
        if datatype in INT_RANGES:
            lo, hi = INT_RANGES[datatype]
            return [rng.randint(max(lo, -100), min(hi, 100)) for _ in range(n)]
        if datatype == "BYTES":
            return [rng.choice(["", "a", "héllo", "12", "x" * 20]) for _ in range(n)]
        return [round(rng.uniform(-10, 10), 3) for _ in range(n)]

    def valid(self, rng: random.Random, model: ModelInfo) -> Request:
        batch = 1 if model.sequence else rng.randint(1, max(1, min(model.max_batch_size, 4)))
        inputs = []
        for t in model.inputs:
            shape = [rng.randint(1, 3) if d < 0 else d for d in t.shape]
            if model.max_batch_size > 0 and shape:
                shape[0] = batch
            n = math.prod(shape)
            if n <= 4096:
                inputs.append(Tensor(t.name, t.datatype, shape, self.values(rng, t.datatype, n)))
            else:  # a big tensor (a served model's image, say) goes as bytes: lists would stall the event loop
                size = NUMPY_ITEMSIZE.get(t.datatype, 4) * n
                inputs.append(Tensor(t.name, t.datatype, shape, [], raw=bytes(size)))
        req = Request(model.name, id=rng.choice(["", "req-1", "ü"]), inputs=inputs)
        if model.outputs and rng.random() < 0.4:
            req.outputs = [(o.name, {}) for o in rng.sample(model.outputs, rng.randint(1, len(model.outputs)))]
        if model.sequence:
            corr: Any = f"s{rng.getrandbits(40)}" if model.string_corrid else rng.randint(1, 2**63)
            req.parameters.update(sequence_id=corr, sequence_start=True, sequence_end=True)
        return req

    def maybe_unavailable(self, req: Request) -> bool:
        """Whether 503 is a right answer: the request names a model that is not ready, or sets a queue
        timeout (one that expires is answered 503, as in Triton)."""
        return req.model not in {m.name for m in self.ready} or "timeout" in req.parameters

    def model(self, rng: random.Random) -> ModelInfo:
        if self.models and rng.random() < 0.05:
            return rng.choice(self.models)  # the not-ready ones too
        return rng.choice(self.ready)

    # -- mutations of a request, the same for both protocols
    def mutate(self, rng: random.Random, model: ModelInfo, req: Request) -> str:
        """Change ``req`` into a (most likely) invalid request; returns what was changed."""
        t = rng.choice(req.inputs) if req.inputs else None

        def datatype() -> None:
            if t:
                t.datatype = rng.choice([*DATATYPES, "FLOAT", "fp32", "", "TYPE_FP32", "STRING"])

        def shape() -> None:
            if not t:
                return
            choice = rng.randrange(7)
            if choice == 0:
                if t.shape:
                    t.shape[rng.randrange(len(t.shape))] = rng.choice([-1, -5, -(2**63)])
                else:
                    t.shape = [-1]
            elif choice == 1:
                t.shape = [rng.choice([2**31, 2**40, 2**62, 2**63 - 1]) for _ in range(rng.randint(1, 3))]
            elif choice == 2:
                t.shape = [*t.shape, rng.randint(0, 3)]
            elif choice == 3:
                t.shape = t.shape[:-1]
            elif choice == 4:
                t.shape = [0, *t.shape[1:]]
            elif choice == 5:
                t.shape = [1] * rng.choice([16, 70, 300])
            else:
                t.shape = [2**62, 0, 2**62]

        def count() -> None:
            if t:
                n = len(t.values)
                t.values = t.values[: max(0, n - rng.randint(1, 3))] if rng.random() < 0.5 else t.values * 2 + t.values

        def name() -> None:
            if not t:
                return
            r = rng.random()
            if r < 0.3:
                t.name = rng.choice(["", "INPUT9", "input0", "é", " INPUT0"])
            elif r < 0.6:
                req.inputs.append(dataclasses.replace(t, values=list(t.values), shape=list(t.shape)))
            else:
                req.inputs.remove(t)

        def params() -> None:
            key = rng.choice([*REQUEST_KEYS, "triton_x", "custom", "binary_data_size"])
            value = junk(rng)
            if isinstance(value, (list, dict)) or value is None:
                value = rng.choice([1.5, "x", -1, True])
            req.parameters[key] = value

        def sequence() -> None:
            key = rng.choice(SEQUENCE_KEYS)
            req.parameters[key] = rng.choice(
                [True, False, 0, -1, 1, 2**63, 2**64 - 1, 1.0, 0.5, "", "1", "true", "s1", -(2**63)]
            )
            if req.parameters.get("sequence_start") is True:
                req.parameters["sequence_end"] = True  # never leave a sequence holding a slot

        def outputs() -> None:
            names = [o.name for o in model.outputs] or ["OUTPUT0"]
            name_ = rng.choice([*names, "NOPE", ""])
            params_: dict[str, Any] = {}
            if rng.random() < 0.6:
                params_["classification"] = rng.choice([0, -1, 1, 3, 2**40, 2**63, 1.5, "2", True])
            req.outputs.append((name_, params_))
            if rng.random() < 0.3:
                req.outputs.append((name_, {}))

        def batch() -> None:
            if t and t.shape and model.max_batch_size > 0:
                t.shape[0] = rng.choice([model.max_batch_size + 1, 0, 2**20])
                n = math.prod(t.shape)
                if n <= 4096:  # else leave the data short: generating it would stall the event loop
                    t.values = self.values(rng, t.datatype if t.datatype in DATATYPES else "FP32", n)

        def scheduling() -> None:
            key = rng.choice(["priority", "timeout"])
            req.parameters[key] = rng.choice([0, 1, 2, 3, 100, 2**63 - 1, 2**64 - 1, -1, 1.5, "1", True])

        def where() -> None:
            if rng.random() < 0.5:
                req.model = odd_name(rng, self.models)
            else:
                req.version = odd_version(rng)

        def limits() -> None:
            lim = self.limits
            r = rng.random()
            if r < 0.4 and t:
                t.shape = [lim.max_tensor_elements + 1]
                t.values = []
                t.raw = b""
            elif r < 0.7:
                extra = lim.max_inputs + 1 - len(req.inputs)
                req.inputs += [Tensor(f"X{i}", "BOOL", [0], []) for i in range(extra)]
            else:
                req.outputs += [(f"O{i}", {}) for i in range(lim.max_outputs + 1)]

        def bad_values() -> None:
            if t and t.values:
                i = rng.randrange(len(t.values))
                if t.datatype in INT_RANGES:
                    lo, hi = INT_RANGES[t.datatype]
                    t.values[i] = rng.choice([lo - 1, hi + 1, 2**64, 1.5, True, "1", None])
                else:
                    t.values[i] = rng.choice([None, "x", [], {}, 10**400, 1e308, True, 2**70])

        ops: list[tuple[str, Callable[[], None]]] = [
            ("datatype", datatype),
            ("shape", shape),
            ("count", count),
            ("name", name),
            ("params", params),
            ("sequence", sequence),
            ("outputs", outputs),
            ("batch", batch),
            ("where", where),
            ("limits", limits),
            ("values", bad_values),
            ("scheduling", scheduling),
        ]
        weights = [3, 4, 3, 3, 3, 4 if model.sequence else 1, 3, 2, 2, 1, 3, 2]
        label, op = rng.choices(ops, weights)[0]
        op()
        return label
