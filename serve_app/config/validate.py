"""Checking a completed ModelConfig before anything is built from it.

The rules are Triton's (model_config_utils.cc and the framework backends), so a
config that Triton rejects is rejected here too, at load time and with a message
that names the model, the file and the field (``input[1].dims``) to fix.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import NoReturn

from serve_app.config.decoupled import response_timeout_s
from serve_app.config.hosting import dedicated_process
from serve_app.config.pbtxt import config_error
from serve_app.config.state_backup import state_backup_enabled
from serve_app.protos import model_config_pb2 as mc

ONNX_PLATFORM = "onnxruntime_onnx"
PYTORCH_PLATFORM = "pytorch_libtorch"
TENSORRT_PLATFORM = "tensorrt_plan"
ENSEMBLE_PLATFORM = "ensemble"
PYTHON_BACKEND = "python"
# Backends Triton names without a platform (its config shows ``platform: ""``).
BACKEND_ONLY = frozenset({PYTHON_BACKEND})
# Backends that answer each request of a batch on their own (Triton hands a Python model's execute a list).
PER_REQUEST_BACKENDS = frozenset({PYTHON_BACKEND})

# The platform/backend pairs we can serve; the ensemble has a platform only.
PLATFORM_BACKENDS: dict[str, str] = {
    ONNX_PLATFORM: "onnxruntime",
    PYTORCH_PLATFORM: "pytorch",
    TENSORRT_PLATFORM: "tensorrt",
}
BACKEND_PLATFORMS: dict[str, str] = {b: p for p, b in PLATFORM_BACKENDS.items()}

WILDCARD_DIM = -1
_TORCH_NAME = re.compile(r"^(.+)__([0-9]+)$")
_SUPPORTED = (
    "onnxruntime_onnx (onnxruntime), pytorch_libtorch (pytorch), tensorrt_plan (tensorrt), backend python, ensemble"
)
_CORRID_TYPES = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING)
_BOOL_CONTROLS = (
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY,
)


@dataclasses.dataclass(frozen=True)
class _Where:
    """Which model and file a message is about."""

    model: str
    path: str

    def fail(self, field: str, detail: str) -> NoReturn:
        raise config_error(self.model, self.path, f"{field}: {detail}")


def normalize_platform(config: mc.ModelConfig) -> None:
    """Fill the missing half of a known platform/backend pair, in place.

    Triton reports both (``platform: onnxruntime_onnx``, ``backend: onnxruntime``)
    whichever one the user wrote; unknown names are left for validation to reject.
    """
    if config.platform in PLATFORM_BACKENDS and not config.backend:
        config.backend = PLATFORM_BACKENDS[config.platform]
    elif config.backend in BACKEND_PLATFORMS and not config.platform:
        config.platform = BACKEND_PLATFORMS[config.backend]


def validate_platform(config: mc.ModelConfig, *, model: str, path: str) -> None:
    """Reject a platform/backend we can't serve, or a pair that disagrees."""
    where = _Where(model, path)
    platform, backend = config.platform, config.backend
    if not platform and not backend:
        where.fail("platform", f"must specify 'platform' or 'backend'; supported are {_SUPPORTED}")
    if platform == ENSEMBLE_PLATFORM:
        if backend:
            where.fail("backend", f"an ensemble must not specify a backend (got '{backend}')")
        return
    if backend in BACKEND_ONLY:
        if platform:
            where.fail("platform", f"backend '{backend}' takes no platform (got '{platform}')")
        return
    if platform and platform not in PLATFORM_BACKENDS:
        where.fail("platform", f"unsupported platform '{platform}'; supported are {_SUPPORTED}")
    if backend and backend not in BACKEND_PLATFORMS:
        where.fail("backend", f"unsupported backend '{backend}'; supported are {_SUPPORTED}")
    if platform and backend and PLATFORM_BACKENDS[platform] != backend:
        where.fail(
            "backend",
            f"backend '{backend}' does not match platform '{platform}' "
            f"(expected backend '{PLATFORM_BACKENDS[platform]}')",
        )


def validate_model_filename(config: mc.ModelConfig, *, model: str, path: str) -> None:
    """``default_model_filename`` names a file inside the version directory, nothing else."""
    name = config.default_model_filename
    if name and (name in (".", "..") or "/" in name or "\\" in name or "\x00" in name):
        _Where(model, path).fail(
            "default_model_filename", f"must be a plain file name inside the version directory (got {name!r})"
        )


def validate_config(config: mc.ModelConfig, *, model: str, path: str) -> None:
    """Raise ``InvalidConfig`` for the first problem found in a completed config.

    A config that names only the backend (or only the platform) is judged as
    its normalized pair; ``config`` itself is not changed.
    """
    where = _Where(model, path)
    normalized = mc.ModelConfig()
    normalized.CopyFrom(config)
    normalize_platform(normalized)
    config = normalized
    if not config.name:
        where.fail("name", "must specify 'name'")
    if config.name != model:
        where.fail("name", f"must match the model directory name '{model}' (got '{config.name}')")
    validate_platform(config, model=model, path=path)
    validate_model_filename(config, model=model, path=path)
    if config.max_batch_size < 0:
        where.fail("max_batch_size", f"must be >= 0 (got {config.max_batch_size})")
    _check_version_policy(config, where)
    _check_ios(config.input, "input", config, where)
    _check_ios(config.output, "output", config, where)
    if config.platform == PYTORCH_PLATFORM:
        _check_pytorch_names(config, where)
    _check_batch_ios(config, where)
    if config.HasField("dynamic_batching"):
        _check_dynamic_batching(config, where)
    if config.HasField("sequence_batching"):
        _check_sequence_batching(config, where)
    if config.HasField("ensemble_scheduling"):
        _check_ensemble(config, where)
    elif config.platform == ENSEMBLE_PLATFORM:
        where.fail("ensemble_scheduling", "an ensemble must specify 'ensemble_scheduling'")
    _check_instance_groups(config, where)
    _check_warmup(config, where)
    state_backup_enabled(config, path=path)
    dedicated_process(config, path=path)
    response_timeout_s(config, path=path)
    if config.model_transaction_policy.decoupled:
        if config.response_cache.enable:
            where.fail("response_cache.enable", "the response cache does not support decoupled models")
        # An ensemble's own flag is replaced by its steps' once they load, as Triton's ensemble check sets it.
        if config.backend != PYTHON_BACKEND and config.platform != ENSEMBLE_PLATFORM:
            where.fail(
                "model_transaction_policy.decoupled",
                f"decoupled models are served for backend 'python' only (this model's backend is '{config.backend}')",
            )
        if config.HasField("sequence_batching"):
            where.fail(
                "model_transaction_policy.decoupled", "a decoupled model with sequence batching is not supported"
            )


def _check_version_policy(config: mc.ModelConfig, where: _Where) -> None:
    policy = config.version_policy
    if policy.WhichOneof("policy_choice") != "specific":
        return
    versions = policy.specific.versions
    if not versions:
        where.fail("version_policy.specific.versions", "must list at least one version")
    for version in versions:
        if version < 1:
            where.fail("version_policy.specific.versions", f"version {version} is not a positive integer")


def _check_ios(ios: Sequence[mc.ModelInput | mc.ModelOutput], kind: str, config: mc.ModelConfig, where: _Where) -> None:
    """Triton's ValidateIOShape plus the per-direction extras."""
    seen: dict[str, int] = {}
    trt = config.platform == TENSORRT_PLATFORM
    for i, io in enumerate(ios):
        field = f"{kind}[{i}]"
        if not io.name:
            where.fail(f"{field}.name", f"model {kind} must specify 'name'")
        if io.name in seen:
            where.fail(f"{field}.name", f"duplicate {kind} name '{io.name}' (also {kind}[{seen[io.name]}])")
        seen[io.name] = i
        label = f"model {kind} '{io.name}'"
        if io.data_type == mc.TYPE_INVALID:
            where.fail(f"{field}.data_type", f"{label} must specify 'data_type'")
        if io.data_type not in mc.DataType.values():
            where.fail(f"{field}.data_type", f"{label} has unknown data type {io.data_type}")
        _check_shape(io, field, label, config.max_batch_size, where)
        if (
            kind == "input"
            and isinstance(io, mc.ModelInput)
            and io.format != mc.ModelInput.FORMAT_NONE
            and len(io.dims) != 3
        ):
            where.fail(
                f"{field}.format",
                f"{label} with format {mc.ModelInput.Format.Name(io.format)} requires 3 dims (got {len(io.dims)})",
            )
        if io.is_shape_tensor and not trt:
            where.fail(f"{field}.is_shape_tensor", f"{label}: shape tensors are only supported for TensorRT")
        if io.is_non_linear_format_io:
            if not trt:
                where.fail(
                    f"{field}.is_non_linear_format_io",
                    f"{label}: non-linear IO format is only supported for TensorRT",
                )
            if len(io.dims) != 3:
                where.fail(f"{field}.dims", f"{label}: non-linear IO format requires 3 dims")


def _check_shape(
    io: mc.ModelInput | mc.ModelOutput, field: str, label: str, max_batch_size: int, where: _Where
) -> None:
    if not io.dims:
        where.fail(
            f"{field}.dims",
            f"{label} must specify 'dims' (rank >= 1; a tensor that is only the batch "
            "dimension takes dims: [ 1 ] with reshape: { shape: [ ] })",
        )
    for j, dim in enumerate(io.dims):
        if dim < 1 and dim != WILDCARD_DIM:
            where.fail(
                f"{field}.dims",
                f"{label} dimension {j} must be an integer >= 1, or -1 for a variable-size dimension (got {dim})",
            )
    if not io.HasField("reshape"):
        return
    shape = io.reshape.shape
    if not shape and max_batch_size == 0:
        where.fail(
            f"{field}.reshape",
            f"{label} cannot have an empty reshape in a non-batching model (max_batch_size 0): "
            "scalar tensors are not supported",
        )
    for j, dim in enumerate(shape):
        if dim < 1 and dim != WILDCARD_DIM:
            where.fail(
                f"{field}.reshape.shape",
                f"{label} reshape dimension {j} must be an integer >= 1, or -1 for a variable-size "
                f"dimension (got {dim})",
            )
    dims_count, reshape_count = _element_count(io.dims), _element_count(shape)
    mismatch = f"{label} has different element counts for dims {list(io.dims)} and reshape {list(shape)}"
    # An empty reshape (batch-only tensor) pairs with dims of one element.
    if dims_count != reshape_count and (reshape_count != 0 or dims_count != 1):
        where.fail(f"{field}.reshape", mismatch)
    if dims_count == WILDCARD_DIM:
        # With variable dims, the fixed runs between the -1's must match pairwise.
        dims_runs, reshape_runs = _fixed_runs(io.dims), _fixed_runs(shape)
        if len(dims_runs) != len(reshape_runs):
            where.fail(
                f"{field}.reshape",
                f"{label} has different numbers of variable-size dimensions in dims {list(io.dims)} "
                f"and reshape {list(shape)}",
            )
        if dims_runs != reshape_runs:
            where.fail(f"{field}.reshape", mismatch)


def _element_count(dims: Sequence[int]) -> int:
    """Triton's GetElementCount: -1 if any dim is variable, 0 for an empty shape."""
    if WILDCARD_DIM in dims:
        return WILDCARD_DIM
    count = 0
    for j, dim in enumerate(dims):
        count = dim if j == 0 else count * dim
    return count


def _fixed_runs(dims: Sequence[int]) -> list[int]:
    """Products of the fixed dimensions between (and around) the -1's."""
    runs, current = [], 1
    for dim in dims:
        if dim == WILDCARD_DIM:
            runs.append(current)
            current = 1
        else:
            current *= dim
    runs.append(current)
    return runs


def _check_pytorch_names(config: mc.ModelConfig, where: _Where) -> None:
    """TorchScript has no tensor names: position is encoded as ``<name>__<index>``."""
    indices: dict[int, str] = {}
    for i, output in enumerate(config.output):
        match = _TORCH_NAME.match(output.name)
        if match is None:
            where.fail(
                f"output[{i}].name",
                f"PyTorch output '{output.name}' must be named '<name>__<index>' (e.g. 'OUTPUT__{i}')",
            )
        index = int(match.group(2))
        if index in indices:
            where.fail(f"output[{i}].name", f"outputs '{indices[index]}' and '{output.name}' share index {index}")
        indices[index] = output.name
    matches = [_TORCH_NAME.match(inp.name) for inp in config.input]
    if any(matches) and not all(matches):
        conventional = next(inp.name for inp, m in zip(config.input, matches, strict=True) if m)
        j = next(j for j, m in enumerate(matches) if m is None)
        where.fail(
            f"input[{j}].name",
            f"PyTorch inputs must all be named '<name>__<index>' or none of them (then they are "
            f"matched by forward() argument name): '{config.input[j].name}' does not follow the "
            f"convention but '{conventional}' does",
        )
    indices.clear()
    for j, m in enumerate(matches):
        if m is None:
            continue
        index = int(m.group(2))
        if index in indices:
            where.fail(
                f"input[{j}].name",
                f"inputs '{indices[index]}' and '{config.input[j].name}' share index {index}",
            )
        indices[index] = config.input[j].name


def _check_batch_ios(config: mc.ModelConfig, where: _Where) -> None:
    inputs = {io.name for io in config.input}
    outputs = {io.name for io in config.output}
    for i, bi in enumerate(config.batch_input):
        field = f"batch_input[{i}]"
        if bi.kind not in mc.BatchInput.Kind.values():
            where.fail(f"{field}.kind", f"unknown batch input kind {bi.kind}")
        if len(bi.source_input) != 1:
            where.fail(
                f"{field}.source_input",
                f"batch input kind '{mc.BatchInput.Kind.Name(bi.kind)}' expects 1 source input, "
                f"got {len(bi.source_input)}",
            )
        if bi.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
            where.fail(f"{field}.data_type", "batch input data type must be TYPE_INT32 or TYPE_FP32")
        for source in bi.source_input:
            if source not in inputs:
                where.fail(f"{field}.source_input", f"unknown source input name '{source}'")
    for i, bo in enumerate(config.batch_output):
        field = f"batch_output[{i}]"
        if bo.kind not in mc.BatchOutput.Kind.values():
            where.fail(f"{field}.kind", f"unknown batch output kind {bo.kind}")
        if len(bo.source_input) != 1:
            where.fail(
                f"{field}.source_input",
                f"batch output kind '{mc.BatchOutput.Kind.Name(bo.kind)}' expects 1 source input, "
                f"got {len(bo.source_input)}",
            )
        for source in bo.source_input:
            if source not in inputs:
                where.fail(f"{field}.source_input", f"unknown source input name '{source}'")
        targets: set[str] = set()
        for target in bo.target_name:
            if target not in outputs:
                where.fail(f"{field}.target_name", f"unknown target output name '{target}'")
            if target in targets:
                where.fail(f"{field}.target_name", f"target output name '{target}' can only be given once")
            targets.add(target)


def _check_preferred_sizes(sizes: Sequence[int], field: str, max_batch_size: int, where: _Where) -> None:
    for size in sizes:
        if size < 1:
            where.fail(field, f"preferred batch size {size} must be >= 1")
        if size > max_batch_size:
            where.fail(field, f"preferred batch size {size} must be <= max_batch_size ({max_batch_size})")


def _check_dynamic_batching(config: mc.ModelConfig, where: _Where) -> None:
    """Triton allows dynamic batching with max_batch_size 0 (no batches are formed,
    the queue policy still applies); only the sizes and priorities are checked."""
    db = config.dynamic_batching
    _check_preferred_sizes(
        db.preferred_batch_size, "dynamic_batching.preferred_batch_size", config.max_batch_size, where
    )
    levels = db.priority_levels
    if levels:
        if not 1 <= db.default_priority_level <= levels:
            where.fail(
                "dynamic_batching.default_priority_level",
                f"must be in range [1, {levels}] (got {db.default_priority_level})",
            )
        for level in db.priority_queue_policy:
            if not 1 <= level <= levels:
                where.fail(
                    "dynamic_batching.priority_queue_policy",
                    f"priority level {level} must be in range [1, {levels}]",
                )
    if not db.preserve_ordering:
        return
    if levels > 1:
        where.fail(
            "dynamic_batching.preserve_ordering",
            f"only one priority level is allowed when 'preserve_ordering' is true (priority_levels {levels})",
        )
    policies = [("dynamic_batching.default_queue_policy", db.default_queue_policy)]
    policies += [(f"dynamic_batching.priority_queue_policy[{k}]", v) for k, v in db.priority_queue_policy.items()]
    for field, policy in policies:
        if policy.default_timeout_microseconds and policy.timeout_action == mc.ModelQueuePolicy.DELAY:
            where.fail(
                f"{field}.timeout_action",
                "a queue policy cannot have timeout action DELAY when 'preserve_ordering' is true",
            )


def _check_sequence_batching(config: mc.ModelConfig, where: _Where) -> None:
    sb = config.sequence_batching
    if config.response_cache.enable:
        where.fail("response_cache.enable", "the response cache does not support sequence batching")
    kinds = mc.ModelSequenceBatching.Control.Kind
    seen_tensors: set[str] = set()
    seen_kinds: dict[int, str] = {}
    for i, control_input in enumerate(sb.control_input):
        field = f"sequence_batching.control_input[{i}]"
        if not control_input.name:
            where.fail(f"{field}.name", "a control input must have a name")
        if control_input.name in seen_tensors:
            where.fail(f"{field}.name", f"control tensor '{control_input.name}' is given more than once")
        seen_tensors.add(control_input.name)
        for k, control in enumerate(control_input.control):
            cfield = f"{field}.control[{k}]"
            if control.kind not in kinds.values():
                where.fail(f"{cfield}.kind", f"unknown control kind {control.kind}")
            kind_name = kinds.Name(control.kind)
            if control.kind in seen_kinds:
                where.fail(
                    f"{cfield}.kind",
                    f"{kind_name} is given for both '{seen_kinds[control.kind]}' and '{control_input.name}'",
                )
            seen_kinds[control.kind] = control_input.name
            given = [
                (name, len(values))
                for name, values in (
                    ("int32_false_true", control.int32_false_true),
                    ("fp32_false_true", control.fp32_false_true),
                    ("bool_false_true", control.bool_false_true),
                )
                if values
            ]
            if control.kind in _BOOL_CONTROLS:
                if len(given) != 1:
                    where.fail(
                        cfield,
                        f"{kind_name} must give exactly one of 'int32_false_true', 'fp32_false_true' "
                        "or 'bool_false_true'",
                    )
                name, count = given[0]
                if count != 2:
                    where.fail(f"{cfield}.{name}", f"{kind_name} '{name}' must have exactly 2 entries")
            else:
                if given:
                    where.fail(cfield, f"{kind_name} must not give '{given[0][0]}'")
                if control.data_type not in _CORRID_TYPES:
                    where.fail(
                        f"{cfield}.data_type",
                        f"{kind_name} data type must be TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 "
                        f"or TYPE_STRING (got {mc.DataType.Name(control.data_type)})",
                    )
    for i, state in enumerate(sb.state):
        field = f"sequence_batching.state[{i}]"
        if not state.input_name:
            where.fail(f"{field}.input_name", "a state must specify 'input_name'")
        if not state.output_name:
            where.fail(f"{field}.output_name", "a state must specify 'output_name'")
        if state.data_type == mc.TYPE_INVALID:
            where.fail(f"{field}.data_type", f"state '{state.input_name}' must specify 'data_type'")
        for dim in state.dims:
            if dim < 1 and dim != WILDCARD_DIM:
                where.fail(f"{field}.dims", f"state dimensions must be >= 1 or -1 (got {dim})")
        for j, initial in enumerate(state.initial_state):
            if initial.WhichOneof("state_data") is None:
                where.fail(f"{field}.initial_state[{j}]", "an initial state must specify 'zero_data' or 'data_file'")
    if sb.HasField("oldest"):
        _check_preferred_sizes(
            sb.oldest.preferred_batch_size,
            "sequence_batching.oldest.preferred_batch_size",
            config.max_batch_size,
            where,
        )
    if sb.HasField("direct") and not 0.0 <= sb.direct.minimum_slot_utilization <= 1.0:
        where.fail(
            "sequence_batching.direct.minimum_slot_utilization",
            f"must be in range [0.0, 1.0] (got {sb.direct.minimum_slot_utilization})",
        )


@dataclasses.dataclass
class _EnsembleTensor:
    """A node of the ensemble's data-flow graph."""

    name: str
    is_output: bool = False  # some step writes it
    ready: bool = False
    prev: list[_EnsembleTensor] = dataclasses.field(default_factory=list)  # computed from these
    next: list[_EnsembleTensor] = dataclasses.field(default_factory=list)  # these are computed from it


def _check_ensemble(config: mc.ModelConfig, where: _Where) -> None:
    """Triton's ensemble checks: every step complete, every tensor flows from the
    ensemble inputs to the ensemble outputs, nothing dangles."""
    if config.platform != ENSEMBLE_PLATFORM:
        where.fail(
            "ensemble_scheduling",
            f"only an ensemble (platform '{ENSEMBLE_PLATFORM}') may specify ensemble_scheduling",
        )
    for field in ("instance_group", "model_warmup"):
        if len(getattr(config, field)):
            where.fail(field, "must not be specified for an ensemble")
    if config.HasField("optimization"):
        where.fail("optimization", "must not be specified for an ensemble")
    steps = config.ensemble_scheduling.step
    if not steps:
        where.fail("ensemble_scheduling.step", "an ensemble must specify at least one 'step'")

    tensors: dict[str, _EnsembleTensor] = {}
    tensor: _EnsembleTensor | None  # None: an ensemble output that no step writes
    io: mc.ModelInput | mc.ModelOutput
    for i, step in enumerate(steps):
        field = f"ensemble_scheduling.step[{i}]"
        if not step.model_name:
            where.fail(f"{field}.model_name", "each step must specify 'model_name'")
        if not step.input_map:
            where.fail(f"{field}.input_map", f"step '{step.model_name}' must specify 'input_map'")
        if not step.output_map:
            where.fail(f"{field}.output_map", f"step '{step.model_name}' must specify 'output_map'")
        written: list[_EnsembleTensor] = []
        for tensor_name in step.output_map.values():
            tensor = tensors.setdefault(tensor_name, _EnsembleTensor(tensor_name))
            if tensor.is_output:
                where.fail(
                    f"{field}.output_map",
                    f"ensemble tensor '{tensor_name}' is written by more than one output map",
                )
            tensor.is_output = True
            written.append(tensor)
        for tensor_name in step.input_map.values():
            tensor = tensors.setdefault(tensor_name, _EnsembleTensor(tensor_name))
            for out in written:
                out.prev.append(tensor)
                tensor.next.append(out)

    queue: list[_EnsembleTensor] = []
    for i, io in enumerate(config.input):
        if io.name not in tensors:
            where.fail(f"input[{i}].name", f"ensemble input '{io.name}' is not used by any step")
        tensors[io.name].ready = True
        queue.append(tensors[io.name])
    while queue:
        node = queue.pop(0)
        for nxt in node.next:
            if not nxt.ready and all(p.ready for p in nxt.prev):
                nxt.ready = True
                queue.append(nxt)
    outputs: set[str] = set()
    for i, io in enumerate(config.output):
        tensor = tensors.get(io.name)
        if tensor is None:
            where.fail(f"output[{i}].name", f"ensemble output '{io.name}' is not written by any step")
        if not tensor.ready:
            source = _unready_source(tensor)
            cause = f": it depends on '{source}', which is not connected" if source != io.name else ""
            where.fail(f"output[{i}].name", f"ensemble output '{io.name}' is never computed{cause}")
        outputs.add(io.name)
    for name, tensor in tensors.items():
        if name not in outputs and (not tensor.ready or not tensor.next):
            where.fail("ensemble_scheduling.step", f"ensemble tensor '{name}' is unused")


def _unready_source(tensor: _EnsembleTensor) -> str:
    """Walk back through not-ready tensors to the one that breaks the flow."""
    seen: set[str] = set()
    last = tensor
    prev: list[_EnsembleTensor] | None = tensor.prev
    while prev:
        nodes, prev = prev, None
        for node in nodes:
            if not node.ready and node.name not in seen:
                seen.add(node.name)
                last, prev = node, node.prev
                break
    return last.name


def _check_instance_groups(config: mc.ModelConfig, where: _Where) -> None:
    kinds = mc.ModelInstanceGroup.Kind
    for i, group in enumerate(config.instance_group):
        field = f"instance_group[{i}]"
        if group.kind not in kinds.values():
            where.fail(f"{field}.kind", f"unknown instance group kind {group.kind}")
        if group.count < 0:
            where.fail(f"{field}.count", f"must be >= 0 (0 means the default of 1); got {group.count}")
        if group.gpus and group.kind in (kinds.KIND_CPU, kinds.KIND_MODEL):
            where.fail(f"{field}.gpus", f"an instance group of kind {kinds.Name(group.kind)} must not list 'gpus'")
        for gpu in group.gpus:
            if gpu < 0:
                where.fail(f"{field}.gpus", f"GPU id must be >= 0 (got {gpu})")
        if group.profile and config.platform != TENSORRT_PLATFORM:
            where.fail(f"{field}.profile", "'profile' is only supported for TensorRT models")
        for profile in group.profile:
            if not profile.isdigit():
                where.fail(f"{field}.profile", f"profile '{profile}' must be a non-negative integer")


def _check_warmup(config: mc.ModelConfig, where: _Where) -> None:
    limit = max(config.max_batch_size, 1)
    for i, warmup in enumerate(config.model_warmup):
        if warmup.batch_size > limit:
            reason = (
                "must be 1 for a model that does not batch (max_batch_size 0)"
                if config.max_batch_size == 0
                else f"must be <= max_batch_size ({config.max_batch_size})"
            )
            where.fail(f"model_warmup[{i}].batch_size", f"{reason}; got {warmup.batch_size}")
