"""What a person reads when the example repository starts: one line per model as it loads, Triton's table of
models and the ready line; none of Ray's or Serve's INFO logs.  A model that fails to load still says so.  Its own
server (the example repository and one broken model), stopped before the output is read; it starts its own Ray
although a dead `ray start` left its address in ray_current_cluster."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from scripts.gen_example_repo import generate
from tests.e2e.conftest import Server, start_server, stop_server
from tests.support.net import free_port

BROKEN = "broken_example"
# What Ray's and Serve's own logs look like: their INFO records, the "(actor pid=...)" prefix of worker output,
# and the names of Serve's processes.
RAY_LINE = re.compile(r"\bINFO\b|pid=|ServeController|ServeReplica|Started a local Ray|Deploying new version")


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, list[str], list[str]]]:
    repo = tmp_path_factory.mktemp("example_repository")
    models = [d.name for d in generate(repo)]
    broken = repo / BROKEN
    shutil.copytree(repo / "add_sub", broken)
    (broken / "config.pbtxt").write_text(f'name: "{BROKEN}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: -3\n')
    # What a `ray start` that has since died leaves behind: ray_current_cluster naming its head.  Ray's temp
    # directory here is a short one of the test's own (Ray's socket paths must stay short).
    ray_tmp = tempfile.mkdtemp(prefix="sa_", dir="/tmp")
    os.makedirs(os.path.join(ray_tmp, "ray"))
    with open(os.path.join(ray_tmp, "ray", "ray_current_cluster"), "w") as f:
        f.write(f"127.0.0.1:{free_port()}\n")
    try:
        server, _ = start_server(tmp_path_factory, repo, [], "example", env_extra={"RAY_TMPDIR": ray_tmp})
        stop_server(server)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    lines = server.log.read_text().splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("shutting down"))
    yield server, [*models, BROKEN], lines[:end]


def _table(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith(("+-", "| "))]


def test_start_up_prints_one_line_per_model_the_table_and_the_ready_line(
    started: tuple[Server, list[str], list[str]],
) -> None:
    _, models, lines = started
    table = _table(lines)
    assert len(table) == len(models) + 4  # three dividers and the header
    others = [line for line in lines if line not in table]
    assert len(others) <= len(models) + 1, "\n".join(lines)
    assert sum("serve_app ready" in line for line in others) == 1
    for model in models:
        assert sum(f"'{model}'" in line for line in others) <= 1, model


def test_start_up_prints_none_of_rays_info_logs(started: tuple[Server, list[str], list[str]]) -> None:
    _, _, lines = started
    assert [line for line in lines if RAY_LINE.search(line)] == []


def test_a_model_that_fails_to_load_says_why(started: tuple[Server, list[str], list[str]]) -> None:
    _, _, lines = started
    (failed,) = [line for line in lines if line.startswith(f"failed to load '{BROKEN}'")]
    assert "max_batch_size" in failed
    (row,) = [line for line in _table(lines) if line.startswith(f"| {BROKEN} ")]
    assert "UNAVAILABLE" in row
