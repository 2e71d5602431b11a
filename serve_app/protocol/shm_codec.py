"""Tensors in system shared memory, for both protocols: an input read from its region, outputs written to theirs.

The front ends parse the ``shared_memory_*`` parameters with their own protocol's messages (Triton's differ
between HTTP and gRPC) into a :class:`ShmRef`; everything after that is here.  An input is a read-only numpy
view of the mapping (no copy; BYTES elements are copied out, as every BYTES input is); an output is written
straight into the mapping and goes back as its name, datatype and shape only, as Triton answers.
"""

from __future__ import annotations

import numpy as np

from serve_app import datatypes
from serve_app.errors import InternalError, InvalidArgument
from serve_app.inference.types import InferRequest, InferResponse, ParamValue
from serve_app.protocol import tensor_codec
from serve_app.shared_memory import SharedMemory, ShmRef

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
PARAMS = (REGION, OFFSET, BYTE_SIZE)

NO_SHARED_MEMORY = SharedMemory()  # the extension off: what a front end without a service's registry uses


def input_array(
    shm: SharedMemory, model: str, name: str, datatype: str, shape: tuple[int, ...], ref: ShmRef
) -> np.ndarray:
    """The input ``name`` from its region: the region's checks, then the byte size the shape needs."""
    window = shm.window(ref)
    dt = datatypes.from_wire(datatype)
    if dt.itemsize:
        expected = tensor_codec.element_count(shape) * dt.itemsize
        if ref.byte_size != expected:
            raise InvalidArgument(
                f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, "
                f"got {ref.byte_size}"
            )
    arr = tensor_codec.array_from_bytes(name, datatype, shape, window)
    if arr.base is not None:  # a view of the client's memory: no backend writes into it
        arr.flags.writeable = False
    return arr


def without_shm(params: dict[str, ParamValue]) -> dict[str, ParamValue]:
    return {k: v for k, v in params.items() if k not in PARAMS}


def output_refs(request: InferRequest) -> dict[str, ShmRef]:
    """The outputs the request wants written to shared memory (their parameters were checked when decoded)."""
    out: dict[str, ShmRef] = {}
    for o in request.outputs:
        region = o.parameters.get(REGION)
        if isinstance(region, str):
            offset, size = o.parameters.get(OFFSET, 0), o.parameters.get(BYTE_SIZE, 0)
            out[o.name] = ShmRef(region, int(offset), int(size))
    return out


def check_output(shm: SharedMemory, ref: ShmRef) -> None:
    """A requested output's region, checked before the request runs (as Triton checks it)."""
    shm.window(ref).release()


def write_outputs(shm: SharedMemory, request: InferRequest, response: InferResponse) -> set[str]:
    """Write the outputs the request placed in shared memory into their regions; returns their names."""
    refs = output_refs(request)
    written: set[str] = set()
    for t in response.outputs:
        ref = refs.get(t.name)
        if ref is None:
            continue
        data = tensor_codec.array_to_bytes(t.datatype, t.data)
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        if size > ref.byte_size:
            raise InternalError(
                f"shared memory size specified with the request for output '{t.name}' ({ref.byte_size} bytes) "
                f"should be at least {size} bytes to hold the results"
            )
        window = shm.window(ref)
        try:
            window[:size] = data
        finally:
            window.release()
        written.add(t.name)
    return written
