"""KServe v2 over gRPC (``inference.GRPCInferenceService``).  The only package running grpc servers."""

from serve_app.grpc_server.server import start_grpc_server
from serve_app.grpc_server.servicer import InferenceServicer, add_inference_service

__all__ = ["InferenceServicer", "add_inference_service", "start_grpc_server"]
