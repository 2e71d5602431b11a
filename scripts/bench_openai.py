"""Streamed tokens per second and time to first token: the OpenAI port against generate_stream, one model.

    python -m scripts.bench_openai [--requests 200] [--max-tokens 64] [--concurrency 1]

Starts ``python -m serve_app`` (real Ray) on a repository holding ``py_llm`` (scripts/llm_models.py: one
word per response, no delay, so the figures are the server's cost per token) with the OpenAI port on,
then streams the same prompt the same number of tokens through ``POST /v1/completions`` (stream: true)
and ``POST /v2/models/py_llm/generate_stream`` (plain, and with the token counts the OpenAI port asks of
a vLLM-convention model), the paths in turn, in rounds, with one httpx client for all.  Time to first
token: from sending the request to the first event that carries text; tokens per second: a request's
tokens over its whole time.  Prints medians and 90th percentiles per path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

import httpx

from scripts import llm_models
from tests.support.net import free_port

PROMPT = " ".join(f"w{i}" for i in range(16))


async def openai_stream(client: httpx.AsyncClient, url: str, max_tokens: int) -> tuple[float, int, float]:
    body = {"model": "py_llm", "prompt": PROMPT, "max_tokens": max_tokens, "stream": True}
    return await _stream(
        client, f"{url}/v1/completions", body, lambda e: e["choices"][0]["text"] if e["choices"] else ""
    )


async def generate_stream(client: httpx.AsyncClient, url: str, max_tokens: int) -> tuple[float, int, float]:
    body = {"text_input": PROMPT, "stream": True, "sampling_parameters": json.dumps({"max_tokens": max_tokens})}
    return await _stream(client, f"{url}/v2/models/py_llm/generate_stream", body, lambda e: e.get("text_output", ""))


async def generate_stream_counts(client: httpx.AsyncClient, url: str, max_tokens: int) -> tuple[float, int, float]:
    """generate_stream asking for the token counts too, as the OpenAI port asks a vLLM-convention model."""
    body = {"text_input": PROMPT, "stream": True, "sampling_parameters": json.dumps({"max_tokens": max_tokens}),
            "return_num_input_tokens": True, "return_num_output_tokens": True}  # fmt: skip
    return await _stream(client, f"{url}/v2/models/py_llm/generate_stream", body, lambda e: e.get("text_output", ""))


async def _stream(
    client: httpx.AsyncClient, url: str, body: dict[str, object], text: Callable[[dict[str, object]], object]
) -> tuple[float, int, float]:
    """(seconds to the first text, text events, seconds in all) of one streamed request."""
    t0 = time.perf_counter()
    first, tokens = 0.0, 0
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if text(json.loads(line[6:])):
                tokens += 1
                first = first or time.perf_counter() - t0
    return first, tokens, time.perf_counter() - t0


Run = Callable[[httpx.AsyncClient, str, int], Awaitable[tuple[float, int, float]]]


async def measure(urls: dict[str, str], args: argparse.Namespace) -> dict[str, list[tuple[float, int, float]]]:
    paths: dict[str, tuple[Run, str]] = {
        "openai /v1/completions": (openai_stream, urls["openai"]),
        "generate_stream": (generate_stream, urls["http"]),
        "generate_stream + counts": (generate_stream_counts, urls["http"]),
    }
    results: dict[str, list[tuple[float, int, float]]] = {name: [] for name in paths}
    limits = httpx.Limits(max_connections=args.concurrency * 2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for run, url in paths.values():  # warm both paths
            for _ in range(5):
                await run(client, url, args.max_tokens)
        rounds = max(1, args.requests // (args.concurrency * 10))
        for _ in range(rounds):
            for name, (run, url) in paths.items():
                batch = [run(client, url, args.max_tokens) for _ in range(args.concurrency * 10)]
                for i in range(0, len(batch), args.concurrency):
                    results[name] += await asyncio.gather(*batch[i : i + args.concurrency])
    return results


def report(results: dict[str, list[tuple[float, int, float]]]) -> None:
    def pct(values: list[float], q: float) -> float:
        return sorted(values)[min(len(values) - 1, int(q * len(values)))]

    print(f"{'path':<26} {'requests':>8} {'tokens':>6} {'TTFT p50 ms':>12} {'TTFT p90 ms':>12} {'tok/s p50':>10}")
    for name, rows in results.items():
        ttft = [r[0] * 1000 for r in rows]
        rate = [r[1] / r[2] for r in rows]
        print(
            f"{name:<26} {len(rows):>8} {rows[0][1]:>6} {statistics.median(ttft):>12.2f} {pct(ttft, 0.9):>12.2f} "
            f"{statistics.median(rate):>10.0f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="streamed requests per path")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight per path")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp, "repo")
        llm_models.text_llm(repo)
        http_port, openai_port = free_port(), free_port()
        log = pathlib.Path(tmp, "server.log")
        cmd = [sys.executable, "-m", "serve_app", "--model-repository", str(repo), "--host", "127.0.0.1",
               "--http-port", str(http_port), "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
               "--openai-port", str(openai_port)]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            while b"serve_app ready" not in log.read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    print(log.read_text()[-3000:], file=sys.stderr)
                    return 1
                time.sleep(0.5)
            urls = {"openai": f"http://127.0.0.1:{openai_port}", "http": f"http://127.0.0.1:{http_port}"}
            report(asyncio.run(measure(urls, args)))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
