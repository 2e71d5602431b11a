"""An independent gRPC stack against the real server: Node's grpc-js with stubs loaded from the
repository's own .proto files (``tests/e2e/grpc_js/client.js``). It reaches the server only if the files
declare Triton's package, ``inference``, as Triton's do."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

from tests.e2e.conftest import Server
from tests.support.paths import ROOT

CLIENT_DIR = ROOT / "tests" / "e2e" / "grpc_js"
INSTALL_TIMEOUT_S = 300
CALL_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def node() -> str:
    """The ``node`` binary, with the pinned grpc-js installed next to the client from its lockfile."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed: the grpc-js client cannot run")
    install = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
        cwd=CLIENT_DIR,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    if install.returncode != 0:
        pytest.skip(f"npm could not install @grpc/grpc-js: {install.stderr.strip()[-500:]}")
    return node


@pytest.fixture(scope="module")
def answers(node: str, server: Server) -> dict[str, Any]:
    run = subprocess.run(
        [node, str(CLIENT_DIR / "client.js"), server.grpc_url, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT_S,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    result: dict[str, Any] = json.loads(run.stdout)
    return result


def test_health_and_metadata(answers: dict[str, Any]) -> None:
    assert answers["live"] is True
    assert answers["ready"] is True
    assert answers["model_ready"] is True
    assert answers["server_metadata"]["name"] == "serve_app"
    metadata = answers["model_metadata"]
    assert metadata["name"] == "add_sub"
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT0", "INPUT1"]
    assert answers["config"] == {"name": "add_sub", "max_batch_size": 8, "inputs": ["INPUT0", "INPUT1"]}


@pytest.mark.parametrize("contents", ["raw", "typed"])
def test_model_infer(answers: dict[str, Any], contents: str) -> None:
    answer = answers[contents]
    assert answer["id"] == contents
    assert answer["model_name"] == "add_sub"
    a = list(range(16))
    assert answer["outputs"]["OUTPUT0"] == {"datatype": "FP32", "shape": [1, 16], "values": [x + 1.0 for x in a]}
    assert answer["outputs"]["OUTPUT1"] == {"datatype": "FP32", "shape": [1, 16], "values": [x - 1.0 for x in a]}


def test_unknown_model_is_a_grpc_error(answers: dict[str, Any]) -> None:
    assert answers["unknown"] == {
        "code": "NOT_FOUND",
        "details": "Request for unknown model: 'no_such_model' is not found",
    }


def test_model_stream_infer(answers: dict[str, Any]) -> None:
    assert answers["stream"] == [{"error": "", "id": "square", "out": [3]}] * 3
