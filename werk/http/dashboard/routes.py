"""The dashboard's routes: the page, its assets, sign-in and the live stream.

* ``GET /`` and ``GET /dashboard``: the page (a static shell; every figure arrives through the
  stream, for the signed-in caller only).
* ``GET /dashboard/assets/{name}``: its CSS and JavaScript modules, shipped in the wheel.
* ``GET /dashboard/session``: whether the page must ask for a key (``auth``) and whether this
  browser is signed in; ``POST`` ``{"api_key": "…"}`` signs in (a wrong key is ``401``) and sets
  the session cookie (:mod:`werk.http.sessions`); ``DELETE`` signs out.
* ``GET /dashboard/events``: the live updates (:mod:`werk.http.dashboard.streams`).

Actions on the page (load, unload, pin, prune) call the protocol's own routes, authenticated by
the cookie. Every response carries a strict Content-Security-Policy (scripts, styles and
connections from this server only; no inline script, no ``eval``), refuses framing, and sends
no referrer; the Host check of ``/werk/v1`` applies to every route here as well.
"""

from __future__ import annotations

from importlib import resources

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ...control.interface import WerkControl
from ...protocol import AuthMode, InvalidRequest, NotFound, encode
from ..activity import Activity
from ..auth import Authenticator
from ..errors import error_response
from ..guard import admit, check_host, check_origin
from ..requests import read_struct
from ..sessions import SESSION_COOKIE
from .snapshot import Snapshots
from .streams import EventStreams

__all__ = ["SECURITY_HEADERS", "dashboard_routes"]

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "media-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}


class SignIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``POST /dashboard/session``."""

    api_key: str


class SessionState(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /dashboard/session``."""

    auth: AuthMode
    signed_in: bool


def _asset(name: str) -> bytes | None:
    files = resources.files(__package__).joinpath("assets")
    if "/" in name or name.startswith(".") or not name.endswith(tuple(_TYPES)):
        return None
    entry = files.joinpath(name)
    return entry.read_bytes() if entry.is_file() else None


def _secured(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def dashboard_routes(
    control: WerkControl, auth: Authenticator, activity: Activity, streams: EventStreams
) -> list[Route]:
    """The dashboard's routes for one server."""
    page = _asset_page()

    async def index(request: Request) -> Response:
        try:
            check_host(request, auth)
        except Exception as exc:
            return _secured(error_response(request, exc))
        response = Response(page, media_type="text/html; charset=utf-8")
        response.headers["Cache-Control"] = "no-store"
        return _secured(response)

    async def asset(request: Request) -> Response:
        try:
            check_host(request, auth)
            name = request.path_params["name"]
            data = _asset(name)
            if data is None:
                raise NotFound("no such dashboard asset")
        except Exception as exc:
            return _secured(error_response(request, exc))
        response = Response(data, media_type=_TYPES["." + name.rsplit(".", 1)[-1]])
        response.headers["Cache-Control"] = "no-cache"
        return _secured(response)

    async def session(request: Request) -> Response:
        try:
            check_host(request, auth)
            if request.method == "GET":
                return _secured(_session_state(request, auth))
            check_origin(request, required=True)
            if request.method == "DELETE":
                response = Response(status_code=204)
                response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
                return _secured(response)
            if auth.mode is not AuthMode.API_KEY:
                raise InvalidRequest("this server asks for no API key; there is nothing to sign in")
            sign_in = await read_struct(request, SignIn, 4096)
            principal = auth.principal(f"Bearer {sign_in.api_key}")
        except Exception as exc:
            return _secured(error_response(request, exc))
        response = Response(
            encode(SessionState(auth=auth.mode, signed_in=True)), media_type="application/json"
        )
        response.set_cookie(
            SESSION_COOKIE,
            auth.sessions.issue(principal),
            max_age=auth.sessions.lifetime,
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return _secured(response)

    async def events(request: Request) -> Response:
        try:
            principal = admit(request, auth)
        except Exception as exc:
            return _secured(error_response(request, exc))
        body = streams.events(principal, Snapshots(control, activity, principal))
        response = StreamingResponse(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        return _secured(response)

    return [
        Route("/", index, methods=["GET"]),
        Route("/dashboard", index, methods=["GET"]),
        Route("/dashboard/assets/{name}", asset, methods=["GET"]),
        Route("/dashboard/session", session, methods=["GET", "POST", "DELETE"]),
        Route("/dashboard/events", events, methods=["GET"]),
    ]


def _session_state(request: Request, auth: Authenticator) -> Response:
    signed_in = auth.mode is AuthMode.UNAUTHENTICATED_LOCAL
    cookie = request.cookies.get(SESSION_COOKIE)
    if not signed_in and cookie is not None:
        try:
            auth.sessions.principal(cookie)
            signed_in = True
        except Exception:
            signed_in = False
    body = encode(SessionState(auth=auth.mode, signed_in=signed_in))
    response = Response(body, media_type="application/json")
    response.headers["Cache-Control"] = "no-store"
    return response


def _asset_page() -> bytes:
    page = resources.files(__package__).joinpath("assets", "index.html")
    return page.read_bytes()
