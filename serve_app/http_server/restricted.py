"""Triton's restricted APIs over HTTP: a 403 before the route runs (policy: ``security/restricted.py``)."""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.security.restricted import RestrictedApis, http_category


class _RestrictedHttp:
    """ASGI wrapper answering 403 for restricted requests without the header; the rest go to ``app``."""

    def __init__(self, app: ASGIApp, apis: RestrictedApis) -> None:
        self.app = app
        self.apis = apis

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = self.apis.refusal(http_category(scope["path"]), lambda name: asgi_header(scope, name))
            if refused is not None:
                body = {"error": f"This API is restricted, expecting header '{refused.header}'"}
                await JSONResponse(body, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def restrict_http_app(app: ASGIApp, apis: RestrictedApis) -> ASGIApp:
    """``app`` behind Triton's restricted-API check (``app`` itself when nothing is restricted)."""
    return _RestrictedHttp(app, apis) if apis else app


def asgi_header(scope: Scope, name: str) -> str | None:
    """A request's first value of header ``name`` (any case), from its ASGI scope."""
    wanted = name.lower().encode("latin-1")
    key: bytes
    value: bytes
    for key, value in scope["headers"]:  # ASGI: names are lower case
        if key == wanted:
            return value.decode("latin-1")
    return None
