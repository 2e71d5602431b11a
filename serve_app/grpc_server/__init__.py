"""KServe v2 over gRPC (``inference.GRPCInferenceService``), served over HTTP/2 on the event loop."""

from serve_app.grpc_server.server import GrpcServer, start_grpc_server
from serve_app.grpc_server.servicer import InferenceServicer, method_table

__all__ = ["GrpcServer", "InferenceServicer", "method_table", "start_grpc_server"]
