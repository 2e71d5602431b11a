"""Model execution engines behind one interface (:class:`Backend`).

Each engine lives in its own module and imports its framework lazily, so the
base install needs none but onnxruntime and a missing GPU stack only fails the
models that ask for it.
"""

from serve_app.backends.base import Backend, BackendContext, complete_io, create_backend

__all__ = ["Backend", "BackendContext", "complete_io", "create_backend"]
