"""Model warmup (``model_warmup`` in config.pbtxt), as Triton runs it.

Every instance runs the config's warmup samples, in order, before it is
reported ready; a sample that cannot be built or whose execution fails fails
the instance's load, naming the sample.  Triton's rules
(``TritonModelInstance::GenerateWarmupData`` and ``WarmUp`` in
triton-inference-server/core ``backend_model_instance.cc``):

- a sample with ``batch_size`` 0 is skipped; ``count`` 0 runs it once;
- each sample is one execution of ``batch_size`` identical rows (Triton builds
  ``batch_size`` requests of batch 1 and executes them together), so for a
  model with ``max_batch_size > 0`` every input gets a leading batch
  dimension; a model that does not batch gets ``dims`` as they are;
- every dimension must be given (no ``-1``);
- ``zero_data``: zeros; for TYPE_STRING, empty strings;
- ``random_data``: random bytes read as the input's type (one buffer per
  sample, each input taking its prefix); for TYPE_STRING it falls back to
  ``zero_data`` (empty strings);
- ``input_data_file``: ``<model dir>/warmup/<file>``, raw and row-major: at
  least the tensor's byte size (a longer file is used up to that size); for
  TYPE_STRING the file holds the elements serialized as Triton does (a
  4-byte little-endian length, then the bytes, per element);
- inputs that are not in the config's ``input`` (control or state tensors
  of a sequence model) are fed as given: Triton generates no control or
  state tensors for warmup, the sample must list them;
- the outputs are not checked; the first failing execution ends the warmup.

Stricter than Triton: the file must stay inside ``warmup/``, and ``warmup/``
inside the model directory (no absolute path, no ``..``, no symlink leading
out: ``serve_app.security.paths``), and an input the config declares must
match its data type and dims, as a request's would.

Everything here is pure (no Ray): :func:`build_samples` turns the config into
executions, :func:`run_samples` runs them through the instance's ``run``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from serve_app import datatypes
from serve_app.datatypes import DataType
from serve_app.errors import InvalidArgument
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.inference.signature import ModelSignature, format_dims
from serve_app.protos import model_config_pb2 as mc
from serve_app.security.paths import confined

Run = Callable[[Execution], ExecutionResult]  # one execution on the instance being warmed up

WARMUP_DIR = "warmup"


class WarmupError(InvalidArgument):
    """A warmup sample that cannot be built or run (Triton answers INVALID_ARG)."""


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """One ``model_warmup`` entry, ready to run ``count`` times."""

    name: str
    count: int
    execution: Execution


@dataclass(slots=True)
class WarmupReport:
    """What an instance's warmup ran (its figures, for a log line or the statistics)."""

    samples: list[str] = field(default_factory=list)  # names, in the order run
    skipped: list[str] = field(default_factory=list)  # batch_size 0
    executions: int = 0
    inferences: int = 0  # rows executed: batch size (1 for a model that does not batch) x count
    elapsed_ns: int = 0
    results: list[ExecutionResult] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)  # rows of each execution, for the statistics

    def figures(self) -> list[tuple[int, int, int, int]]:
        """(batch size, compute input, infer, output ns) of each execution: what the statistics count."""
        return [
            (rows, r.compute_input_ns, r.compute_infer_ns, r.compute_output_ns)
            for rows, r in zip(self.batch_sizes, self.results, strict=True)
        ]

    def describe(self, model: str, version: int | str) -> str:
        ms = self.elapsed_ns / 1e6
        text = (
            f"model '{model}' version {version}: instance warmed up: {len(self.samples)} sample(s), "
            f"{self.executions} execution(s) in {ms:.1f} ms"
        )
        if self.skipped:
            text += f" (skipped with batch_size 0: {', '.join(repr(s) for s in self.skipped)})"
        return text


def warmup_file(model_dir: Path, file_name: str) -> Path:
    """``<model_dir>/warmup/<file_name>``, resolved, refusing anything that leads out of ``warmup/``."""
    within = f"the model's '{WARMUP_DIR}' directory"
    target = confined(model_dir / WARMUP_DIR, file_name, "input_data_file", root=model_dir, within=within)
    if not target.is_file():
        raise InvalidArgument(f"input_data_file '{file_name}' is not a file in the model's '{WARMUP_DIR}' directory")
    return target


def parse_strings(data: bytes, count: int, source: str) -> np.ndarray:
    """``count`` BYTES elements serialized as Triton does (4-byte little-endian length, then the bytes)."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise InvalidArgument(f"{source} ends inside the length of string element {len(out)}")
        (size,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if pos + size > len(data):
            raise InvalidArgument(
                f"{source}: string element {len(out)} needs {size} bytes, only {len(data) - pos} are left"
            )
        out.append(bytes(data[pos : pos + size]))
        pos += size
    if len(out) != count:
        raise InvalidArgument(f"{source} holds {len(out)} string element(s), {count} expected")
    arr = np.empty(count, dtype=object)
    arr[:] = out
    return arr


def _from_bytes(raw: bytes, dt: DataType, count: int) -> np.ndarray:
    """``count`` elements of ``dt`` from raw little-endian bytes (at least ``count * itemsize`` of them)."""
    if dt.numpy == np.bool_:
        return cast(np.ndarray, np.frombuffer(raw, dtype=np.uint8, count=count) != 0)  # numpy's stubs: Any for !=
    return np.frombuffer(raw, dtype=dt.numpy.newbyteorder("<"), count=count).astype(dt.numpy)


def _sample_input(
    name: str,
    spec: mc.ModelWarmup.Input,
    dt: DataType,
    dims: tuple[int, ...],
    model_dir: Path,
    random_buffer: bytes,
) -> np.ndarray:
    """One row of input ``name`` (shape ``dims``, no batch dimension)."""
    count = int(np.prod(dims, dtype=np.int64))
    which = spec.WhichOneof("input_data_type")
    is_string = dt.itemsize == 0
    if which == "zero_data" or (which == "random_data" and is_string):
        if is_string:
            flat = np.empty(count, dtype=object)
            flat[:] = [b""] * count
            return flat.reshape(dims)
        return np.zeros(dims, dtype=dt.numpy)
    if which == "random_data":
        return _from_bytes(random_buffer, dt, count).reshape(dims)
    if which == "input_data_file":
        path = warmup_file(model_dir, spec.input_data_file)
        source = f"input_data_file '{spec.input_data_file}'"
        if is_string:
            return parse_strings(path.read_bytes(), count, source).reshape(dims)
        need = count * dt.itemsize
        size = path.stat().st_size
        if size < need:
            raise InvalidArgument(
                f"input '{name}' expects {need} bytes, but the data provided from {source} only has {size} bytes"
            )
        with path.open("rb") as f:
            raw = f.read(need)
        return _from_bytes(raw, dt, count).reshape(dims)
    raise InvalidArgument(f"input '{name}' must set one of 'zero_data', 'random_data' or 'input_data_file'")


def _input_type(name: str, spec: mc.ModelWarmup.Input) -> DataType:
    type_name = mc.DataType.Name(spec.data_type) if spec.data_type in mc.DataType.values() else str(spec.data_type)
    try:
        return datatypes.from_config(type_name)
    except InvalidArgument:
        raise InvalidArgument(f"input '{name}' has unsupported data type '{type_name}'") from None


def _check_declared(name: str, dt: DataType, dims: tuple[int, ...], signature: ModelSignature) -> None:
    """An input the config declares must get what a request would have to send."""
    declared = signature.inputs.get(name)
    if declared is None:
        return  # a control or state tensor: fed as given, as Triton does
    if dt != declared.datatype:
        raise InvalidArgument(
            f"input '{name}' has data type {dt.config_name}, the model's input is {declared.datatype.config_name}"
        )
    if not declared.matches(dims):
        raise InvalidArgument(
            f"input '{name}' has dims {format_dims(dims)}, the model's input has dims {format_dims(declared.dims)}"
        )


def build_sample(
    config: mc.ModelConfig,
    warmup: mc.ModelWarmup,
    model_dir: Path,
    *,
    rng: np.random.Generator | None = None,
    signature: ModelSignature | None = None,
) -> WarmupSample:
    """The execution of one warmup sample (``batch_size`` rows of the same data); raises WarmupError."""
    sig = signature if signature is not None else ModelSignature.from_config(config, "")
    batching = config.max_batch_size > 0
    batch = int(warmup.batch_size)
    try:
        if batch < 1:
            raise InvalidArgument("batch_size must be >= 1")
        if not batching and batch != 1:
            raise InvalidArgument(f"batch_size must be 1 for a model that does not batch; got {batch}")
        if batching and batch > config.max_batch_size:
            raise InvalidArgument(f"batch_size must be <= max_batch_size ({config.max_batch_size}); got {batch}")
        shapes: dict[str, tuple[DataType, tuple[int, ...]]] = {}
        random_bytes = 0
        for name in sorted(warmup.inputs):
            spec = warmup.inputs[name]
            dims = tuple(int(d) for d in spec.dims)
            if any(d < 0 for d in dims):
                raise InvalidArgument(f"all variable-size dimensions must be specified for input '{name}'")
            dt = _input_type(name, spec)
            _check_declared(name, dt, dims, sig)
            shapes[name] = (dt, dims)
            if spec.WhichOneof("input_data_type") == "random_data" and dt.itemsize:
                random_bytes = max(random_bytes, int(np.prod(dims, dtype=np.int64)) * dt.itemsize)
        gen = rng if rng is not None else np.random.default_rng()
        random_buffer = gen.bytes(random_bytes) if random_bytes else b""
        inputs: dict[str, np.ndarray] = {}
        for name, (dt, dims) in shapes.items():
            row = _sample_input(name, warmup.inputs[name], dt, dims, model_dir, random_buffer)
            inputs[name] = np.repeat(row[np.newaxis], batch, axis=0) if batching else np.ascontiguousarray(row)
    except InvalidArgument as exc:
        raise WarmupError(f"model '{config.name}': warmup sample '{warmup.name}': {exc.message}") from None
    except OSError as exc:
        raise WarmupError(
            f"model '{config.name}': warmup sample '{warmup.name}': cannot read its data: {exc.strerror or exc}"
        ) from None
    outputs = tuple(o.name for o in config.output)
    execution = Execution(inputs=inputs, outputs=outputs, batch_size=batch if batching else 0)
    return WarmupSample(name=warmup.name, count=max(int(warmup.count), 1), execution=execution)


def build_samples(
    config: mc.ModelConfig,
    model_dir: Path,
    *,
    rng: np.random.Generator | None = None,
    signature: ModelSignature | None = None,
) -> tuple[list[WarmupSample], list[str]]:
    """The samples to run, in config order, and the names of those skipped (batch_size 0)."""
    sig = signature if signature is not None else ModelSignature.from_config(config, "")
    samples: list[WarmupSample] = []
    skipped: list[str] = []
    for warmup in config.model_warmup:
        if warmup.batch_size == 0:
            skipped.append(warmup.name)
            continue
        samples.append(build_sample(config, warmup, model_dir, rng=rng, signature=sig))
    return samples, skipped


def run_samples(run: Run, samples: list[WarmupSample], model: str) -> WarmupReport:
    """Run each sample ``count`` times, in order, through ``run``; the first failure raises WarmupError."""
    report = WarmupReport()
    t0 = time.perf_counter_ns()
    for sample in samples:
        rows = max(sample.execution.batch_size, 1)
        for _ in range(sample.count):
            result = run(sample.execution)
            if result.error is not None:
                raise WarmupError(
                    f"model '{model}': failed to run warmup sample '{sample.name}': {result.error.message}"
                )
            report.results.append(result)
            report.batch_sizes.append(rows)
            report.executions += 1
            report.inferences += rows
        report.samples.append(sample.name)
    report.elapsed_ns = time.perf_counter_ns() - t0
    return report


def warm_up(
    config: mc.ModelConfig,
    signature: ModelSignature,
    run: Run,
    model_dir: Path,
    *,
    rng: np.random.Generator | None = None,
) -> WarmupReport:
    """Build the config's warmup samples and run them through ``run`` (none: an empty report); raises
    WarmupError."""
    samples, skipped = build_samples(config, model_dir, rng=rng, signature=signature)
    report = run_samples(run, samples, config.name)
    report.skipped = skipped
    return report
