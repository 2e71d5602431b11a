"""TensorRT engine: one deserialized ``model.plan`` per instance, run with the I/O tensor API.

Platform ``tensorrt_plan`` (backend ``tensorrt``), as Triton's tensorrt backend:

* Load: ``tensorrt.Runtime.deserialize_cuda_engine`` on the instance's GPU, the
  engine's I/O read into plain metadata
  (:class:`~serve_app.backends.tensorrt_logic.EngineMetadata`) and the config
  checked against it (names, types, shape-tensor flags, dims, max batch).
* Optimization profiles: the instance may use the profiles its instance group
  lists in ``profile`` (profile 0 when it lists none).  One execution context per
  profile, made once (``set_optimization_profile_async``); each execution picks
  the admissible profile whose ``opt`` shapes are nearest to the request's.
* Execution: ``set_input_shape`` for every input, ``set_tensor_address`` for
  every tensor, ``execute_async_v3`` on the instance's CUDA stream.  Shape-tensor
  inputs (``is_shape_tensor``) are values, not device buffers: their address is
  host memory holding the values (the batch size first when the model batches).
* Device memory: **cuda-python** (``cuda.bindings.runtime``, or the older
  ``cuda.cudart``), the runtime API TensorRT's own Python samples use: device
  buffers per tensor that grow on demand, one stream per instance.
  ``optimization.input_pinned_memory`` / ``output_pinned_memory`` (default on)
  stage host<->device copies through page-locked buffers (``cudaMallocHost``);
  off, copies go straight from/to the request's (pageable) numpy memory.

Everything that needs no GPU is in :mod:`serve_app.backends.tensorrt_logic`.
``tensorrt`` and ``cuda-python`` are imported only when a TensorRT model loads;
without them the load fails with a message naming the ``gpu`` extra.
"""

from __future__ import annotations

import collections
import ctypes
from pathlib import Path
from typing import Any, cast

import numpy as np

from serve_app.backends.base import Backend, BackendContext
from serve_app.backends.tensorrt_logic import (
    EngineMetadata,
    EngineTensor,
    ProfileRange,
    check_config,
    complete_config_from_engine,
    instance_profiles,
    nbytes,
    numpy_dtype,
    output_shape,
    select_profile,
    shape_tensor_values,
    trt_dtype_name,
)
from serve_app.errors import InternalError, InvalidArgument, InvalidConfig, ServeError
from serve_app.protos import model_config_pb2 as mc

_GPU_EXTRA = "install the 'gpu' extra (pip install 'serve_app[gpu]')"
_MIN_ALLOCATION = 256  # bytes: TensorRT wants a real address even for an empty tensor


def import_tensorrt(model: str) -> Any:
    try:
        import tensorrt
    except ImportError as exc:
        raise InvalidConfig(
            f"model '{model}': the TensorRT backend needs the 'tensorrt' package, which is not installed "
            f"({exc}); {_GPU_EXTRA}"
        ) from None
    return tensorrt


def import_cudart(model: str) -> Any:
    """cuda-python's runtime API module, under its current or its older name."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart
        except ImportError as exc:
            raise InvalidConfig(
                f"model '{model}': the TensorRT backend needs the 'cuda-python' package for device memory, "
                f"which is not installed ({exc}); {_GPU_EXTRA}"
            ) from None
    return cudart


class _Cuda:
    """The few CUDA runtime calls the backend makes, with errors raised."""

    def __init__(self, cudart: Any) -> None:
        self.rt = cudart
        self._ok = cudart.cudaError_t.cudaSuccess
        self.h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost

    def check(self, what: str, result: Any) -> Any:
        """cuda-python returns ``(error, *values)``: raise on error, return the value(s)."""
        if not isinstance(result, tuple):
            result = (result,)
        err, rest = result[0], result[1:]
        if err != self._ok:
            raise RuntimeError(f"{what} failed: {getattr(err, 'name', err)}")
        if not rest:
            return None
        return rest[0] if len(rest) == 1 else rest

    def device_count(self) -> int:
        return int(self.check("cudaGetDeviceCount", self.rt.cudaGetDeviceCount()))

    def set_device(self, device: int) -> None:
        self.check("cudaSetDevice", self.rt.cudaSetDevice(device))

    def malloc(self, size: int) -> int:
        return int(self.check("cudaMalloc", self.rt.cudaMalloc(size)))

    def free(self, ptr: int) -> None:
        self.check("cudaFree", self.rt.cudaFree(ptr))

    def malloc_host(self, size: int) -> int:
        return int(self.check("cudaMallocHost", self.rt.cudaMallocHost(size)))

    def free_host(self, ptr: int) -> None:
        self.check("cudaFreeHost", self.rt.cudaFreeHost(ptr))

    def copy_async(self, dst: int, src: int, size: int, kind: Any, stream: Any) -> None:
        if size:
            self.check("cudaMemcpyAsync", self.rt.cudaMemcpyAsync(dst, src, size, kind, stream))

    def stream_create(self) -> Any:
        return self.check("cudaStreamCreate", self.rt.cudaStreamCreate())

    def synchronize(self, stream: Any) -> None:
        self.check("cudaStreamSynchronize", self.rt.cudaStreamSynchronize(stream))

    def stream_destroy(self, stream: Any) -> None:
        self.check("cudaStreamDestroy", self.rt.cudaStreamDestroy(stream))


def _handle(stream: Any) -> int:
    """A cuda-python stream object as the integer handle TensorRT's bindings take."""
    try:
        return int(stream)
    except TypeError:
        return int(stream.getPtr())


class _Buffer:
    """A device (or page-locked host) allocation that grows to the largest size asked for."""

    def __init__(self, alloc: Any, release: Any) -> None:
        self._alloc, self._release = alloc, release
        self.ptr = 0
        self.capacity = 0

    def reserve(self, size: int) -> int:
        if size > self.capacity:
            self.close()
            capacity = max(size, _MIN_ALLOCATION)
            self.ptr = self._alloc(capacity)
            self.capacity = capacity
        return self.ptr

    def host_view(self, size: int) -> np.ndarray:
        """The first ``size`` bytes of a host allocation as a uint8 array (no copy)."""
        # ctypes arrays implement the buffer protocol; numpy's stubs take it only as __buffer__ (Python >= 3.12)
        return np.frombuffer((ctypes.c_uint8 * size).from_address(self.ptr), dtype=np.uint8) if size else np.empty(0)  # type: ignore[call-overload]

    def close(self) -> None:
        if self.ptr:
            ptr, self.ptr, self.capacity = self.ptr, 0, 0
            self._release(ptr)


def _dims(dims: Any) -> tuple[int, ...] | None:
    """A TensorRT Dims as a tuple; None for the "unknown" Dims (nbDims -1)."""
    try:
        return tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        return None


def _profile_values(engine: Any, name: str, profile: int) -> list[list[int]]:
    """``get_tensor_profile_values``: its bindings take (profile_index, name) despite the argument names."""
    try:
        return cast(list[list[int]], engine.get_tensor_profile_values(profile, name))
    except TypeError:
        return cast(list[list[int]], engine.get_tensor_profile_values(name, profile))


def read_engine_metadata(trt: Any, engine: Any) -> EngineMetadata:
    """The I/O tensors and per-profile ranges of a deserialized engine."""
    tensors = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        location = getattr(engine, "get_tensor_location", None)
        tensors.append(
            EngineTensor(
                name=name,
                is_input=engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT,
                dtype=trt_dtype_name(engine.get_tensor_dtype(name)),
                shape=_dims(engine.get_tensor_shape(name)) or (),
                is_shape_tensor=bool(engine.is_shape_inference_io(name)),
                on_host=location is not None and location(name) == trt.TensorLocation.HOST,
            )
        )
    profiles = []
    for p in range(max(engine.num_optimization_profiles, 1)):
        ranges: dict[str, ProfileRange] = {}
        for t in tensors:
            if not t.is_input:
                continue
            try:
                if t.is_shape_tensor:
                    lo, opt, hi = (tuple(int(v) for v in vals) for vals in _profile_values(engine, t.name, p))
                else:
                    lo, opt, hi = (_dims(d) or () for d in engine.get_tensor_profile_shape(t.name, p))
            except (RuntimeError, ValueError, TypeError):
                if t.is_shape_tensor or any(d < 0 for d in t.shape):
                    continue  # no range known: the engine checks it at set_input_shape
                lo = opt = hi = t.shape  # a static input: its only shape
            ranges[t.name] = ProfileRange(lo, opt, hi)
        profiles.append(ranges)
    return EngineMetadata(tuple(tensors), tuple(profiles))


def _make_logger(trt: Any) -> Any:
    """A TensorRT logger that keeps the last warnings and errors, to put in a load error."""
    try:

        class _Recent(trt.ILogger):  # type: ignore[misc]  # TensorRT has no type information: trt is Any
            def __init__(self) -> None:
                trt.ILogger.__init__(self)
                self.recent: collections.deque[str] = collections.deque(maxlen=8)

            def log(self, severity: Any, msg: str) -> None:
                if int(severity) <= int(trt.Logger.WARNING):
                    self.recent.append(str(msg))

        return _Recent()
    except Exception:
        return trt.Logger(trt.Logger.WARNING)


def load_engine(trt: Any, logger: Any, plan: Path) -> tuple[Any, Any]:
    """(runtime, engine) for a plan file; RuntimeError with TensorRT's own reason."""
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(plan.read_bytes())
    if engine is None:
        said = "; ".join(getattr(logger, "recent", ())) or "see the TensorRT log"
        raise RuntimeError(f"TensorRT could not deserialize the engine: {said}")
    return runtime, engine


def read_plan_metadata(plan: Path, *, model: str, device: int = 0) -> EngineMetadata:
    """The metadata of a plan file, for config auto-complete.

    Needs tensorrt, cuda-python and a GPU in the calling process; InvalidConfig
    (naming what is missing, or TensorRT's reason) otherwise."""
    trt = import_tensorrt(model)
    cuda = _Cuda(import_cudart(model))
    try:
        cuda.set_device(device)
        _runtime, engine = load_engine(trt, _make_logger(trt), plan)
        return read_engine_metadata(trt, engine)
    except Exception as exc:
        raise InvalidConfig(f"model '{model}': unable to read '{plan}' to complete its configuration: {exc}") from exc


class TensorRTBackend(Backend):
    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        model = ctx.model_name
        self._model = model
        if ctx.device_kind == "KIND_CPU":
            raise InvalidConfig(
                f"model '{model}': TensorRT models run on GPUs only; use an instance group of kind KIND_GPU"
            )
        self._trt = trt = import_tensorrt(model)
        self._cuda = cuda = _Cuda(import_cudart(model))
        self._device = ctx.gpu_ids[0] if ctx.gpu_ids else 0
        self._stream: Any = None
        self._buffers: dict[tuple[str, str], _Buffer] = {}
        self._contexts: dict[int, Any] = {}
        self._dtypes: dict[str, np.dtype] = {}
        try:
            cuda.set_device(self._device)
            self._logger = _make_logger(trt)
            self._runtime, self._engine = load_engine(trt, self._logger, ctx.model_file)
            self._meta = read_engine_metadata(trt, self._engine)
        except ServeError:
            raise
        except Exception as exc:
            raise InvalidConfig(f"model '{model}': failed to load '{ctx.model_file}': {exc}") from exc
        config = ctx.config
        try:
            group = getattr(ctx, "instance_group", None)  # set by the deployment when it knows the group
            self._profiles = instance_profiles(config, group, self._meta.num_profiles)
            check_config(config, self._meta, self._profiles)
            for t in self._meta.tensors:
                try:
                    self._dtypes[t.name] = numpy_dtype(t.dtype)
                except ValueError as exc:
                    raise ValueError(f"the TensorRT engine's '{t.name}': {exc}") from None
        except ValueError as exc:
            self.close()
            raise InvalidConfig(f"model '{model}': {exc}") from None
        self._batching = config.max_batch_size > 0
        opt = config.optimization
        self._pinned_in = not opt.HasField("input_pinned_memory") or opt.input_pinned_memory.enable
        self._pinned_out = not opt.HasField("output_pinned_memory") or opt.output_pinned_memory.enable
        try:
            self._stream = cuda.stream_create()
            for p in self._profiles:
                context = self._engine.create_execution_context()
                if context is None:
                    raise RuntimeError(f"could not create an execution context for profile {p}")
                context.set_optimization_profile_async(p, _handle(self._stream))
                self._contexts[p] = context
            cuda.synchronize(self._stream)
        except Exception as exc:
            self.close()
            raise InvalidConfig(f"model '{model}': failed to prepare the TensorRT engine: {exc}") from exc

    # ------------------------------------------------------------------ memory

    def _buffer(self, name: str, kind: str) -> _Buffer:
        buf = self._buffers.get((name, kind))
        if buf is None:
            cuda = self._cuda
            buf = _Buffer(cuda.malloc, cuda.free) if kind == "device" else _Buffer(cuda.malloc_host, cuda.free_host)
            self._buffers[(name, kind)] = buf
        return buf

    # ------------------------------------------------------------------ execution

    def _collect_inputs(
        self, inputs: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, tuple[int, ...]]]:
        """(execution tensors, shape-tensor values, shape-tensor values as tuples) of one execution."""
        model = self._model
        tensors: dict[str, np.ndarray] = {}
        shape_inputs: list[EngineTensor] = []
        batch: int | None = None
        for t in self._meta.inputs:
            arr = inputs.get(t.name)
            if arr is None:
                raise InvalidArgument(f"model '{model}': input '{t.name}' is required by the TensorRT engine")
            if t.is_shape_tensor:
                shape_inputs.append(t)
                continue
            want = self._dtypes[t.name]
            if arr.dtype != want:
                raise InvalidArgument(
                    f"model '{model}': input '{t.name}' has data type {arr.dtype}, the TensorRT engine expects {want}"
                )
            arr = np.ascontiguousarray(arr)
            tensors[t.name] = arr
            if batch is None and arr.ndim:
                batch = int(arr.shape[0])
        values: dict[str, np.ndarray] = {}
        points: dict[str, tuple[int, ...]] = {}
        for t in shape_inputs:
            if self._batching and batch is None:
                raise InvalidArgument(f"model '{model}': no batched input tells the batch size for '{t.name}'")
            flat = shape_tensor_values(
                t.name,
                inputs[t.name],
                engine_shape=t.shape,
                batch_size=batch if self._batching else None,
                model=model,
            )
            values[t.name] = np.ascontiguousarray(flat.astype(self._dtypes[t.name]))
            points[t.name] = tuple(int(v) for v in flat)
        return tensors, values, points

    def execute(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        cuda, model, stream = self._cuda, self._model, self._stream
        tensors, values, points = self._collect_inputs(inputs)
        profile = select_profile(
            self._meta, self._profiles, {n: a.shape for n, a in tensors.items()}, points, model=model
        )
        context = self._contexts[profile]
        try:
            cuda.set_device(self._device)  # the device is per thread; executions may come from any thread
            for name, arr in tensors.items():
                if not context.set_input_shape(name, arr.shape):
                    raise InvalidArgument(
                        f"model '{model}': TensorRT refused shape {list(arr.shape)} for input '{name}' "
                        f"(profile {profile})"
                    )
            for name, host in values.items():
                context.set_input_shape(name, host.shape)
                context.set_tensor_address(name, host.ctypes.data)  # shape tensors: host memory
            for name, arr in tensors.items():
                size = arr.nbytes
                device = self._buffer(name, "device").reserve(size)
                src = arr.ctypes.data
                if self._pinned_in and size:
                    staging = self._buffer(name, "pinned")
                    staging.reserve(size)
                    staging.host_view(size)[:] = arr.reshape(-1).view(np.uint8)
                    src = staging.ptr
                cuda.copy_async(device, src, size, cuda.h2d, stream)
                context.set_tensor_address(name, device)
            wanted = set(output_names)
            results: dict[str, np.ndarray] = {}
            staged: list[tuple[np.ndarray, _Buffer, int]] = []
            for t in self._meta.outputs:
                shape = output_shape(t.name, _dims(context.get_tensor_shape(t.name)), model=model)
                dtype = self._dtypes[t.name]
                size = nbytes(shape, dtype)
                if t.on_host:  # a shape-tensor output: TensorRT writes the values to host memory
                    host = np.empty(shape, dtype=dtype)
                    context.set_tensor_address(t.name, host.ctypes.data)
                    results[t.name] = host
                    continue
                device = self._buffer(t.name, "device").reserve(size)
                context.set_tensor_address(t.name, device)
                if t.name in wanted:
                    results[t.name] = np.empty(shape, dtype=dtype)
            if not context.execute_async_v3(_handle(stream)):
                raise InternalError(f"model '{model}': TensorRT execution failed (profile {profile})")
            for t in self._meta.outputs:
                out = results.get(t.name)
                if out is None or t.on_host or not out.nbytes:
                    continue
                device = self._buffer(t.name, "device").ptr
                if self._pinned_out:
                    staging = self._buffer(t.name, "pinned")
                    staging.reserve(out.nbytes)
                    cuda.copy_async(staging.ptr, device, out.nbytes, cuda.d2h, stream)
                    staged.append((out, staging, out.nbytes))
                else:
                    cuda.copy_async(out.ctypes.data, device, out.nbytes, cuda.d2h, stream)
            cuda.synchronize(stream)
            for out, staging, size in staged:
                out.reshape(-1).view(np.uint8)[:] = staging.host_view(size)
        except ServeError:
            raise
        except Exception as exc:
            raise InternalError(f"model '{model}': TensorRT execute failure: {exc}") from exc
        return {name: arr for name, arr in results.items() if name in wanted}

    def close(self) -> None:
        cuda = self._cuda
        try:
            if self._stream is not None:
                cuda.synchronize(self._stream)
        except Exception:
            pass
        self._contexts.clear()
        for buf in self._buffers.values():
            try:
                buf.close()
            except Exception:
                pass
        self._buffers.clear()
        if self._stream is not None:
            try:
                cuda.stream_destroy(self._stream)
            except Exception:
                pass
            self._stream = None
        self._engine = None
        self._runtime = None


def complete_tensorrt_config(config: mc.ModelConfig, model: str, model_file: Path) -> None:
    """Triton completes a TensorRT config from the engine; reading a plan needs TensorRT, cuda-python and a
    GPU where the repository is loaded.  Without them the config stays as written, and the instances'
    load reports what is missing."""
    try:
        meta = read_plan_metadata(model_file, model=model)
    except InvalidConfig:
        return
    complete_config_from_engine(config, meta, model=model, path=str(model_file))
