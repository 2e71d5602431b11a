"""The integration tests' repository: a few small ONNX models covering the front ends' paths."""

from __future__ import annotations

import pathlib
import shutil

from scripts import example_models

# Models in the shared repository.
ADD_SUB = "add_sub"  # FP32 [16], max_batch_size 8: OUTPUT0 = a + b, OUTPUT1 = a - b
IDENTITY_FP32 = "identity_fp32"  # one input: the raw binary request works
IDENTITY_BYTES = "identity_bytes"
GENERATED = "generated"  # no config.pbtxt: generated from the ONNX file
VERSIONED = "versioned"  # versions 1, 2, 3 on disk; the policy serves 2 and 3
BROKEN = "broken"  # invalid config: listed UNAVAILABLE, nothing served


def build_repository(repo: pathlib.Path) -> pathlib.Path:
    example_models.add_sub(repo, name=ADD_SUB)
    example_models.identity(repo, "FP32", name=IDENTITY_FP32)
    example_models.identity(repo, "BYTES", name=IDENTITY_BYTES)
    example_models.no_config_onnx(repo, GENERATED)
    example_models.add_sub(
        repo, name=VERSIONED, versions=(1, 2, 3), extra_config="version_policy: { latest { num_versions: 2 } }"
    )
    broken = repo / BROKEN
    (broken / "1").mkdir(parents=True)
    shutil.copy(repo / ADD_SUB / "1" / "model.onnx", broken / "1" / "model.onnx")
    (broken / "config.pbtxt").write_text(f'name: "{BROKEN}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: -3\n')
    return repo
