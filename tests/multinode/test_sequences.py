"""Sequences keep their slot whichever gateway each step goes through (direct and oldest, implicit state)."""

from __future__ import annotations

import itertools

import pytest

from tests.multinode import clients
from tests.multinode.conftest import MultiNode

SEQUENCES = 4
STEPS = 6


@pytest.mark.parametrize("model", ["seq_accum", "seq_oldest"])
def test_steps_through_every_gateway_keep_their_state(multinode: MultiNode, model: str) -> None:
    gateways = [
        c for n in multinode.nodes for c in (clients.http(n.address), clients.grpc(n.address))
    ]  # each step through the next one: every node, both protocols
    turn = itertools.cycle(gateways)
    base = 7_000 if model == "seq_accum" else 8_000
    sums = dict.fromkeys(range(base, base + SEQUENCES), 0)
    wrong = []
    for k in range(STEPS):
        for sid in sums:
            value = sid - base + 1 + k
            sums[sid] += value
            out, corrid = clients.step(next(turn), model, value, sid, start=k == 0, end=k == STEPS - 1)
            if out != sums[sid] or corrid not in (-1, sid):
                wrong.append((sid, k, out, sums[sid], corrid))
    assert not wrong, f"steps answered with another sequence's state: {wrong}"
