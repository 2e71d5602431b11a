"""The seeded generator: case ``i`` of protocol ``p`` comes from ``Random(f"{seed}:{p}:{i}")`` alone, so any
case replays by its number (``scripts/fuzz --case i --protocols p``)."""

from __future__ import annotations

import random

from tests.support.fuzz.cases import Case
from tests.support.fuzz.grpc_cases import GrpcCases
from tests.support.fuzz.http_cases import HttpCases
from tests.support.fuzz.parity import ParityCases

PROTOCOLS = ("http", "grpc", "parity")


class Generator(HttpCases, GrpcCases, ParityCases):
    """Seeded case generators for one server's models."""

    def case(self, protocol: str, seed: int, index: int) -> Case:
        rng = random.Random(f"{seed}:{protocol}:{index}")
        return getattr(self, protocol)(rng)
