"""Which models of a load may be deployed at all, for both servers (on Ray and ``--local``).

Before any instance starts, a model fails when it is an ensemble whose steps
can't be served (``config/ensemble_deps.py``), when one execution needs more
of a rate-limiter resource than the server declares, or when its autoscaling
settings are wrong (on Ray, where they apply).  Each failure keeps Triton's
message; the other models go on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from serve_app.config.ensemble_deps import ensemble_problems
from serve_app.errors import ServeError, as_serve_error
from serve_app.repository import ModelSource
from serve_app.scheduling.rate_limiter import Needs, check_resources


@dataclass
class Admission:
    admitted: dict[str, ModelSource] = field(default_factory=dict)
    scaling: dict[str, Any] = field(default_factory=dict)  # model -> its autoscaling (None: fixed instances)
    failures: dict[str, str] = field(default_factory=dict)  # model -> why it can't be deployed


def admit(
    sources: Mapping[str, ModelSource],
    loaded: Mapping[str, ModelSource],
    limits: Mapping[str, int] | None,
    scaling: Callable[[str, ModelSource], Any] | None = None,
) -> Admission:
    """Split ``sources`` into the models that may be deployed and those that fail now.  ``loaded``: the
    models that serve already (an ensemble's steps may be among them); ``limits``: the rate limiter's declared
    resources; ``scaling``: a model's autoscaling settings (raises when they are wrong)."""
    every = {**loaded, **sources}
    configs = {n: s.config for n, s in every.items()}
    problems = ensemble_problems(configs, {n: set(s.versions) for n, s in every.items()})
    out = Admission()
    for name, source in sources.items():
        try:
            if name in problems:
                raise ServeError(problems[name])
            if limits is not None:
                check_resources(name, Needs.from_config(source.config), limits)
            out.scaling[name] = scaling(name, source) if scaling is not None else None
            out.admitted[name] = source
        except Exception as exc:
            out.failures[name] = as_serve_error(exc).message
    return out
