"""scripts/example_models.py: each model loads in onnxruntime, computes what it says, and
its config.pbtxt parses as our ModelConfig and matches the ONNX file."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format

from scripts import example_models as em, gen_example_repo
from serve_app.protos import model_config_pb2 as mc


def session(model_dir: pathlib.Path, version: int = 1) -> ort.InferenceSession:
    return ort.InferenceSession(str(model_dir / str(version) / "model.onnx"), providers=["CPUExecutionProvider"])


def config(model_dir: pathlib.Path) -> mc.ModelConfig:
    return text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())


def sample(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = em.ONNX_TYPES[datatype][1]
    if datatype == "BYTES":
        words = ["", "a", "héllo", "with space", "x" * 40]
        flat = [words[i % len(words)] for i in range(int(np.prod(shape)))]
        return np.array(flat, dtype=object).reshape(shape)
    if datatype == "BOOL":
        return rng.random(shape) < 0.5
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def onnx_dims(model_dir: pathlib.Path, tensor: str) -> list[int | str]:
    graph = onnx.load(str(model_dir / "1" / "model.onnx")).graph
    (vi,) = [v for v in [*graph.input, *graph.output] if v.name == tensor]
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


# --- add_sub ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", em.ADD_SUB_DATATYPES)
def test_add_sub_sums_and_differences(tmp_path: pathlib.Path, dtype: str) -> None:
    model_dir = em.add_sub(tmp_path, name=f"add_sub_{dtype.lower()}", dtype=dtype)
    a, b = sample(dtype, (3, 16), seed=1), sample(dtype, (3, 16), seed=2)
    out0, out1 = session(model_dir).run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    with np.errstate(over="ignore"):  # integer wrap-around is what both sides do
        np.testing.assert_array_equal(out0, a + b)
        np.testing.assert_array_equal(out1, a - b)
    assert out0.dtype == a.dtype


def test_add_sub_config_matches_triton_simple(tmp_path: pathlib.Path) -> None:
    model_dir = em.add_sub(tmp_path)
    cfg = config(model_dir)
    assert (cfg.name, cfg.platform, cfg.backend, cfg.max_batch_size) == (
        "add_sub",
        "onnxruntime_onnx",
        "onnxruntime",
        8,
    )
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in cfg.input] == [
        ("INPUT0", "TYPE_FP32", [16]),
        ("INPUT1", "TYPE_FP32", [16]),
    ]
    assert [t.name for t in cfg.output] == ["OUTPUT0", "OUTPUT1"]
    assert not cfg.HasField("dynamic_batching")
    assert onnx_dims(model_dir, "INPUT0") == ["batch", 16]


def test_add_sub_options(tmp_path: pathlib.Path) -> None:
    model_dir = em.add_sub(tmp_path, name="s", max_batch_size=0, dims=4, dtype="INT32", dynamic_batching=True)
    cfg = config(model_dir)
    assert cfg.max_batch_size == 0
    assert cfg.HasField("dynamic_batching")
    assert mc.DataType.Name(cfg.input[0].data_type) == "TYPE_INT32"
    assert onnx_dims(model_dir, "OUTPUT1") == [4]
    a = np.arange(4, dtype=np.int32)
    out0, out1 = session(model_dir).run(None, {"INPUT0": a, "INPUT1": a})
    np.testing.assert_array_equal(out0, 2 * a)
    np.testing.assert_array_equal(out1, 0 * a)


def test_add_sub_rejects_unsupported_dtype(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="BOOL"):
        em.add_sub(tmp_path, dtype="BOOL")


# --- identity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", em.IDENTITY_DATATYPES)
def test_identity_round_trips(tmp_path: pathlib.Path, datatype: str) -> None:
    model_dir = em.identity(tmp_path, datatype)
    assert model_dir.name == f"identity_{datatype.lower()}"
    x = sample(datatype, (2, 5))
    (y,) = session(model_dir).run(None, {"INPUT0": x})
    assert y.shape == x.shape
    if datatype == "BYTES":
        assert y.tolist() == x.tolist()
    else:
        assert y.dtype == x.dtype
        np.testing.assert_array_equal(y, x)

    cfg = config(model_dir)
    assert cfg.max_batch_size == 8
    for tensor in (cfg.input[0], cfg.output[0]):
        assert mc.DataType.Name(tensor.data_type) == em.config_type(datatype)
        assert list(tensor.dims) == [-1]


def test_identity_datatypes_cover_the_brief() -> None:
    expected = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
    expected |= {"FP16", "FP32", "FP64", "BYTES"}
    assert set(em.IDENTITY_DATATYPES) == expected
    assert em.config_type("BYTES") == "TYPE_STRING"


def test_identity_name_and_no_batch(tmp_path: pathlib.Path) -> None:
    model_dir = em.identity(tmp_path, "INT64", name="echo", max_batch_size=0)
    assert model_dir == tmp_path / "echo"
    assert config(model_dir).max_batch_size == 0
    assert onnx_dims(model_dir, "INPUT0") == ["n"]
    x = np.arange(7, dtype=np.int64)
    np.testing.assert_array_equal(session(model_dir).run(None, {"INPUT0": x})[0], x)


# --- mlp --------------------------------------------------------------------------------------


def reference_mlp(model_dir: pathlib.Path, x: np.ndarray) -> np.ndarray:
    """The same network in numpy, from the ONNX file's own weights and node order."""
    graph = onnx.load(str(model_dir / "1" / "model.onnx")).graph
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    h = x
    for node in graph.node:
        if node.op_type == "Gemm":
            h = h @ weights[node.input[1]].T + weights[node.input[2]]
        elif node.op_type == "Relu":
            h = np.maximum(h, 0)
    return h


def test_mlp_computes_the_network(tmp_path: pathlib.Path) -> None:
    model_dir = em.mlp(tmp_path, in_dim=8, hidden=32, out_dim=4, layers=5)
    graph = onnx.load(str(model_dir / "1" / "model.onnx")).graph
    assert [n.op_type for n in graph.node].count("Gemm") == 5
    x = np.random.default_rng(3).standard_normal((6, 8)).astype(np.float32)
    (y,) = session(model_dir).run(None, {"INPUT0": x})
    assert y.shape == (6, 4)
    np.testing.assert_allclose(y, reference_mlp(model_dir, x), rtol=1e-4, atol=1e-5)


def test_mlp_is_deterministic_per_seed(tmp_path: pathlib.Path) -> None:
    kw = {"in_dim": 4, "hidden": 8, "out_dim": 2, "layers": 3}

    def weights(name: str, seed: int) -> list[np.ndarray]:
        graph = onnx.load(str(em.mlp(tmp_path, name=name, seed=seed, **kw) / "1" / "model.onnx")).graph
        return [onnx.numpy_helper.to_array(t) for t in graph.initializer]

    a, b, c = weights("a", 7), weights("b", 7), weights("c", 8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_mlp_config_and_dynamic_batching(tmp_path: pathlib.Path) -> None:
    plain = config(em.mlp(tmp_path, name="plain", in_dim=4, hidden=8, out_dim=2, layers=2))
    assert plain.max_batch_size == 64 and not plain.HasField("dynamic_batching")
    assert (list(plain.input[0].dims), list(plain.output[0].dims)) == ([4], [2])

    on = config(em.mlp(tmp_path, name="on", in_dim=4, hidden=8, out_dim=2, layers=2, dynamic_batching=True))
    assert on.HasField("dynamic_batching")
    assert list(on.dynamic_batching.preferred_batch_size) == []

    tuned = config(
        em.mlp(
            tmp_path,
            name="tuned",
            in_dim=4,
            hidden=8,
            out_dim=2,
            layers=2,
            preferred=[4, 8],
            max_queue_delay_us=500,
        )
    )
    assert list(tuned.dynamic_batching.preferred_batch_size) == [4, 8]
    assert tuned.dynamic_batching.max_queue_delay_microseconds == 500


def test_mlp_without_batch_dim(tmp_path: pathlib.Path) -> None:
    batched = em.mlp(tmp_path, name="b", in_dim=8, hidden=16, out_dim=3, layers=3)
    flat = em.mlp(tmp_path, name="f", in_dim=8, hidden=16, out_dim=3, layers=3, max_batch_size=0)
    assert onnx_dims(flat, "INPUT0") == [8]
    x = np.random.default_rng(0).standard_normal(8).astype(np.float32)
    (y,) = session(flat).run(None, {"INPUT0": x})
    assert y.shape == (3,)
    np.testing.assert_allclose(y, session(batched).run(None, {"INPUT0": x[None]})[0][0], rtol=1e-6)


def test_mlp_default_size_runs(tmp_path: pathlib.Path) -> None:
    model_dir = em.mlp(tmp_path)
    x = np.random.default_rng(0).random((2, em.MLP_IN_DIM), dtype=np.float32)
    (y,) = session(model_dir).run(None, {"INPUT0": x})
    assert y.shape == (2, em.MLP_OUT_DIM)
    assert np.isfinite(y).all() and 1e-3 < np.abs(y).max() < 1e3  # He scaling keeps it in range
    assert em.time_mlp_ms(model_dir, iters=2) > 0


# --- no config, versions, the example repository ---------------------------------------------


def test_no_config_onnx(tmp_path: pathlib.Path) -> None:
    model_dir = em.no_config_onnx(tmp_path, "bare")
    assert not (model_dir / "config.pbtxt").exists()
    assert onnx_dims(model_dir, "INPUT0") == ["batch", 16]
    a = np.ones((2, 16), np.float32)
    out0, out1 = session(model_dir).run(None, {"INPUT0": a, "INPUT1": a})
    np.testing.assert_array_equal(out0, 2 * a)
    np.testing.assert_array_equal(out1, 0 * a)


@pytest.mark.parametrize(
    "build",
    [
        lambda repo, v: em.add_sub(repo, versions=v),
        lambda repo, v: em.identity(repo, "FP32", versions=v),
        lambda repo, v: em.mlp(repo, in_dim=4, hidden=8, out_dim=2, layers=2, versions=v),
        lambda repo, v: em.no_config_onnx(repo, "bare", versions=v),
    ],
    ids=["add_sub", "identity", "mlp", "no_config_onnx"],
)
def test_versions_write_one_dir_each(
    tmp_path: pathlib.Path, build: Callable[[pathlib.Path, tuple[int, ...]], pathlib.Path]
) -> None:
    model_dir = build(tmp_path, (1, 2, 5))
    assert sorted(p.name for p in model_dir.iterdir() if p.is_dir()) == ["1", "2", "5"]
    for v in (1, 2, 5):
        session(model_dir, v)


def test_versions_must_not_be_empty(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="versions"):
        em.add_sub(tmp_path, versions=())


def test_extra_config_is_appended(tmp_path: pathlib.Path) -> None:
    extra = "instance_group [ { kind: KIND_CPU count: 2 } ]"
    cfg = config(em.add_sub(tmp_path, extra_config=extra))
    groups = [(mc.ModelInstanceGroup.Kind.Name(g.kind), g.count) for g in cfg.instance_group]
    assert groups == [("KIND_CPU", 2)]


def test_gen_example_repo(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gen_example_repo.main([str(tmp_path / "repo"), "--no-timing"]) == 0
    names = sorted(p.name for p in (tmp_path / "repo").iterdir())
    python = ["py_add_sub", "py_chain", "py_echo_text", "py_llm", "py_preprocess", "py_tokens"]
    assert names == sorted(["add_sub", "add_sub_ensemble", "identity_bytes", "identity_fp32", "mlp", *python])
    for name in names:
        assert config(tmp_path / "repo" / name).name == name
        if name in python:
            assert (tmp_path / "repo" / name / "1" / "model.py").is_file()
        elif name != "add_sub_ensemble":  # an ensemble has no model file
            session(tmp_path / "repo" / name)
    assert "mlp" in capsys.readouterr().out
