"""The response cache with a stock client: ``cached`` (add_sub with ``response_cache { enable: true }``) on a
server started with ``--cache-config local,size=N`` (room for two answers).  A repeated request is answered
without executing (one miss, one hit, the execution count unchanged); a third distinct answer evicts the
least recently used one, which then executes again.  Inputs are random per run, so no other test's requests
share their answers."""

from __future__ import annotations

import urllib.request

import numpy as np
import tritonclient.http as httpclient

from tests.e2e.conftest import CACHE_ENTRIES, Server

MODEL = "cached"


def inputs(value: float) -> list[httpclient.InferInput]:
    out = []
    for name, data in (("INPUT0", np.full((1, 16), value, np.float32)), ("INPUT1", np.ones((1, 16), np.float32))):
        inp = httpclient.InferInput(name, [1, 16], "FP32")
        inp.set_data_from_numpy(data)
        out.append(inp)
    return out


def figures(client: httpclient.InferenceServerClient) -> tuple[int, int, int, int]:
    """(cache hits, cache misses, executions, successes) of ``cached``."""
    s = client.get_inference_statistics(MODEL, "1")["model_stats"][0]
    inf = s["inference_stats"]
    return inf["cache_hit"]["count"], inf["cache_miss"]["count"], s["execution_count"], inf["success"]["count"]


def test_repeated_requests_are_answered_from_the_cache_within_its_size(server: Server) -> None:
    assert CACHE_ENTRIES == 2
    client = httpclient.InferenceServerClient(server.http_url)
    a, b, c = (float(v) for v in np.random.default_rng().uniform(1, 1000, 3))
    hits, misses, executions, successes = figures(client)

    first = client.infer(MODEL, inputs(a)).as_numpy("OUTPUT0")
    again = client.infer(MODEL, inputs(a)).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(again, np.full((1, 16), a + 1, np.float32))
    assert figures(client) == (hits + 1, misses + 1, executions + 1, successes + 2)

    client.infer(MODEL, inputs(b))  # the cache is full: a, b
    client.infer(MODEL, inputs(c))  # c evicts a, the least recently used
    assert figures(client) == (hits + 1, misses + 3, executions + 3, successes + 4)
    client.infer(MODEL, inputs(a))  # executes again (and evicts b)
    client.infer(MODEL, inputs(c))  # still cached
    assert figures(client) == (hits + 2, misses + 4, executions + 4, successes + 6)

    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        page = r.read().decode()
    assert f'nv_cache_num_hits_per_model{{model="{MODEL}",version="1"}} {hits + 2}' in page
    assert f'nv_cache_num_misses_per_model{{model="{MODEL}",version="1"}} {misses + 4}' in page
    assert 'nv_cache_num_hits_per_model{model="add_sub"' not in page  # only models that enable the cache
    client.close()
