"""serve_app: a Triton-compatible inference server on Ray Serve."""

__version__ = "0.1.0"
__all__ = ["__version__"]
