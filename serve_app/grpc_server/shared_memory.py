"""Triton's shared memory RPCs (System/CudaSharedMemory Status, Register, Unregister) over the service's registry.

A mixin of :class:`~serve_app.grpc_server.servicer.InferenceServicer`: the handlers are found by name, and
wrapped with the error mapping, like every other unary RPC.  An empty name unregisters every region, as in
Triton; CUDA shared memory answers as a Triton without GPUs.
"""

from __future__ import annotations

from typing import Any

from serve_app.protos import grpc_service_pb2 as pb
from serve_app.service import InferenceService
from serve_app.shared_memory import cuda


class SharedMemoryRpcs:
    service: InferenceService

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        resp = pb.SystemSharedMemoryStatusResponse()
        for r in self.service.shared_memory.status(request.name):
            resp.regions[r.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                )
            )
        return resp

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.service.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        if request.name:
            self.service.shared_memory.unregister(request.name)
        else:
            self.service.shared_memory.unregister_all()
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        cuda.status(self.service.shared_memory, request.name)
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Any
    ) -> pb.CudaSharedMemoryRegisterResponse:
        cuda.register(request.name)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()  # nothing is ever registered
