"""Our .proto schema: generated modules are current, and wire compatible with Triton's."""

from __future__ import annotations

import pathlib

import pytest
from google.protobuf import descriptor as d

from serve_app.protos import grpc_service_pb2, model_config_pb2
from tests.support.paths import ROOT


def test_generated_modules_are_current(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("grpc_tools")
    from scripts import gen_protos

    gen_protos.compile_to(tmp_path)
    for name in ("model_config_pb2.py", "grpc_service_pb2.py"):
        fresh = (tmp_path / "serve_app" / "protos" / name).read_text()
        checked_in = (ROOT / "serve_app" / "protos" / name).read_text()
        assert fresh == checked_in, f"{name} is stale: run `python -m scripts.gen_protos`"


def _fields(msg: d.Descriptor) -> dict[str, tuple[int, int, bool, str]]:
    out = {}
    for f in msg.fields:
        sub = f.message_type.name if f.message_type else (f.enum_type.name if f.enum_type else "")
        out[f.name] = (f.number, f.type, f.is_repeated, sub)
    return out


def _walk(ours: d.Descriptor, theirs: d.Descriptor, path: str) -> None:
    assert _fields(ours) == _fields(theirs), path
    for name, nested in theirs.nested_types_by_name.items():
        _walk(ours.nested_types_by_name[name], nested, f"{path}.{name}")
    for name, enum in theirs.enum_types_by_name.items():
        mine = ours.enum_types_by_name[name]
        assert {v.name: v.number for v in mine.values} == {v.name: v.number for v in enum.values}, f"{path}.{name}"


@pytest.mark.parametrize("module", ["model_config", "grpc_service"])
def test_field_compatible_with_tritonclient(module: str) -> None:
    tc = pytest.importorskip("tritonclient.grpc")
    theirs = {"model_config": tc.model_config_pb2, "grpc_service": tc.service_pb2}[module].DESCRIPTOR
    ours = {"model_config": model_config_pb2, "grpc_service": grpc_service_pb2}[module].DESCRIPTOR
    assert set(ours.message_types_by_name) == set(theirs.message_types_by_name)
    for name, msg in theirs.message_types_by_name.items():
        _walk(ours.message_types_by_name[name], msg, name)
    for name, enum in theirs.enum_types_by_name.items():
        assert [(v.name, v.number) for v in ours.enum_types_by_name[name].values] == [
            (v.name, v.number) for v in enum.values
        ]


def test_service_methods_match() -> None:
    tc = pytest.importorskip("tritonclient.grpc")
    theirs = tc.service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    ours = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert [(m.name, m.input_type.name, m.output_type.name) for m in ours.methods] == [
        (m.name, m.input_type.name, m.output_type.name) for m in theirs.methods
    ]
