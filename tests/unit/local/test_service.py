"""LocalService.from_repository on small real ONNX models: a model that fails to load (its instance, its warmup, its
config) is listed UNAVAILABLE with its reason while the others serve, warmups count in the statistics, and
ensembles whose steps can't be served don't serve."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator

import pytest

from scripts import example_models
from serve_app.errors import Unavailable
from serve_app.keys import ModelKey
from serve_app.local.service import LocalService
from serve_app.repository.api import IndexEntry
from serve_app.service import ModelState

DIMS = 4
LoadHost = Callable[[pathlib.Path], LocalService]


def warmup(name: str = "zeros", batch_size: int = 2, count: int = 3, input_name: str = "INPUT0") -> str:
    body = " ".join(
        f'inputs {{ key: "{i}" value: {{ data_type: TYPE_FP32 dims: [{DIMS}] zero_data: true }} }}'
        for i in (input_name, "INPUT1")
    )
    return f'model_warmup [ {{ name: "{name}" batch_size: {batch_size} count: {count} {body} }} ]'


def corrupt(repo: pathlib.Path, name: str) -> None:
    example_models.add_sub(repo, name=name, dims=DIMS)
    (repo / name / "1" / "model.onnx").write_bytes(b"this is not an onnx model")


@pytest.fixture
def load_host() -> Iterator[LoadHost]:
    """LocalService.from_repository, closing every host it made after the test."""
    hosts: list[LocalService] = []

    def load(repo: pathlib.Path) -> LocalService:
        hosts.append(LocalService.from_repository(repo))
        return hosts[-1]

    yield load
    for host in hosts:
        host.close()


def entries(host: LocalService) -> dict[str, IndexEntry]:
    return {e.name: e for e in host.service.repository_index()}


def test_a_model_whose_instance_fails_to_load_is_unavailable_and_the_others_serve(
    tmp_path: pathlib.Path, load_host: LoadHost
) -> None:
    example_models.add_sub(tmp_path, name="good", dims=DIMS)
    corrupt(tmp_path, "bad")
    host = load_host(tmp_path)
    assert host.service.model_ready("good") and not host.service.model_ready("bad")
    bad = entries(host)["bad"]
    assert (bad.version, bad.state) == ("", "UNAVAILABLE") and bad.reason
    with pytest.raises(Unavailable, match=r"^Request for unknown model: 'bad' has no available versions: "):
        host.service.model("bad")
    assert list(host.instances) == [ModelKey("good", 1)]


def test_a_failing_warmup_fails_its_model_naming_the_sample(tmp_path: pathlib.Path, load_host: LoadHost) -> None:
    example_models.add_sub(tmp_path, name="good", dims=DIMS)
    example_models.add_sub(tmp_path, name="cold", dims=DIMS, extra_config=warmup("broken", input_name="NOPE"))
    host = load_host(tmp_path)
    reason = entries(host)["cold"].reason
    assert "broken" in reason and "NOPE" in reason
    assert host.service.model_ready("good") and list(host.instances) == [ModelKey("good", 1)]


def test_a_model_whose_config_is_invalid_is_listed_with_its_reason(tmp_path: pathlib.Path, load_host: LoadHost) -> None:
    example_models.add_sub(tmp_path, name="good", dims=DIMS)
    example_models.add_sub(tmp_path, name="typo", dims=DIMS)
    (tmp_path / "typo" / "config.pbtxt").write_text('name: "typo"\nmax_batch_size: eight\n')
    host = load_host(tmp_path)
    typo = entries(host)["typo"]
    assert typo.state == "UNAVAILABLE" and "typo" in typo.reason
    assert host.service.model_ready("good")


async def test_warmup_executions_count_in_the_statistics(tmp_path: pathlib.Path, load_host: LoadHost) -> None:
    example_models.add_sub(tmp_path, dims=DIMS, extra_config=warmup(batch_size=2, count=3))
    example_models.add_sub(tmp_path, name="plain", dims=DIMS)
    host = load_host(tmp_path)
    [warm] = await host.service.model_statistics("add_sub")
    assert (warm.execution_count, warm.inference_count) == (3, 6)
    assert warm.batches[2]["compute_infer"].count == 3
    [plain] = await host.service.model_statistics("plain")
    assert (plain.execution_count, plain.inference_count) == (0, 0)


def test_an_ensemble_whose_step_is_missing_fails(tmp_path: pathlib.Path, load_host: LoadHost) -> None:
    example_models.add_sub(tmp_path, dims=DIMS)
    example_models.add_sub_ensemble(tmp_path, name="ens", dims=DIMS)
    example_models.add_sub_ensemble(tmp_path, name="orphan", step_model="missing", dims=DIMS)
    host = load_host(tmp_path)
    assert host.service.model_ready("ens")
    assert entries(host)["orphan"] == IndexEntry(
        "orphan", "", "UNAVAILABLE", "ensemble_scheduling.step[0]: model 'missing' is not available"
    )
    assert ModelKey("orphan", 1) not in host.instances and ModelKey("ens", 1) not in host.instances


def test_an_ensemble_whose_step_failed_to_load_is_not_ready(tmp_path: pathlib.Path, load_host: LoadHost) -> None:
    corrupt(tmp_path, "add_sub")
    example_models.add_sub_ensemble(tmp_path, name="ens", dims=DIMS)
    host = load_host(tmp_path)
    ens = host.service.registry.resolve("ens")
    assert (ens.state, ens.reason) == (ModelState.UNAVAILABLE, "composing model 'add_sub' is not ready")
    assert not host.service.model_ready("ens")


def test_server_name_is_what_metadata_reports(tmp_path: pathlib.Path) -> None:
    """``--server-name triton`` for scripts written against Triton (they check server metadata's name)."""
    from serve_app.cli import build_parser, settings_from

    settings = settings_from(
        build_parser().parse_args(["--model-repository", str(tmp_path), "--server-name", "triton"])
    )
    assert settings.server_name == "triton"
    host = LocalService.from_repository(tmp_path, server_name=settings.server_name)
    try:
        assert host.service.server_metadata().name == "triton"
    finally:
        host.close()
