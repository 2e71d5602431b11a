"""E2E models for ensembles and classification.

ens_onnx   ensemble of four add_sub (ONNX) steps: OUT_2A = 2a, OUT_2B = 2b, OUT_SUM = a + b
ens_mixed  add_sub (ONNX) then ts_add_sub (TorchScript): OUT_2A = 2a, OUT_2B = 2b (only with PyTorch)
ens_square py_square (decoupled: IN = n, n responses n) then square_ident (ONNX identity INT32): a decoupled
           ensemble answering n times OUT = n
ens_square_declared  the same, whose config declares ``decoupled: true`` itself
scores     identity FP32 [-1] whose output has a label file (classification extension)
"""

from __future__ import annotations

import pathlib

from scripts import example_models
from tests.e2e import torchscript_models

SCORE_LABELS = ["zero", "one", "two", "three"]


def mixed_ensemble(repo: pathlib.Path, name: str = "ens_mixed") -> pathlib.Path:
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN_A" data_type: TYPE_FP32 dims: [ 16 ] }, '
        '{ name: "IN_B" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUT_2A" data_type: TYPE_FP32 dims: [ 16 ] }, '
        '{ name: "OUT_2B" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        "ensemble_scheduling { step [\n"
        '  { model_name: "add_sub" model_version: -1 input_map { key: "INPUT0" value: "IN_A" } '
        'input_map { key: "INPUT1" value: "IN_B" } output_map { key: "OUTPUT0" value: "sum" } '
        'output_map { key: "OUTPUT1" value: "diff" } },\n'
        '  { model_name: "ts_add_sub" model_version: -1 input_map { key: "INPUT__0" value: "sum" } '
        'input_map { key: "INPUT__1" value: "diff" } output_map { key: "OUTPUT__0" value: "OUT_2A" } '
        'output_map { key: "OUTPUT__1" value: "OUT_2B" } }\n'
        "] }\n"
    )
    return d


def decoupled_ensemble(
    repo: pathlib.Path, name: str = "ens_square", step: str = "py_square", *, declared: bool = False
) -> pathlib.Path:
    """``step`` (a decoupled model: IN INT32 [1] -> OUT INT32 [1]) then an ONNX identity on each response;
    ``declared``: the ensemble's config says ``decoupled: true`` itself, as it may in Triton."""
    example_models.identity(repo, "INT32", name="square_ident", max_batch_size=0)
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    policy = "model_transaction_policy { decoupled: true }\n" if declared else ""
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n{policy}'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        "ensemble_scheduling { step [\n"
        f'  {{ model_name: "{step}" model_version: -1 input_map {{ key: "IN" value: "IN" }} '
        'output_map { key: "OUT" value: "n" } },\n'
        '  { model_name: "square_ident" model_version: -1 input_map { key: "INPUT0" value: "n" } '
        'output_map { key: "OUTPUT0" value: "OUT" } }\n'
        "] }\n"
    )
    return d


def build_all(repo: pathlib.Path) -> None:
    example_models.add_sub_ensemble(repo, name="ens_onnx", step_model="add_sub")
    decoupled_ensemble(repo)  # its step py_square comes from python_models.build_e2e
    decoupled_ensemble(repo, name="ens_square_declared", declared=True)
    if torchscript_models.torch_available():
        mixed_ensemble(repo)
    d = example_models.identity(repo, "FP32", name="scores")
    (d / "labels.txt").write_text("\n".join(SCORE_LABELS) + "\n")
    config = d / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "OUTPUT0"', 'name: "OUTPUT0" label_filename: "labels.txt"'))
