"""KServe v2 over HTTP (Starlette).  The only package that imports starlette."""

from serve_app.http_server.app import build_http_app

__all__ = ["build_http_app"]
