"""What passes.  A case passes when it is answered in time with HTTP 200/4xx (501, 503 where the server
may legitimately say so, and Triton's 500 for a negative dimension; any other 5xx fails) and a
``{"error": ...}`` body on errors, or with a gRPC status other than INTERNAL, UNKNOWN, DEADLINE_EXCEEDED,
DATA_LOSS...  The report counts what came back."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from serve_app.protocol.http_codec import NEGATIVE_DIMENSION
from tests.support.fuzz.cases import Case, HttpCase

HTTP_OK = {200, 400, 404, 405, 413, 501}  # 503 only where the server may be unavailable
GRPC_OK = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "UNIMPLEMENTED", "RESOURCE_EXHAUSTED", "ALREADY_EXISTS"}
GRPC_TO_HTTP = {
    "OK": 200,
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "UNAVAILABLE": 503,
    "UNIMPLEMENTED": 501,
    "RESOURCE_EXHAUSTED": 413,
    "ALREADY_EXISTS": 400,
    "CANCELLED": 400,
}


@dataclass
class Outcome:
    status: str  # "200", "INVALID_ARGUMENT", "timeout", "exception:ValueError", ...
    seconds: float
    problem: str = ""  # empty when the answer is a right one


def is_negative_dimension(resp: httpx.Response) -> bool:
    """Triton's HTTP answer to a negative dimension: 500 with its parser's text."""
    if resp.status_code != 500:
        return False
    try:
        body = resp.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("error") == NEGATIVE_DIMENSION


def http_problem(case: HttpCase, resp: httpx.Response, *, strict: bool) -> str:
    """Empty when ``resp`` is a right answer to ``case``; else what is wrong with it.  ``strict``: every model
    is ready, so 503 only where the case allows it."""
    status = resp.status_code
    problem = ""
    if status == 503:
        if strict and not case.unavailable_ok:
            problem = "503 where every model is ready"
    elif is_negative_dimension(resp):
        pass  # Triton's HTTP parser refuses a negative dimension with a 500, and so does serve_app
    elif status not in HTTP_OK:
        problem = f"HTTP {status}"
    bodyless = case.path.endswith("/ready") or case.path.startswith("/v2/health/")  # 400: not ready, no body
    if status >= 400 and not problem and not (bodyless and not resp.content):
        try:
            body = resp.json()
            if not (isinstance(body, dict) and isinstance(body.get("error"), str)):
                problem = "error body is not {'error': str}"
        except ValueError:
            problem = "error body is not JSON"
    if problem:
        problem += f": {resp.text[:300]!r}"
    return problem


def grpc_problem(code: str, unavailable_ok: bool, *, strict: bool, timeout_s: float) -> str:
    """Empty when the gRPC status ``code`` is a right answer; else what is wrong with it."""
    if code == "UNAVAILABLE":
        return "UNAVAILABLE where every model is ready" if strict and not unavailable_ok else ""
    if code == "DEADLINE_EXCEEDED":
        return f"no answer in {timeout_s} s"
    return "" if code in GRPC_OK else code


@dataclass
class Report:
    statuses: dict[str, Counter[str]] = field(default_factory=dict)
    cases: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[str, int, str, Outcome]] = field(default_factory=list)  # protocol, index, kind, outcome
    slowest: dict[str, tuple[float, int, str]] = field(default_factory=dict)
    health: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    def add(self, protocol: str, index: int, case: Case, outcome: Outcome) -> None:
        self.cases[protocol] += 1
        self.statuses.setdefault(protocol, Counter())[outcome.status] += 1
        if outcome.problem:
            self.failures.append((protocol, index, case.kind, outcome))
        if outcome.seconds > self.slowest.get(protocol, (-1.0, 0, ""))[0]:
            self.slowest[protocol] = (outcome.seconds, index, case.kind)

    @property
    def ok(self) -> bool:
        return not self.failures and not self.health

    def print(self, seed: int, out: Any = sys.stdout, show: int = 20) -> None:
        for protocol, counts in self.statuses.items():
            line = "  ".join(f"{s}: {n}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
            print(f"{protocol:6} {line}", file=out)
        for protocol, (seconds, index, kind) in self.slowest.items():
            print(f"slowest {protocol}: case {index} ({kind[:80]}) {seconds * 1000:.1f} ms", file=out)
        for protocol, index, kind, outcome in self.failures[:show]:
            print(
                f"FAIL {protocol} case {index} [{kind[:80]}] -> {outcome.status}: {outcome.problem[:400]}\n"
                f"     replay: scripts/fuzz --seed {seed} --protocols {protocol} --case {index}",
                file=out,
            )
        if len(self.failures) > show:
            print(f"... and {len(self.failures) - show} more failures", file=out)
        for problem in self.health:
            print(f"NOT READY: {problem}", file=out)
        print(file=out)
        header = f"{'protocol':8} {'cases':>7} {'2xx/OK':>7} {'4xx/client':>10} {'failures':>8} {'slowest ms':>10}"
        print(header, file=out)
        print("-" * len(header), file=out)
        for protocol in self.statuses:
            counts = self.statuses[protocol]
            good = sum(n for s, n in counts.items() if s in ("200", "OK", "STREAM_OK") or s.startswith("200="))
            bad = sum(1 for f in self.failures if f[0] == protocol)
            client = self.cases[protocol] - good - bad
            slow = self.slowest[protocol][0] * 1000
            print(
                f"{protocol:8} {self.cases[protocol]:>7} {good:>7} {client:>10} {bad:>8} {slow:>10.1f}",
                file=out,
            )
        verdict = "PASS" if self.ok else "FAIL"
        total = sum(self.cases.values())
        print(
            f"{verdict}: {total} cases in {self.elapsed_s:.1f} s, server ready afterwards: {not self.health}", file=out
        )
