"""JSON error answers for every HTTP error aiohttp raises on its own (404 no route, 405 wrong method,
413 body too large, ...), so a v2 client can always decode ``{"error", "reason"}``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from tessera.gateway.protocol import error_json

_REASONS = {
    400: "bad-request",
    404: "not-found",
    405: "method-not-allowed",
    413: "too-large",
    415: "unsupported-media-type",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(status: int, message: str, reason: str | None = None) -> web.Response:
    return web.Response(
        body=error_json(message, reason or _REASONS.get(status, "error")),
        status=status,
        content_type="application/json",
    )


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn aiohttp's plain-text HTTP errors into v2 JSON error objects."""
    try:
        return await handler(request)
    except web.HTTPException as err:
        if err.status < 400 or err.content_type == "application/json":
            raise
        if err.status == 404:
            message = f"no such endpoint: {request.method} {request.path}"
        elif err.status == 405:
            message = f"{request.method} is not allowed on {request.path}"
        else:
            message = err.text or err.reason
        resp = json_error(err.status, message)
        if isinstance(err, web.HTTPMethodNotAllowed):
            resp.headers["Allow"] = ",".join(sorted(err.allowed_methods))
        return resp
