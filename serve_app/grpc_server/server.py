"""grpc.aio server lifecycle.  SO_REUSEPORT lets one gateway replica per core share the port."""

from __future__ import annotations

import grpc

from serve_app.grpc_server.servicer import InferenceServicer, add_inference_service
from serve_app.service import InferenceService

MAX_MESSAGE_BYTES = 2**31 - 1


async def start_grpc_server(service: InferenceService, host: str, port: int) -> grpc.aio.Server:
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 1),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
    )
    add_inference_service(InferenceServicer(service), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind gRPC port {host}:{port}")
    await server.start()
    return server
