"""KServe v2 over HTTP, and the metrics port (Starlette).  The only package that imports starlette."""

from serve_app.http_server.app import build_http_app
from serve_app.http_server.metrics import build_metrics_app

__all__ = ["build_http_app", "build_metrics_app"]
