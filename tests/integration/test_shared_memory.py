"""System shared memory through both front ends in process: register, infer from and into regions, status,
unregister, the extension off, and CUDA shared memory answered as a Triton without GPUs."""

from __future__ import annotations

from collections.abc import Iterator
from multiprocessing import shared_memory

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc

from serve_app.service import InferenceService
from serve_app.shared_memory import MemoryStore, SharedMemory
from tests.support.repos import ADD_SUB
from tests.support.shm import key, shm_object

__all__ = ["shm_object"]
Stub = service_pb2_grpc.GRPCInferenceServiceStub
A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.full((1, 16), 2, dtype=np.float32)


@pytest.fixture
def enabled(service: InferenceService, monkeypatch: pytest.MonkeyPatch) -> Iterator[SharedMemory]:
    """The session's service with the extension on (as --allow-client-shm), restored after the test."""
    shm = SharedMemory(MemoryStore())
    monkeypatch.setattr(service, "shared_memory", shm)
    yield shm
    shm.close(forget=True)


def fill_inputs(obj: shared_memory.SharedMemory) -> None:
    obj.buf[0:64] = A.tobytes()
    obj.buf[64:128] = B.tobytes()


def region(obj: shared_memory.SharedMemory, at: int) -> np.ndarray:
    return np.frombuffer(obj.buf[at : at + 64], dtype=np.float32).reshape(1, 16)


def shm_infer_body(outputs_at: int = 0) -> dict[str, object]:
    def tensor(name: str, offset: int) -> dict[str, object]:
        params = {"shared_memory_region": "io", "shared_memory_offset": offset, "shared_memory_byte_size": 64}
        return {"name": name, "shape": [1, 16], "datatype": "FP32", "parameters": params}

    return {
        "inputs": [tensor("INPUT0", 0), tensor("INPUT1", 64)],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 64}},
            {"name": "OUTPUT1", "parameters": {"binary_data": False}},
        ],
    }


async def test_http_register_infer_status_unregister(
    http: httpx.AsyncClient, enabled: SharedMemory, shm_object: shared_memory.SharedMemory
) -> None:
    fill_inputs(shm_object)
    for name, offset, size in (("io", 0, 128), ("out", 4096, 64)):
        body = {"key": key(shm_object), "offset": offset, "byte_size": size}
        r = await http.post(f"/v2/systemsharedmemory/region/{name}/register", json=body)
        assert (r.status_code, r.content) == (200, b"")
    status = (await http.get("/v2/systemsharedmemory/status")).json()
    assert status == [
        {"name": "io", "key": key(shm_object), "offset": 0, "byte_size": 128},
        {"name": "out", "key": key(shm_object), "offset": 4096, "byte_size": 64},
    ]
    assert (await http.get("/v2/systemsharedmemory/region/out/status")).json() == status[1:]

    r = await http.post(f"/v2/models/{ADD_SUB}/infer", json=shm_infer_body())
    assert r.status_code == 200, r.text
    out0, out1 = r.json()["outputs"]
    assert out0 == {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}  # in its region, no data
    np.testing.assert_array_equal(region(shm_object, 4096), A + B)
    assert out1["data"] == (A - B).reshape(-1).tolist()

    r = await http.post("/v2/systemsharedmemory/region/io/unregister")
    assert r.status_code == 200
    assert [s["name"] for s in (await http.get("/v2/systemsharedmemory/status")).json()] == ["out"]
    r = await http.post(f"/v2/models/{ADD_SUB}/infer", json=shm_infer_body())
    assert (r.status_code, r.json()) == (404, {"error": "Unable to find shared memory region: 'io'"})
    await http.post("/v2/systemsharedmemory/unregister")
    assert (await http.get("/v2/systemsharedmemory/status")).json() == []


async def test_http_errors(
    http: httpx.AsyncClient, enabled: SharedMemory, shm_object: shared_memory.SharedMemory
) -> None:
    reg = "/v2/systemsharedmemory/region/r/register"
    r = await http.post(reg, json={"key": "/serve_app_no_such_key", "offset": 0, "byte_size": 64})
    assert (r.status_code, r.json()["error"]) == (500, "Unable to open shared memory region: '/serve_app_no_such_key'")
    r = await http.post(reg, json={"key": key(shm_object), "offset": 65536, "byte_size": 64})
    assert (r.status_code, r.json()["error"]) == (400, "failed to register shared memory region 'r': invalid args")
    r = await http.post(reg, json={"key": key(shm_object)})
    assert (r.status_code, r.json()["error"]) == (400, "Shared memory register request has no 'byte_size' field")
    assert (await http.post(reg, json={"key": key(shm_object), "byte_size": 128})).status_code == 200
    r = await http.post(reg, json={"key": key(shm_object), "byte_size": 128})
    assert (r.status_code, r.json()["error"]) == (400, "shared memory region 'r' already in manager")
    r = await http.get("/v2/systemsharedmemory/region/nope/status")
    assert (r.status_code, r.json()["error"]) == (404, "Unable to find system shared memory region: 'nope'")

    body = shm_infer_body()
    body["inputs"][0]["parameters"]["shared_memory_byte_size"] = 32  # type: ignore[index]
    body["inputs"][0]["parameters"]["shared_memory_region"] = "r"  # type: ignore[index]
    r = await http.post(f"/v2/models/{ADD_SUB}/infer", json=body)
    assert r.status_code == 400
    assert r.json()["error"] == "input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 64, got 32"


async def test_grpc_register_infer_status_unregister(
    grpc_stub: Stub, enabled: SharedMemory, shm_object: shared_memory.SharedMemory
) -> None:
    fill_inputs(shm_object)
    await grpc_stub.SystemSharedMemoryRegister(
        pb.SystemSharedMemoryRegisterRequest(name="io", key=key(shm_object), offset=0, byte_size=128)
    )
    await grpc_stub.SystemSharedMemoryRegister(
        pb.SystemSharedMemoryRegisterRequest(name="out", key=key(shm_object), offset=8192, byte_size=128)
    )
    status = await grpc_stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest())
    assert sorted(status.regions) == ["io", "out"]
    assert status.regions["out"].offset == 8192 and status.regions["out"].key == key(shm_object)

    req = pb.ModelInferRequest(model_name=ADD_SUB)
    for name, offset in (("INPUT0", 0), ("INPUT1", 64)):
        tensor = req.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        tensor.parameters["shared_memory_region"].string_param = "io"
        tensor.parameters["shared_memory_offset"].int64_param = offset
        tensor.parameters["shared_memory_byte_size"].int64_param = 64
    for name, offset in (("OUTPUT0", 0), ("OUTPUT1", 64)):
        out = req.outputs.add(name=name)
        out.parameters["shared_memory_region"].string_param = "out"
        out.parameters["shared_memory_offset"].int64_param = offset
        out.parameters["shared_memory_byte_size"].int64_param = 64
    resp = await grpc_stub.ModelInfer(req)
    assert [o.name for o in resp.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert list(resp.raw_output_contents) == [b"", b""]
    np.testing.assert_array_equal(region(shm_object, 8192), A + B)
    np.testing.assert_array_equal(region(shm_object, 8192 + 64), A - B)

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_stub.SystemSharedMemoryRegister(
            pb.SystemSharedMemoryRegisterRequest(name="io", key=key(shm_object), byte_size=8)
        )
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    await grpc_stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="io"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(name="io"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    await grpc_stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest())
    assert not (await grpc_stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest())).regions


async def test_registered_over_one_protocol_used_over_the_other(
    http: httpx.AsyncClient, grpc_stub: Stub, enabled: SharedMemory, shm_object: shared_memory.SharedMemory
) -> None:
    fill_inputs(shm_object)
    await grpc_stub.SystemSharedMemoryRegister(
        pb.SystemSharedMemoryRegisterRequest(name="io", key=key(shm_object), byte_size=128)
    )
    await grpc_stub.SystemSharedMemoryRegister(
        pb.SystemSharedMemoryRegisterRequest(name="out", key=key(shm_object), offset=4096, byte_size=64)
    )
    r = await http.post(f"/v2/models/{ADD_SUB}/infer", json=shm_infer_body())
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(region(shm_object, 4096), A + B)


async def test_off_by_default(http: httpx.AsyncClient, grpc_stub: Stub, service: InferenceService) -> None:
    assert not service.shared_memory.enabled
    assert "system_shared_memory" not in (await http.get("/v2")).json()["extensions"]
    r = await http.post("/v2/systemsharedmemory/region/r/register", json={"key": "/k", "byte_size": 8})
    assert r.status_code == 400
    assert "start it with --allow-client-shm" in r.json()["error"]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(name="r", key="/k"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--allow-client-shm" in err.value.details()
    assert (await http.get("/v2/systemsharedmemory/status")).json() == []
    assert (await http.post("/v2/systemsharedmemory/unregister")).status_code == 200
    r = await http.post(f"/v2/models/{ADD_SUB}/infer", json=shm_infer_body())
    assert r.status_code == 400
    assert r.json()["error"].endswith("(the request names region 'io')")


async def test_metadata_lists_the_extension_when_on(service: InferenceService) -> None:
    on = InferenceService(service.registry, service.executor, shared_memory=SharedMemory(MemoryStore()))
    extensions = on.server_metadata().extensions
    assert extensions[extensions.index("model_configuration") + 1] == "system_shared_memory"
    assert "cuda_shared_memory" not in extensions


async def test_cuda_shared_memory_is_answered_as_without_gpus(http: httpx.AsyncClient, grpc_stub: Stub) -> None:
    assert (await http.get("/v2/cudasharedmemory/status")).json() == []
    r = await http.post("/v2/cudasharedmemory/region/c/register", json={"raw_handle": {"b64": ""}, "byte_size": 8})
    assert (r.status_code, r.json()["error"]) == (
        400,
        "failed to register CUDA shared memory region: 'c', GPUs not supported",
    )
    assert (await http.post("/v2/cudasharedmemory/region/c/unregister")).status_code == 200
    assert (await http.post("/v2/cudasharedmemory/unregister")).status_code == 200
    assert (await http.get("/v2/cudasharedmemory/region/c/status")).status_code == 404
    assert not (await grpc_stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest())).regions
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_stub.CudaSharedMemoryRegister(pb.CudaSharedMemoryRegisterRequest(name="c", byte_size=8))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await grpc_stub.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest(name="c"))
    # no name: Triton's HTTP handler asks for one, its gRPC handler refuses the region as any other
    r = await http.post("/v2/cudasharedmemory/register", json={"raw_handle": {"b64": ""}, "byte_size": 8})
    assert r.json()["error"] == "'region name' is necessary to register cuda shared memory region"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_stub.CudaSharedMemoryRegister(pb.CudaSharedMemoryRegisterRequest(byte_size=8))
    assert err.value.details() == "failed to register CUDA shared memory region: '', GPUs not supported"
