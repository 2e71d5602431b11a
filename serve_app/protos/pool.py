"""The descriptor pool that holds serve_app's protobuf schema.

The schema is Triton's under Triton's own package, ``inference``, so that stubs that any gRPC
stack generates from these files reach the server. tritonclient registers the same symbols in the
default pool; a pool of our own lets both be loaded in one process.
"""

from __future__ import annotations

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
