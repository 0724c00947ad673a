"""The one place where exceptions become HTTP error responses.

``/werk/v1`` answers the protocol error body; ``/v1`` answers the OpenAI error shape so existing
SDKs surface it; ``/sdapi/v1`` answers AUTOMATIC1111's (``error``, ``detail``, ``body``,
``errors``: what its API's exception handler sends). An unexpected exception is logged with its
request id and answered with a generic ``internal`` message: no traceback, path or backend text
reaches the client.
"""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..protocol import ErrorCode, InternalError, InvalidRequest, NotFound, WerkError, encode

__all__ = ["error_response", "to_werk_error"]

log = logging.getLogger("werk.http")


class MethodNotAllowed(InvalidRequest):
    """A known route called with the wrong method (``invalid_request``, HTTP 405)."""

    status_override = 405


_OPENAI_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    410: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def to_werk_error(exc: BaseException, request_id: str) -> WerkError:
    """Map any exception to the :class:`WerkError` the client will see."""
    if isinstance(exc, WerkError):
        if isinstance(exc, InternalError):
            log.error("internal error [%s]: %s", request_id, exc.message)
            return InternalError("internal error; see the server log for " + request_id)
        return exc
    if isinstance(exc, HTTPException):
        if exc.status_code == 404:
            return NotFound("no such route")
        if exc.status_code == 405:
            return MethodNotAllowed("method not allowed on this route")
        return InvalidRequest(f"HTTP {exc.status_code}")
    log.error("unhandled exception [%s]", request_id, exc_info=exc)
    return InternalError("internal error; see the server log for " + request_id)


def error_response(request: Request, exc: BaseException) -> Response:
    """The error response for ``exc``, in the shape of the route family."""
    request_id: str = request.scope.get("werk_request_id", "req_unknown")
    err = to_werk_error(exc, request_id)
    status = err.http_status
    headers = {"WWW-Authenticate": "Bearer"} if err.code is ErrorCode.UNAUTHENTICATED else None
    if err.retryable and (err.retry_after is not None or status == 429):
        # RFC 9110 §10.2.3; a 429 always says when (a second unless the error knows better).
        headers = {"Retry-After": str(max(1, int(err.retry_after or 1)))}
    if isinstance(exc, HTTPException) and exc.status_code == 405 and exc.headers:
        allow = exc.headers.get("Allow")  # RFC 9110 §15.5.6: a 405 lists the allowed methods
        if allow:
            headers = {"Allow": ", ".join(sorted(m.strip() for m in allow.split(",")))}
    if request.url.path.startswith("/v1/") or request.url.path == "/v1":
        body = {
            "error": {
                "message": err.message,
                "type": _OPENAI_TYPE.get(status, "server_error"),
                "code": err.openai_code or err.code.value,
                "param": err.param,
                "request_id": request_id,
            }
        }
        return Response(encode(body), status, headers, media_type="application/json")
    if request.url.path.startswith("/sdapi/"):
        a1111: dict[str, str] = {
            "error": err.code.value,
            "detail": err.message,
            "body": "",
            "errors": err.message,
            "request_id": request_id,
        }
        return Response(encode(a1111), status, headers, media_type="application/json")
    return Response(encode(err.to_body(request_id)), status, headers, media_type="application/json")
