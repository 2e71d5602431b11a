"""The Grafana dashboards in deploy/grafana, and the PromQL in them, for the tests that check them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import promql_parser

from tests.support.paths import ROOT

DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))

# Grafana's variables, as Grafana substitutes them before the query reaches Prometheus.
_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h", "$model": "__model__"}
_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]


def promql_selectors(expr: str) -> list[tuple[str, set[tuple[str, str, str]]]]:
    """The series selectors of a panel's PromQL, which must parse: (metric name, {(label, op, value)}), with
    ``$model`` kept as the matcher's value."""
    found = []
    for node in _nodes(_parse(expr)):
        if isinstance(node, promql_parser.VectorSelector):
            matchers = {
                (m.name, _OPS[str(m.op).rsplit(".", 1)[-1]], "$model" if m.value == "__model__" else m.value)
                for m in node.matchers.matchers
            }
            found.append((node.name, matchers))
    return found


def aggregation_labels(expr: str) -> set[str]:
    """The labels the PromQL groups by (``by (...)``)."""
    return {
        label
        for node in _nodes(_parse(expr))
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None
        for label in node.modifier.labels
    }


def _parse(expr: str) -> Any:
    """The PromQL as Prometheus gets it once Grafana has substituted its variables."""
    for name, value in _VARIABLES.items():
        expr = expr.replace(name, value)
    return promql_parser.parse(expr)


def _nodes(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, promql_parser.BinaryExpr):
        yield from _nodes(node.lhs)
        yield from _nodes(node.rhs)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from _nodes(arg)
    elif isinstance(node, promql_parser.MatrixSelector):
        yield from _nodes(node.vector_selector)
    elif isinstance(
        node,
        (promql_parser.AggregateExpr, promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr),
    ):
        yield from _nodes(node.expr)
