"""Wire formats: KServe v2 JSON/binary over HTTP, protobuf over gRPC, status codes.

Codecs turn wire messages into the protocol-neutral types of
:mod:`serve_app.inference.types` and back; they hold no server state.
"""
