#!/usr/bin/env python3
"""Fuzz the HTTP and gRPC front ends with malformed requests; every one must get a client-error answer.

    python -m scripts.fuzz [--cases 10000] [--seed 0] [--time-limit-s 900] [--timeout-s 10] [--concurrency 8]
                           [--protocols http,grpc,parity] [--http HOST:PORT --grpc HOST:PORT] [--case N]
                           [--sockets N]

A case passes when it is answered, within ``--timeout-s``, with HTTP 200/4xx (501 and 503 where the
server may legitimately say so; any other 5xx fails) and a ``{"error": ...}`` body on errors, or a gRPC
status other than INTERNAL, UNKNOWN, DEADLINE_EXCEEDED, DATA_LOSS...; a stream must answer each of its
requests in-band as the same request answers alone; a ``parity`` case sends one request over both
protocols and needs the same status and message.  Every ``--check-every`` cases, and at the end, the
server must still be ready and serve a valid inference.  Exit status 1 when anything failed.

In process (the default) the integration tests' models, the sequence models, an ensemble, a dynamic
batcher with priorities and a classification model are served from a temporary repository by the
real service and front ends without Ray (HTTP through httpx's ASGI transport, gRPC on a free loopback
port), with small request limits so that limit cases stay cheap.  With ``--http``/``--grpc`` a running
server is fuzzed instead: its models come from its repository index, metadata and config, and cases
never load or unload a model it serves.  ``--cases`` is per protocol.  Case ``i`` of protocol ``p``
is generated from ``Random(f"{seed}:{p}:{i}")``: ``--case i --protocols p`` replays and prints it.
Needs the test extra (httpx, tritonclient, onnx).

``--sockets N`` (in process only) then sends N cases over real sockets to the gateway's own HTTP and gRPC
servers: bad request heads (oversized request line, too many headers, an oversized head, a head that never
completes, garbage), oversized, deeply nested and empty-object bodies, gRPC messages over the size limit or
of empty inputs or nested groups, and garbage and random HTTP/2 frames on the gRPC port.  Each must be
answered as its limit says (or closed), never with a 5xx or INTERNAL/UNKNOWN, and the process's resident
memory must be back within 5% after the run (``tests/support/fuzz/sockets.py``).

The cases, the oracle and the targets are the package ``tests/support/fuzz/`` (CI runs a seeded share of them in
``tests/integration/test_fuzz.py``); this is the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from serve_app.limits import DEFAULT_LIMITS, RequestLimits
from tests.support.fuzz import (
    IN_PROCESS_LIMITS,
    PROTOCOLS,
    Generator,
    describe,
    discover,
    fuzz,
    in_process,
    remote,
    run_case,
    sockets,
)


async def main_async(args: argparse.Namespace) -> int:
    protocols = tuple(p for p in args.protocols.split(",") if p)
    for p in protocols:
        if p not in PROTOCOLS:
            raise SystemExit(f"unknown protocol {p!r}; choose from {', '.join(PROTOCOLS)}")
    if args.sockets and args.http:
        raise SystemExit("--sockets runs in process only")
    if bool(args.http) != bool(args.grpc):
        raise SystemExit("--http and --grpc go together")
    if args.http:
        limits = RequestLimits(max_body_bytes=args.max_body_bytes) if args.max_body_bytes else DEFAULT_LIMITS
        context = remote(args.http, args.grpc, args.timeout_s)
    else:
        limits = IN_PROCESS_LIMITS
        context = in_process(limits, args.timeout_s)
    async with context as (targets, service):
        models = await discover(targets.http)
        gen = Generator(models, limits, remote=bool(args.http))
        if not gen.ready:
            raise SystemExit("the server serves no ready model with inputs")
        if args.case is not None:
            for protocol in protocols:
                case = gen.case(protocol, args.seed, args.case)
                outcome = await run_case(targets, case)
                print(describe(case))
                print(f"=> {outcome.status} in {outcome.seconds * 1000:.1f} ms {outcome.problem}")
            return 0
        print(
            f"fuzzing {', '.join(protocols)}: {args.cases} cases each, seed {args.seed}, "
            f"{len(gen.ready)} ready models, limits {limits}",
            flush=True,
        )
        report = await fuzz(
            targets,
            gen,
            protocols=protocols,
            cases=args.cases,
            seed=args.seed,
            concurrency=args.concurrency,
            time_limit_s=args.time_limit_s,
            check_every=args.check_every,
            progress=lambda line: print(line, flush=True),
        )
        report.print(args.seed, show=args.show_failures)
        ok = report.ok
        if args.sockets:
            ok = await _over_sockets(service, limits, args) and ok
    return 0 if ok else 1


async def _over_sockets(service: Any, limits: RequestLimits, args: argparse.Namespace) -> bool:
    print(f"over sockets: {args.sockets} cases, seed {args.seed}", flush=True)
    report = await sockets.abuse(
        service, limits, model="add_sub", cases=args.sockets, seed=args.seed, timeout_s=max(args.timeout_s, 30.0),
        concurrency=min(args.concurrency, 4), progress=lambda line: print(line, flush=True),
    )  # fmt: skip
    for problem in report.problems[: args.show_failures]:
        print(f"FAIL {problem}")
    print(("PASS " if report.ok else "FAIL ") + report.summary())
    return report.ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000, help="cases per protocol (default 10000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit-s", type=float, default=900.0, help="stop starting cases after this long")
    ap.add_argument("--timeout-s", type=float, default=10.0, help="per request: longer is a hang")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--protocols", default=",".join(PROTOCOLS), help="among http,grpc,parity")
    ap.add_argument("--check-every", type=int, default=1000, help="readiness check every N cases")
    ap.add_argument("--http", metavar="HOST:PORT", help="fuzz a running server (with --grpc)")
    ap.add_argument("--grpc", metavar="HOST:PORT")
    ap.add_argument("--max-body-bytes", type=int, default=0, help="a running server's limit, when not the default")
    ap.add_argument("--case", type=int, help="replay one case of each protocol and print it")
    ap.add_argument("--show-failures", type=int, default=20)
    ap.add_argument("--sockets", type=int, default=0, help="then N cases over real sockets (in process)")
    return asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
