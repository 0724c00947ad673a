"""The ASGI application: ``/werk/v1`` + ``/v1`` + the OpenAPI document + the dashboard."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..control.interface import WerkControl
from ..protocol import encode
from .a1111 import a1111_routes
from .activity import Activity
from .auth import Authenticator
from .comfy import comfy_routes
from .dashboard import EventStreams, dashboard_routes
from .errors import error_response
from .exchange import ExchangeMiddleware
from .guard import admit
from .hot_routes import HotRoutes
from .metrics import HttpMetrics, metrics_endpoint
from .openai import openai_routes
from .routes import werk_routes

__all__ = ["HOT_PATHS", "build_app"]

HOT_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
"""The routes :class:`~werk.http.hot_routes.HotRoutes` dispatches directly."""


def build_app(
    control: WerkControl, auth: Authenticator, *, metrics_public: bool = False
) -> HotRoutes:
    """Assemble the application. Its lifespan runs ``control``'s job queue and idle unloader
    and then closes ``control`` (stopping every runtime). ``metrics_public``: a loopback client
    may scrape ``/metrics`` without a key (``werk serve --metrics-public``).

    ``app.state.dashboard_streams`` (:class:`werk.http.dashboard.EventStreams`): its ``stop()``
    ends the dashboard's live streams; the server calls it when it begins to stop. The Starlette
    app is served through :class:`~werk.http.hot_routes.HotRoutes`: the ``/v1`` completion
    routes (:data:`HOT_PATHS`) skip Starlette's layers."""
    http_metrics = HttpMetrics()
    activity = Activity()
    streams = EventStreams()
    document = _OpenAPIDocument()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            async with anyio.create_task_group() as background:
                await background.start(control.run_jobs)  # interrupted jobs marked failed first
                await background.start(control.run_idle_unloads)
                yield
                background.cancel_scope.cancel()
        finally:
            await control.aclose()

    async def openapi(request: Request) -> Response:
        try:
            admit(request, auth)
        except Exception as exc:
            return error_response(request, exc)
        return Response(await document.encoded(), media_type="application/json")

    async def http_error(request: Request, exc: Exception) -> Response:
        return error_response(request, exc)

    app = Starlette(
        # Starlette tries the routes in order (a regex match each): /v1, the hot path, first.
        # No path of one group can match in another (/v1/…, /werk/v1/…, /metrics, the
        # dashboard's / and /dashboard/…).
        routes=[
            *openai_routes(control, auth),
            *a1111_routes(control, auth),
            *comfy_routes(control, auth),
            *werk_routes(control, auth),
            Route("/werk/v1/openapi.json", openapi, methods=["GET"]),
            Route(
                "/metrics",
                metrics_endpoint(control, auth, http_metrics, public=metrics_public),
                methods=["GET"],
            ),
            *dashboard_routes(control, auth, activity, streams),
        ],
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
    )
    app.add_middleware(ExchangeMiddleware, metrics=http_metrics, activity=activity)
    app.state.dashboard_streams = streams
    return HotRoutes(app, HOT_PATHS, metrics=http_metrics, activity=activity)


class _OpenAPIDocument:
    """The OpenAPI document, generated on its first request (in a worker thread: msgspec's
    schema generation takes tens of milliseconds that ``werk serve``'s start-up need not wait
    for) and kept for the server's lifetime. Two first requests at once both generate it; the
    documents are equal."""

    def __init__(self) -> None:
        self._encoded: bytes | None = None

    async def encoded(self) -> bytes:
        if self._encoded is None:
            self._encoded = await anyio.to_thread.run_sync(_generate_openapi)
        return self._encoded


def _generate_openapi() -> bytes:
    from .openapi import openapi_document

    return encode(openapi_document())
