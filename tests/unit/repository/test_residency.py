"""Residency: the load-on-demand budget, LRU eviction and what is never evicted, on a fake clock."""

from __future__ import annotations

from serve_app.repository.residency import RETRY_S, Admission, Residency, Usage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def residency(budget: int = 2, min_resident_s: float = 10.0, max_loads: int = 4) -> tuple[Residency, Clock]:
    clock = Clock()
    return Residency(budget, min_resident_s, max_loads, clock), clock


def test_no_budget_admits_everything_up_to_the_loads_at_once() -> None:
    r, clock = residency(budget=0, max_loads=2)
    assert r.admit([("a", 1), ("b", 1), ("c", 1)], {}) == Admission(["a", "b"], [], clock.now + RETRY_S)


def test_room_left_loads_without_evicting() -> None:
    r, _ = residency()
    r.loaded("a", pinned=False)
    assert r.admit([("b", 1)], {}) == Admission(["b"])


def test_the_least_recently_used_goes_first() -> None:
    r, clock = residency()
    r.loaded("a", pinned=False)
    r.loaded("b", pinned=False)
    clock.now += 100
    r.touch("a")  # b is now the least recently used
    assert r.admit([("c", 1)], {}).evict == ["b"]
    clock.now += 1
    # the gateways saw a request for b later than a's
    assert r.admit([("c", 1)], {"b": Usage(last_used=clock.now)}).evict == ["a"]


def test_a_just_loaded_model_stays_its_minimum_time() -> None:
    r, clock = residency(budget=1, min_resident_s=30.0)
    r.loaded("a", pinned=False)
    clock.now += 5
    assert r.admit([("b", 1)], {}) == Admission([], [], 1030.0)  # ask again when a may go
    clock.now = 1030.0
    assert r.admit([("b", 1)], {}) == Admission(["b"], ["a"])


def test_busy_queued_or_sequence_holding_models_stay() -> None:
    r, clock = residency(budget=3)
    for name in ("a", "b", "c"):
        r.loaded(name, pinned=False)
    clock.now += 100
    usage = {"a": Usage(busy=True), "b": Usage(sequences=2), "c": Usage(busy=True)}
    assert r.admit([("d", 1)], usage) == Admission([], [], clock.now + RETRY_S)
    usage["c"] = Usage(last_used=clock.now)
    assert r.admit([("d", 1)], usage).evict == ["c"]


def test_pinned_models_count_but_never_go() -> None:
    r, clock = residency(budget=2)
    r.loaded("op", pinned=True)
    r.loaded("a", pinned=False)
    clock.now += 100
    r.touch("a")
    assert r.admit([("b", 1)], {}).evict == ["a"]  # op is older, but the operator's
    r.pin("a")
    assert r.admit([("b", 1)], {}).load == []


def test_a_step_of_a_busy_ensemble_stays_and_an_idle_one_goes_with_its_ensemble() -> None:
    r, clock = residency(budget=3)
    for name in ("a", "b", "ens"):
        r.loaded(name, pinned=False)
    clock.now += 100
    r.touch("b")
    r.touch("ens")
    users = {"a": ["ens"], "b": ["ens"]}
    assert r.admit([("c", 1)], {"ens": Usage(busy=True)}, users).load == []
    assert r.admit([("c", 1)], {}, users) == Admission(["c"], ["a", "ens"])


def test_a_step_of_a_pinned_ensemble_stays() -> None:
    r, clock = residency(budget=2)
    r.loaded("a", pinned=False)
    r.loaded("ens", pinned=True)
    clock.now += 100
    assert r.admit([("c", 1)], {}, {"a": ["ens"]}).load == []


def test_loads_are_admitted_in_order_and_an_ensemble_takes_its_slots() -> None:
    r, clock = residency(budget=3)
    r.loaded("x", pinned=False)
    r.loaded("y", pinned=False)
    clock.now += 100
    r.touch("y")
    # ens needs 3 slots (itself and two steps): x and y both go; c waits behind it
    got = r.admit([("ens", 3), ("c", 1)], {})
    assert got.load == ["ens"] and got.evict == ["x", "y"] and got.retry_at is not None


def test_loads_under_way_count() -> None:
    r, _ = residency(budget=2)
    r.loaded("a", pinned=False)
    assert r.admit([("b", 1)], {}, loading=1).load == []


def test_a_reload_keeps_whose_model_it_is_and_restarts_the_minimum_time() -> None:
    r, clock = residency(budget=1, min_resident_s=10.0)
    r.loaded("a", pinned=True)
    r.loaded("a", pinned=False)
    assert r.counted() == 1
    clock.now += 100
    assert r.admit([("b", 1)], {}).load == []  # still the operator's
    r.unloaded("a")
    r.loaded("a", pinned=False)
    r.loaded("a", pinned=True)  # a reload the manager started (poll) doesn't make it the operator's
    clock.now += 100
    assert r.admit([("b", 1)], {}).evict == ["a"]
    r.unloaded("a")
    r.loaded("a", pinned=False)
    clock.now += 5
    r.loaded("a", pinned=False)  # reloaded (its directory changed)
    clock.now += 6
    assert r.admit([("b", 1)], {}).load == []
    assert not r.is_loaded("b")


def test_nodes_have_budgets_of_their_own() -> None:
    r, clock = residency(budget=1)
    r.loaded("a", pinned=False, nodes=["n1"])
    clock.now += 100
    # n2 has room: b goes there, nothing is evicted
    assert r.admit([("b", 1)], {}, nodes=["n1", "n2"]) == Admission(["b"], [], None, {"b": "n2"})
    # only n1 to choose from: a makes room
    assert r.admit([("b", 1)], {}, nodes=["n1"]) == Admission(["b"], ["a"], None, {"b": "n1"})


def test_loads_spread_to_the_node_with_the_most_room() -> None:
    r, _ = residency(budget=3)
    r.loaded("a", pinned=False, nodes=["n1"])
    got = r.admit([("b", 1), ("c", 1), ("d", 1)], {}, nodes=["n1", "n2"])
    assert got.nodes == {"b": "n2", "c": "n1", "d": "n2"} and got.evict == []


def test_a_full_cluster_evicts_the_least_recently_used_of_any_node() -> None:
    r, clock = residency(budget=1)
    r.loaded("a", pinned=False, nodes=["n1"])
    r.loaded("b", pinned=False, nodes=["n2"])
    clock.now += 100
    r.touch("a")  # b, on n2, was used longest ago
    assert r.admit([("c", 1)], {}, nodes=["n1", "n2"]) == Admission(["c"], ["b"], None, {"c": "n2"})
    # a busy b stays: a makes room on n1 instead
    got = r.admit([("c", 1)], {"b": Usage(busy=True)}, nodes=["n1", "n2"])
    assert (got.evict, got.nodes) == (["a"], {"c": "n1"})


def test_a_model_on_every_node_counts_on_each_and_frees_each() -> None:
    r, clock = residency(budget=2)
    r.loaded("op", pinned=True)  # the operator's: on every node
    r.loaded("everywhere", pinned=False)  # loaded on demand, placed by Serve
    clock.now += 100
    assert r.counted("n1") == r.counted("n2") == 2
    got = r.admit([("x", 1), ("y", 1)], {}, nodes=["n1", "n2"])
    assert got.evict == ["everywhere"] and got.nodes == {"x": "n1", "y": "n2"}


def test_no_room_on_any_node_waits_for_the_soonest() -> None:
    r, clock = residency(budget=1, min_resident_s=30.0)
    r.loaded("a", pinned=False, nodes=["n1"])
    clock.now += 10
    r.loaded("b", pinned=False, nodes=["n2"])
    got = r.admit([("c", 1)], {}, nodes=["n1", "n2"])
    assert got == Admission([], [], 1030.0)  # a may go first


def test_a_reload_stays_on_its_node_unless_the_operator_loaded_the_model() -> None:
    r, _ = residency(budget=1)
    r.loaded("a", pinned=False, nodes=["n1"])
    assert r.nodes_of("a") == frozenset({"n1"}) and r.kept_on("a") == "n1"
    r.pin("a")  # the operator loaded it: its next deploy puts it on every node
    assert r.kept_on("a") is None and r.counted("n2") == 0
    r.loaded("a", pinned=True)
    assert r.nodes_of("a") is None and r.counted("n2") == 1


def test_nothing_is_evicted_for_a_load_that_still_would_not_fit() -> None:
    r, clock = residency(budget=2)
    r.loaded("a", pinned=False)
    r.loaded("op", pinned=True)
    clock.now += 100
    got = r.admit([("ens", 2)], {})
    assert got.load == [] and got.evict == [] and got.retry_at is not None
