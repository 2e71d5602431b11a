"""What keeps the server's files, ports and admin APIs to those meant to use them.

- ``paths``: file names from configs and requests confined to their model's directory (pure, no I/O
  beyond resolving links; imported by the repository and the runtime).
- ``tls``: optional TLS for the HTTP (uvicorn) and gRPC front ends.
- ``restricted``: Triton's restricted API categories (``--http-restricted-api``,
  ``--grpc-restricted-protocol``): an ASGI wrapper for HTTP and a check of each
  gRPC call's headers.

Import the submodules: this package imports nothing so that the core does not pull in grpc or
Starlette through ``paths``.
"""
