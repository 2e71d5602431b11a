"""Parity cases: one mutated request sent over both protocols, which must get the same status and message.
Only what both wires can carry is sent, so that a difference is the server's."""

from __future__ import annotations

import random
from typing import Any

from tests.support.fuzz.cases import GrpcCase, ParityCase, utf8
from tests.support.fuzz.mutations import RequestGenerator
from tests.support.fuzz.wire import grpc_message, http_case, http_doc


class ParityCases(RequestGenerator):
    """The same request over both protocols."""

    def parity(self, rng: random.Random) -> ParityCase:
        model = rng.choice(self.ready)
        req = self.valid(rng, model)
        label = self.mutate(rng, model, req)
        if not req.model or "/" in req.model or req.model in (".", ".."):  # no HTTP route can name these
            req.model = "no_such_model"
        for t in req.inputs:  # what both wires can carry: string names and types, int64 dims
            t.name, t.datatype = utf8(str(t.name)), utf8(str(t.datatype))
            t.shape = [d for d in t.shape if isinstance(d, int) and -(2**63) <= d < 2**63]
        req.outputs = [(utf8(str(n)), p) for n, p in req.outputs]
        # binary_data_output is HTTP's alone: gRPC ignores it, as Triton does; reserved 'triton_' keys are
        # judged differently by each front end, as in Triton (gRPC accepts triton_enable_empty_final_response)
        req.parameters = {
            k: utf8(v) if isinstance(v, str) else v
            for k, v in req.parameters.items()
            if isinstance(v, (bool, int, float, str))
            and k != "binary_data_output"
            and not str(k).startswith("triton_")
            and representable(k, v)
        }
        doc, tail = http_doc(req, set(range(len(req.inputs))))
        http = http_case("parity." + label, req, doc, tail, self.maybe_unavailable(req))
        grpc_ = GrpcCase("parity." + label, "ModelInfer", [grpc_message(req, raw=True).SerializeToString()])
        grpc_.unavailable_ok = http.unavailable_ok
        return ParityCase("parity." + label, http, grpc_)


def representable(key: str, value: Any) -> bool:
    """Whether both wires carry ``value`` alike: gRPC has 64-bit integers only, and reads a negative
    int64 ``sequence_id`` as the uint64 with the same bits (as Triton does), which HTTP refuses."""
    if type(value) is not int:
        return True
    return 0 <= value < 2**64 if key == "sequence_id" else -(2**63) <= value < 2**64
