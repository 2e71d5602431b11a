"""ModelBooks: a deploy's outcome (what failed, what serves UNAVAILABLE, what goes stale) without Ray."""

from __future__ import annotations

from serve_app.keys import ModelKey
from serve_app.protos import model_config_pb2 as mc
from serve_app.service.model_books import DeployResults, Generation, ModelBooks, Stale
from serve_app.service.serving_state import DeploymentRef, ServedVersion


def version(name: str, number: int = 1, *apps: str, generation: int = 1) -> ServedVersion:
    refs = tuple(DeploymentRef(app, app, 1) for app in apps)
    return ServedVersion(name, number, b"", refs, (), generation, "LOADING")


def generation(name: str, *apps: str, groups: tuple[str, ...] = (), gen: int = 1) -> Generation:
    return Generation([version(name, 1, *apps, generation=gen)], list(apps), set(groups))


def model(name: str) -> mc.ModelConfig:
    return mc.ModelConfig(name=name)


def ensemble(name: str, *steps: str) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, platform="ensemble")
    for step in steps:
        config.ensemble_scheduling.step.add(model_name=step)
    return config


def test_the_first_error_of_a_model_is_its_reason_and_its_ensembles_fail_with_it() -> None:
    books = ModelBooks()
    new = {"a": generation("a", "app-a", groups=("g-a",)), "e": Generation([version("e")])}
    results = DeployResults(
        app_errors={"app-a": "its instances failed to start"},
        group_errors={"g-a": "no such file"},
        load_errors={ModelKey("a", 1): "bad weights"},
    )
    failures: dict[str, str] = {}
    requested = {"a": model("a"), "e": ensemble("e", "a")}
    kept = books.failures(requested, new, [("g-a", "a")], results, failures, keep_failed=False)
    assert kept == {}
    assert failures == {"a": "no such file", "e": "its step model 'a' failed to load: no such file"}


def test_kept_failed_instances_serve_unavailable_and_an_ensemble_over_a_served_step_stays() -> None:
    books = ModelBooks()
    books.serve("a", generation("a", "old-a"), {}, Stale())  # a generation of 'a' serves already
    new = {"a": generation("a", "new-a", gen=2), "b": generation("b", "app-b"), "e": Generation([version("e")])}
    results = DeployResults(load_errors={ModelKey("b", 1): "no CUDA here", ModelKey("a", 1): "bad weights"})
    failures: dict[str, str] = {}
    requested = {"a": model("a"), "b": model("b"), "e": ensemble("e", "a")}
    kept = books.failures(requested, new, [], results, failures, keep_failed=True)
    assert kept == {ModelKey("b", 1): "no CUDA here", ModelKey("a", 1): "bad weights"} and failures == {}
    stale = Stale()
    books.serve("b", new["b"], kept, stale)
    assert [(v.state, v.reason) for v in books.served["b"]] == [("UNAVAILABLE", "no CUDA here")]
    assert stale == Stale()


def test_a_reload_makes_the_old_generation_stale_and_a_failed_one_keeps_it() -> None:
    books = ModelBooks()
    books.serve("a", generation("a", "app-1", groups=("g-1",)), {}, Stale())
    stale = Stale()
    books.serve("a", generation("a", "app-2", groups=("g-2",), gen=2), {}, stale)
    assert stale == Stale(["app-1"], {"g-1"}) and books.apps == {"a": ["app-2"]}
    assert [(v.generation, v.state) for v in books.served["a"]] == [(2, "READY")]
    books.load_failed("a", "a reload that failed")
    assert books.snapshot(7).failed == () and [v.generation for v in books.snapshot(7).served] == [2]
    books.load_failed("b", "never served")
    assert books.snapshot(8).failed == (("b", "never served"),)


def test_remove_frees_what_a_model_ran_on_and_says_whether_it_served() -> None:
    books = ModelBooks()
    books.serve("a", Generation([version("a")], ["app-a"], {"g-a"}, ["seq-a"]), {}, Stale())
    assert books.sequence_models() == ("seq-a",)
    stale = Stale()
    assert books.remove("a", "unloaded", stale) and stale == Stale(["app-a"], {"g-a"})
    assert not books.remove("a", "unloaded", Stale())
    state = books.snapshot(3)
    assert state.served == () and state.failed == (("a", "unloaded"),) and books.sequence_models() == ()
    assert books.states() == {}
