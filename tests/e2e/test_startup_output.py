"""What a person reads when the example repository starts: one line per model as it loads, Triton's table of
models and the ready line; none of Ray's or Serve's INFO logs.  A model that fails to load still says so.  Its own
server (the example repository and one broken model), stopped before the output is read."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator

import pytest

from scripts.gen_example_repo import generate
from tests.e2e.conftest import Server, start_server, stop_server

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
    server, _ = start_server(tmp_path_factory, repo, [], "example")
    stop_server(server)
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
