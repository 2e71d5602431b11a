"""One real server for the whole e2e session: `python -m serve_app` with real Ray on free ports."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from scripts import example_models, python_models
from tests.e2e import (
    cancel_models,
    control_models,
    ensemble_models,
    openai_models,
    sequence_models,
    stream_models,
    torchscript_models,
    warmup_models,
)
from tests.e2e.models import identity_all, slow_identity
from tests.support.net import free_port

STARTUP_TIMEOUT_S = 240
# Room for CACHE_ENTRIES answers of ``cached`` (two FP32 [1, 16] outputs, plus the cache's per-entry overhead).
CACHE_ENTRIES = 2
CACHE_BYTES = CACHE_ENTRIES * (2 * 16 * 4 + 64)

# Level 2 is the default; 1 overtakes it; 3 holds one request; 4 rejects and 5 delays timed-out requests.
SLOW_BATCHING = """dynamic_batching {
  preferred_batch_size: [ 1 ]
  priority_levels: 5
  default_priority_level: 2
  priority_queue_policy { key: 3 value: { max_queue_size: 1 } }
  priority_queue_policy { key: 4 value: { timeout_action: REJECT default_timeout_microseconds: 10000000
                                          allow_timeout_override: true } }
  priority_queue_policy { key: 5 value: { timeout_action: DELAY default_timeout_microseconds: 10000000
                                          allow_timeout_override: true } }
}
"""


@dataclass(frozen=True)
class Server:
    http_url: str  # host:port, as tritonclient wants it
    grpc_url: str
    metrics_url: str  # http://host:port/metrics
    repo: pathlib.Path
    proc: subprocess.Popen[bytes]
    log: pathlib.Path
    openai_url: str = ""  # http://host:port/v1, as the openai client wants it


def build_repository(repo: pathlib.Path) -> None:
    example_models.add_sub(repo)
    example_models.identity(repo, "FP32")  # single input: the raw binary request
    example_models.identity(repo, "BYTES")
    identity_all(repo)
    example_models.no_config_onnx(repo, "generated")
    # three versions, policy serves the latest two
    example_models.add_sub(
        repo, name="versioned", versions=(1, 2, 3), extra_config="version_policy: { latest { num_versions: 2 } }\n"
    )
    # dynamic batching: waits up to 5 s for a batch of 8
    example_models.add_sub(
        repo,
        name="batch8",
        extra_config="dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 5000000 }\n"
        'metric_tags { key: "team" value: "vision" }\n',
    )
    # one request per execution, each a few hundred ms; priority levels with different queue policies
    slow_identity(repo, "slow", SLOW_BATCHING)
    broken = repo / "broken"
    (broken / "1").mkdir(parents=True)
    shutil.copy(repo / "add_sub" / "1" / "model.onnx", broken / "1" / "model.onnx")
    (broken / "config.pbtxt").write_text('name: "broken"\nplatform: "onnxruntime_onnx"\nmax_batch_size: -3\n')
    sequence_models.build_all(repo)  # seq_* models for test_sequence.py (sequence batcher)
    warmup_models.build(repo)  # warmup_ok/_bad for test_warmup.py
    torchscript_models.build_all(repo)  # ts_* models for test_torchscript.py (none without PyTorch)
    ensemble_models.build_all(repo)  # ens_*, scores for test_ensemble_classification.py and test_ensemble_decoupled.py
    control_models.build_explicit(repo)  # ctl_* for test_model_control.py (the repository API)
    python_models.build_e2e(repo)  # py_* for test_python_backend.py (Python backend, decoupled, generate, BLS)
    cancel_models.build(repo)  # gate for test_cancellation.py
    stream_models.build(repo)  # py_until_cancelled, py_bls_*cancel, py_stream_batched for test_python_streams.py
    cancel_models.build_priority_gate(repo, SLOW_BATCHING)  # prio_gate for test_batching.py
    cancel_models.build_rate_limited(repo)  # rl_* for test_rate_limiter.py
    example_models.add_sub(repo, name="cached", extra_config="response_cache { enable: true }")  # test_response_cache
    openai_models.build(repo)  # py_llm* and py_trtllm for test_openai.py (the OpenAI port)


def _ready(http_url: str, ca_file: str | None = None) -> bool:
    import ssl
    import urllib.request

    scheme, context = ("https", ssl.create_default_context(cafile=ca_file)) if ca_file else ("http", None)
    try:
        with urllib.request.urlopen(f"{scheme}://{http_url}/v2/health/ready", timeout=2, context=context) as r:
            return r.status == 200
    except Exception:
        return False


def start_server(
    tmp_path_factory: pytest.TempPathFactory,
    repo: pathlib.Path,
    extra: list[str],
    tag: str,
    ca_file: str | None = None,
    env_extra: dict[str, str] | None = None,
) -> tuple[Server, float]:
    """Start ``python -m serve_app`` (its own Ray) on free ports; returns it once ready, and how long that took."""
    http_port, grpc_port, metrics_port, openai_port = free_port(), free_port(), free_port(), free_port()
    log = tmp_path_factory.mktemp(f"{tag}_log") / "server.log"
    env = dict(os.environ, RAY_DEDUP_LOGS="0", PYTHONUNBUFFERED="1", **(env_extra or {}))
    cmd = [
        sys.executable, "-m", "serve_app",
        "--model-repository", str(repo),
        "--host", "127.0.0.1",
        "--http-port", str(http_port),
        "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port),
        "--openai-port", str(openai_port),
        "--num-cpus", "16",
        "--object-store-memory", str(256 * 1024 * 1024),
        *extra,
    ]  # fmt: skip
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    http_url, grpc_url = f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not (_ready(http_url, ca_file) and b"serve_app ready" in log.read_bytes()):
        if proc.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"server did not start:\n{log.read_text()[-5000:]}")
        time.sleep(0.5)
    metrics_url, openai_url = f"http://127.0.0.1:{metrics_port}/metrics", f"http://127.0.0.1:{openai_port}/v1"
    server = Server(http_url, grpc_url, metrics_url, repo, proc, log, openai_url)
    return server, time.monotonic() - t0


def stop_server(server: Server) -> None:
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Explicit model control with every model loaded at start, so the repository API works on it; clients
    (the tests, on this host) may register system shared memory.  With Ray's INFO logs (``--ray-logs``): its log
    says more when a test fails, and test_warmup reads a replica's INFO line."""
    repo = tmp_path_factory.mktemp("model_repository")
    build_repository(repo)
    extra = ["--model-control-mode", "explicit", "--load-model", "*", "--allow-client-shm", "--ray-logs"]
    extra += ["--cache-config", f"local,size={CACHE_BYTES}", "--rate-limit", "execution_count"]
    started, _ = start_server(tmp_path_factory, repo, extra, "server")
    yield started
    stop_server(started)


@pytest.fixture(scope="session")
def poll_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A second server in poll mode (its own Ray), for poll and autoscaling tests."""
    repo = tmp_path_factory.mktemp("poll_repository")
    control_models.build_poll(repo)
    started, _ = start_server(
        tmp_path_factory, repo, ["--model-control-mode", "poll", "--repository-poll-secs", "1"], "poll"
    )
    yield started
    stop_server(started)
