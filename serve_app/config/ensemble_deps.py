"""Checks an ensemble needs the other models for: its steps exist, are served, and fit together.

``validate_config`` checks one ensemble on its own (every tensor produced once,
no cycles inside it, every output reachable).  What it can't see is the models
the steps name; :func:`ensemble_problems` checks those, once the repository is
loaded: every step model is served (at the version the step asks for), its
inputs and outputs exist, the data types agree along every tensor, batching is
compatible, ensembles don't include each other in a cycle, and no step reads
the responses of two different decoupled steps (Triton's rule: the steps after
a decoupled one run once per response it sends, so their inputs must all come
from the same stream of responses).
"""

from __future__ import annotations

from collections.abc import Mapping

from serve_app.config import ENSEMBLE_PLATFORM
from serve_app.protos import model_config_pb2 as mc


def _type(dt: int) -> str:
    return mc.DataType.Name(dt) if dt in mc.DataType.values() else str(dt)


def _dims_fit(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _full(config: mc.ModelConfig, dims: tuple[int, ...]) -> tuple[int, ...]:
    return (-1, *dims) if config.max_batch_size > 0 else dims


def _one(config: mc.ModelConfig, models: Mapping[str, mc.ModelConfig], served: Mapping[str, set[int]]) -> str:
    """Why this ensemble can't be served ("" when it can)."""
    tensors: dict[str, tuple[int, tuple[int, ...], str]] = {}  # ensemble tensor -> (type, full dims, producer)
    for t in config.input:
        tensors[t.name] = (t.data_type, _full(config, tuple(t.dims)), f"ensemble input '{t.name}'")
    steps = config.ensemble_scheduling.step
    for i, step in enumerate(steps):
        field = f"ensemble_scheduling.step[{i}]"
        sub = models.get(step.model_name)
        if sub is None:
            return f"{field}: model '{step.model_name}' is not available"
        if step.model_version >= 0 and step.model_version not in served.get(step.model_name, set()):
            return f"{field}: model '{step.model_name}' version {step.model_version} is not available"
        if config.max_batch_size > 0 and sub.max_batch_size < config.max_batch_size:
            return (
                f"{field}: model '{step.model_name}' has max_batch_size {sub.max_batch_size}, smaller than the "
                f"ensemble's {config.max_batch_size}"
            )
        outputs = {o.name: o for o in sub.output}
        for model_out, tensor in step.output_map.items():
            out = outputs.get(model_out)
            if out is None:
                return f"{field}.output_map: model '{step.model_name}' has no output '{model_out}'"
            tensors[tensor] = (out.data_type, _full(sub, tuple(out.dims)), f"output '{model_out}' of '{sub.name}'")
    for i, step in enumerate(steps):
        field = f"ensemble_scheduling.step[{i}]"
        sub = models[step.model_name]
        inputs = {t.name: t for t in sub.input}
        for model_in, tensor in step.input_map.items():
            inp = inputs.get(model_in)
            if inp is None:
                return f"{field}.input_map: model '{step.model_name}' has no input '{model_in}'"
            known = tensors.get(tensor)
            if known is None:
                continue  # validate_config reports tensors nothing produces
            dtype, dims, producer = known
            if dtype != inp.data_type:
                return (
                    f"{field}.input_map: tensor '{tensor}' is {_type(dtype)} ({producer}) but input '{model_in}' of "
                    f"'{step.model_name}' is {_type(inp.data_type)}"
                )
            if not _dims_fit(dims, _full(sub, tuple(inp.dims))) and not inp.HasField("reshape"):
                return (
                    f"{field}.input_map: tensor '{tensor}' has shape {list(dims)} ({producer}) but input "
                    f"'{model_in}' of '{step.model_name}' expects {list(_full(sub, tuple(inp.dims)))}"
                )
    for output in config.output:
        known = tensors.get(output.name)
        if known is not None and known[0] != output.data_type:
            return f"output '{output.name}' is {_type(output.data_type)} but {known[2]} is {_type(known[0])}"
    return ""


def ensemble_problems(models: Mapping[str, mc.ModelConfig], served: Mapping[str, set[int]]) -> dict[str, str]:
    """For each ensemble among ``models`` (the loaded configs) that can't be served, why.

    An ensemble whose step is a failed ensemble fails too.
    """
    problems: dict[str, str] = {}
    ensembles = {n: c for n, c in models.items() if c.platform == ENSEMBLE_PLATFORM}
    for name, config in ensembles.items():
        reason = _one(config, models, served)
        if reason:
            problems[name] = reason
    # Cycles between ensembles, then failures that propagate to the ensembles using them.
    for name in ensembles:
        path = _cycle(name, ensembles)
        if path and name not in problems:
            problems[name] = "ensembles include each other in a cycle: " + " -> ".join(path)
    decoupled = _decoupled(models)
    for name, config in ensembles.items():
        if name not in problems:
            mixed = _mixed_step(config, decoupled)
            if mixed:
                problems[name] = (
                    f"in ensemble {name}, step of model '{mixed}' receives inputs originated from different "
                    "decoupled models"
                )
    changed = True
    while changed:
        changed = False
        for name, config in ensembles.items():
            if name in problems:
                continue
            for step in config.ensemble_scheduling.step:
                if step.model_name in problems:
                    problems[name] = f"step model '{step.model_name}' is not available: {problems[step.model_name]}"
                    changed = True
                    break
    return problems


def _decoupled(models: Mapping[str, mc.ModelConfig]) -> set[str]:
    """The decoupled models: those whose config says so, and the ensembles with such a step (Triton marks
    them decoupled)."""
    out = {n for n, c in models.items() if c.platform != ENSEMBLE_PLATFORM and c.model_transaction_policy.decoupled}
    grew = True
    while grew:
        grew = False
        for name, config in models.items():
            if name not in out and config.platform == ENSEMBLE_PLATFORM and set(composing_models(config)) & out:
                out.add(name)
                grew = True
    return out


def _mixed_step(config: mc.ModelConfig, decoupled: set[str]) -> str:
    """The model of the first step whose inputs come from different decoupled steps ("" when none does).

    Each tensor is labelled by the decoupled step whose responses it follows (0: the ensemble request):
    a decoupled step's outputs get a label of their own, any other step's the one its inputs share."""
    labels = dict.fromkeys((t.name for t in config.input), 0)
    steps = list(config.ensemble_scheduling.step)
    fresh = 0
    progress = True
    while steps and progress:
        progress = False
        for step in list(steps):
            if not all(t in labels for t in step.input_map.values()):
                continue
            steps.remove(step)
            progress = True
            seen = {labels[t] for t in step.input_map.values()}
            if len(seen) > 1:
                return step.model_name
            if step.model_name in decoupled:
                fresh += 1
                label = fresh
            else:
                label = seen.pop() if seen else 0
            for tensor in step.output_map.values():
                labels[tensor] = label
    return ""


def _cycle(start: str, ensembles: Mapping[str, mc.ModelConfig]) -> list[str]:
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for step in ensembles[node].ensemble_scheduling.step:
            nxt = step.model_name
            if nxt == start:
                return [*path, nxt]
            if nxt in ensembles and nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return []


def composing_models(config: mc.ModelConfig) -> list[str]:
    return list(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step))


def load_waves(models: Mapping[str, mc.ModelConfig], size: int) -> list[list[str]]:
    """``models`` in groups of at most ``size`` to load one group after the other (``size`` 0: one group),
    each ensemble in a group no earlier than the models its steps name (Triton's --model-load-thread-count:
    at most that many models load at once)."""
    depth: dict[str, int] = {}

    def depth_of(name: str, seen: frozenset[str] = frozenset()) -> int:
        if name not in depth:
            config = models[name]
            steps = [s for s in composing_models(config) if s in models and s not in seen]
            if config.platform != ENSEMBLE_PLATFORM or not steps:
                depth[name] = 0
            else:
                depth[name] = 1 + max(depth_of(s, seen | {name}) for s in steps)
        return depth[name]

    order = sorted(models, key=lambda n: (depth_of(n), n))
    if size <= 0:
        return [order] if order else []
    return [order[i : i + size] for i in range(0, len(order), size)]
