"""TorchScript engine (Triton's ``pytorch`` backend, platform ``pytorch_libtorch``): one module per instance.

TorchScript tensors have no names, so tensors are matched to ``forward()`` as Triton's pytorch backend does:

* inputs named ``<name>__<index>`` (``INPUT__0``, ``INPUT__1``) are the forward arguments at that index;
* inputs named like the forward arguments (``model.forward.schema``, ``self`` left out) go to those arguments;
* otherwise (no name follows either rule) the config's input order is the argument order.

The sequence batcher's tensors that are not in the config's ``input`` (implicit state inputs, control
inputs such as ``START``) follow the same two rules, by argument name first, then by ``__<index>``.
A forward that takes one ``Dict[str, Tensor]`` receives every tensor by its name.

Outputs named ``<name>__<index>`` are that element of the returned tuple or list (or the returned tensor
itself for index 0); when the config's outputs do not all follow the convention they are taken in config
order. A forward that returns a ``Dict[str, Tensor]`` has its outputs (state outputs included) taken by
name; Triton's backend does not accept that form.

Datatypes: BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, FP32, FP64 and BF16 (whose numpy form is the
uint16 bit pattern). TYPE_STRING and the unsigned 16/32/64-bit types fail the load, as in Triton's
datatype table. Parameters: ``INTRA_OP_THREAD_COUNT`` / ``INTER_OP_THREAD_COUNT`` (also lower case),
``DISABLE_OPTIMIZED_EXECUTION`` and ``INFERENCE_MODE`` (default true). PyTorch is imported lazily, so the
base install loads without it and only TorchScript models fail, with the reason.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from serve_app.backends.base import Backend, BackendContext
from serve_app.errors import InternalError, InvalidArgument, InvalidConfig
from serve_app.protos import model_config_pb2 as mc

INSTALL_HINT = "the pytorch backend needs PyTorch: pip install 'serve_app[torch]'"

_INDEXED = re.compile(r"^(.+)__([0-9]+)$")

# Config data type -> torch dtype attribute name (Triton's PyTorch column, plus BF16).
_TORCH_TYPES: dict[int, str] = {
    mc.TYPE_BOOL: "bool",
    mc.TYPE_UINT8: "uint8",
    mc.TYPE_INT8: "int8",
    mc.TYPE_INT16: "int16",
    mc.TYPE_INT32: "int32",
    mc.TYPE_INT64: "int64",
    mc.TYPE_FP16: "float16",
    mc.TYPE_FP32: "float32",
    mc.TYPE_FP64: "float64",
    mc.TYPE_BF16: "bfloat16",
}


def import_torch(model_name: str) -> Any:
    try:
        import torch
    except ImportError as exc:
        raise InvalidConfig(f"model '{model_name}': {INSTALL_HINT} ({exc})") from None
    return torch


def _index(name: str) -> int | None:
    m = _INDEXED.match(name)
    return int(m.group(2)) if m else None


def _int_parameter(ctx: BackendContext, *keys: str) -> int | None:
    for key in keys:
        raw = ctx.parameter(key).strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise InvalidConfig(
                    f"model '{ctx.model_name}': parameter '{key}' must be an integer, got '{raw}'"
                ) from None
    return None


def _bool_parameter(ctx: BackendContext, key: str, default: bool) -> bool:
    raw = ctx.parameter(key).strip().lower()
    if not raw:
        return default
    if raw in ("true", "1", "yes", "on"):
        return True
    if raw in ("false", "0", "no", "off"):
        return False
    raise InvalidConfig(f"model '{ctx.model_name}': parameter '{key}' must be true or false, got '{raw}'")


@dataclass(frozen=True, slots=True)
class _Argument:
    name: str
    has_default: bool


class TorchScriptBackend(Backend):
    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        torch = import_torch(ctx.model_name)
        self._torch = torch
        self._check_datatypes()
        self._configure_threads()
        self._optimize = not _bool_parameter(ctx, "DISABLE_OPTIMIZED_EXECUTION", False)
        self._inference_mode = _bool_parameter(ctx, "INFERENCE_MODE", True)

        self._device = self._select_device()
        # KIND_MODEL keeps the devices the model was saved with (Triton loads it without a device).
        map_location = None if ctx.device_kind == "KIND_MODEL" else self._device
        try:
            with self._grad_mode(), warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=DeprecationWarning)  # "switch to torch.export"
                module = torch.jit.load(str(ctx.model_file), map_location=map_location)
            module.eval()
            schema = module.forward.schema
        except Exception as exc:
            raise InvalidConfig(f"model '{ctx.model_name}': failed to load '{ctx.model_file}': {exc}") from exc
        self._module = module
        self._bf16 = {name for name, dt in self._declared_types().items() if dt == mc.TYPE_BF16}

        self._arguments: list[_Argument] = []
        self._dict_input = False
        self._read_schema(schema)
        self._input_args = self._map_inputs()
        self._output_index = self._map_outputs()

    # -- load ----------------------------------------------------------------------------------------
    def _fail(self, message: str) -> InvalidConfig:
        return InvalidConfig(f"model '{self.ctx.model_name}': {message}")

    def _declared_types(self) -> dict[str, int]:
        """Every tensor the config declares with a data type: inputs, outputs, states, controls."""
        cfg = self.ctx.config
        types: dict[str, int] = {}
        for t in list(cfg.input) + list(cfg.output):
            types[t.name] = t.data_type
        for state in cfg.sequence_batching.state:
            types[state.input_name] = state.data_type
            types[state.output_name] = state.data_type
        for control_input in cfg.sequence_batching.control_input:
            for control in control_input.control:
                if control.kind == mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
                    types[control_input.name] = control.data_type
                elif control.fp32_false_true:
                    types[control_input.name] = mc.TYPE_FP32
                elif control.bool_false_true:
                    types[control_input.name] = mc.TYPE_BOOL
                else:
                    types[control_input.name] = mc.TYPE_INT32
        return types

    def _check_datatypes(self) -> None:
        for name, data_type in self._declared_types().items():
            if data_type == mc.TYPE_STRING:
                raise self._fail(
                    f"tensor '{name}' is TYPE_STRING, which the pytorch backend does not support "
                    "(TorchScript tensors cannot hold strings)"
                )
            if data_type not in _TORCH_TYPES:
                raise self._fail(
                    f"tensor '{name}' has data type {mc.DataType.Name(data_type)}, which the pytorch backend "
                    f"does not support (supported: {', '.join(mc.DataType.Name(t) for t in _TORCH_TYPES)})"
                )

    def _configure_threads(self) -> None:
        torch = self._torch
        intra = _int_parameter(self.ctx, "INTRA_OP_THREAD_COUNT", "intra_op_thread_count")
        if intra is not None and intra > 0:
            torch.set_num_threads(intra)
        inter = _int_parameter(self.ctx, "INTER_OP_THREAD_COUNT", "inter_op_thread_count")
        if inter is not None and inter > 0 and torch.get_num_interop_threads() != inter:
            try:
                torch.set_num_interop_threads(inter)
            except RuntimeError:
                pass  # only settable before the process's first inter-op work; the pool is shared anyway

    def _select_device(self) -> Any:
        torch = self._torch
        if self.ctx.device_kind == "KIND_GPU" and torch.cuda.is_available():
            ordinal = self.ctx.gpu_ids[0] if self.ctx.gpu_ids else 0
            return torch.device(f"cuda:{ordinal}")
        return torch.device("cpu")

    def _read_schema(self, schema: Any) -> None:
        args = list(schema.arguments)
        if args and str(args[0].type.kind()) == "ClassType":
            args = args[1:]  # self
        kinds = [str(a.type.kind()) for a in args]
        if len(args) == 1 and kinds[0] == "DictType":
            self._dict_input = True
            return
        for arg, kind in zip(args, kinds, strict=True):
            has_default = bool(arg.has_default_value())
            if kind not in ("TensorType", "OptionalType") and not has_default:
                raise self._fail(
                    f"forward() argument '{arg.name}' has type '{arg.type}'; only Tensor arguments "
                    "(or a single Dict[str, Tensor]) are supported"
                )
            self._arguments.append(_Argument(arg.name, has_default))

    def _map_inputs(self) -> dict[str, int]:
        """The forward argument (position) of every input the config names, computed once."""
        if self._dict_input:
            return {}
        cfg = self.ctx.config
        arg_names = [a.name for a in self._arguments]
        config_inputs = [t.name for t in cfg.input]
        if all(n in arg_names for n in config_inputs):
            convention = "argument"
        elif all(_index(n) is not None for n in config_inputs):
            convention = "index"
        else:
            convention = "order"  # Triton's fallback: strict config ordering
        mapping: dict[str, int] = {}
        for i, name in enumerate(config_inputs):
            if convention == "argument":
                mapping[name] = arg_names.index(name)
            elif convention == "index":
                index = _index(name)
                assert index is not None  # the "index" convention: every config input name has one
                mapping[name] = index
            else:
                mapping[name] = i
        extras = [s.input_name for s in cfg.sequence_batching.state]
        extras += [c.name for c in cfg.sequence_batching.control_input]
        for name in extras:
            position = self._position(name, prefer_index=convention == "index")
            if position is None:
                raise self._fail(
                    f"sequence batching tensor '{name}' is neither a forward() argument "
                    f"({', '.join(arg_names) or 'none'}) nor named '<name>__<index>'"
                )
            mapping[name] = position
        taken: dict[int, str] = {}
        for name, position in mapping.items():
            if position >= len(self._arguments):
                raise self._fail(
                    f"input '{name}' refers to forward() argument {position}, but forward() takes "
                    f"{len(self._arguments)} argument(s) ({', '.join(arg_names) or 'none'})"
                )
            if position in taken:
                raise self._fail(
                    f"inputs '{taken[position]}' and '{name}' both map to forward() argument "
                    f"'{arg_names[position]}' ({position})"
                )
            taken[position] = name
        missing = [a.name for i, a in enumerate(self._arguments) if i not in taken and not a.has_default]
        if missing:
            raise self._fail(
                f"forward() argument(s) {', '.join(repr(m) for m in missing)} are fed by no input of the "
                f"configuration (inputs: {', '.join(mapping) or 'none'})"
            )
        return mapping

    def _position(self, name: str, *, prefer_index: bool = False) -> int | None:
        index = _index(name)
        if prefer_index and index is not None:
            return index
        for i, arg in enumerate(self._arguments):
            if arg.name == name:
                return i
        return index

    def _map_outputs(self) -> dict[str, int | None]:
        cfg = self.ctx.config
        names = [t.name for t in cfg.output]
        if all(_index(n) is not None for n in names):
            mapping: dict[str, int | None] = {n: _index(n) for n in names}
        else:
            mapping = {n: i for i, n in enumerate(names)}
        for state in cfg.sequence_batching.state:
            mapping.setdefault(state.output_name, _index(state.output_name))
        return mapping

    # -- execute ------------------------------------------------------------------------------------
    def _grad_mode(self) -> Any:
        torch = self._torch
        return torch.inference_mode() if self._inference_mode else torch.no_grad()

    def _tensor(self, name: str, arr: np.ndarray) -> Any:
        if arr.dtype == np.object_:
            raise InvalidArgument(f"input '{name}' holds BYTES, which the pytorch backend does not support")
        arr = np.ascontiguousarray(arr)
        if not arr.flags.writeable:
            arr = arr.copy()  # torch tensors must own writable memory; the model may write in place
        t = self._torch.from_numpy(arr)
        if name in self._bf16:
            t = t.view(self._torch.bfloat16)
        if self._device.type != "cpu":
            t = t.to(self._device)
        return t

    def _array(self, name: str, value: Any) -> np.ndarray:
        torch = self._torch
        if not isinstance(value, torch.Tensor):
            raise InternalError(
                f"pytorch model '{self.ctx.model_name}' output '{name}' is a {type(value).__name__}, not a Tensor"
            )
        t = value.detach()
        if t.dim() == 0:
            raise InvalidArgument(f"output '{name}' is a scalar which is not supported.")
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.uint16)
        arr = t.numpy()
        return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)

    def execute(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        torch = self._torch
        with torch.jit.optimized_execution(self._optimize), self._grad_mode():
            result = self._run_dict(inputs) if self._dict_input else self._run(inputs)
            return self._outputs(result, output_names)

    def _run_dict(self, inputs: dict[str, np.ndarray]) -> Any:
        feed = {name: self._tensor(name, arr) for name, arr in inputs.items()}
        try:
            return self._module.forward(feed)
        except Exception as exc:
            raise InternalError(f"PyTorch execute failure: {exc}") from exc

    def _run(self, inputs: dict[str, np.ndarray]) -> Any:
        kwargs: dict[str, Any] = {}
        for name, arr in inputs.items():
            position = self._input_args.get(name)
            if position is None:
                position = self._position(name)
            if position is None or position >= len(self._arguments):
                raise InvalidArgument(
                    f"input '{name}' matches no forward() argument of model '{self.ctx.model_name}' "
                    f"({', '.join(a.name for a in self._arguments)})"
                )
            arg = self._arguments[position].name
            if arg in kwargs:
                raise InvalidArgument(f"two inputs map to forward() argument '{arg}' ({position}), '{name}' is one")
            kwargs[arg] = self._tensor(name, arr)
        missing = [a.name for a in self._arguments if a.name not in kwargs and not a.has_default]
        if missing:
            raise InvalidArgument(
                f"model '{self.ctx.model_name}': no input for forward() argument(s) "
                f"{', '.join(repr(m) for m in missing)}"
            )
        try:
            return self._module.forward(**kwargs)
        except Exception as exc:
            raise InternalError(f"PyTorch execute failure: {exc}") from exc

    def _outputs(self, result: Any, output_names: list[str]) -> dict[str, np.ndarray]:
        torch = self._torch
        out: dict[str, np.ndarray] = {}
        if isinstance(result, dict):
            for name in output_names:
                if name in result:
                    out[name] = self._array(name, result[name])
            return out  # a missing name is reported by the instance, which knows what was asked for
        if isinstance(result, torch.Tensor):
            elements: list[Any] = [result]
        elif isinstance(result, (tuple, list)):
            elements = list(result)
        else:
            raise InternalError(
                f"PyTorch execute failure: output must be a Tensor, or a tuple, list or dict of Tensors, "
                f"got {type(result).__name__}"
            )
        for name in output_names:
            index = self._output_index.get(name, _index(name))
            if index is None:
                raise InternalError(
                    f"output '{name}' of model '{self.ctx.model_name}' is not named '<name>__<index>', "
                    "so it can only be taken from a forward() that returns a dict"
                )
            if index >= len(elements):
                raise InvalidArgument(
                    f"The output {name} in the model configuration refers to an output index which doesn't "
                    f"exist. This model has {len(elements)} outputs"
                )
            out[name] = self._array(name, elements[index])
        return out

    def close(self) -> None:
        self._module = None
