"""The ``/v1`` completion routes, dispatched straight to their endpoints.

A relayed chat is what ``werk serve`` answers most often. On its way through Starlette it passes
the server-error middleware, the exception middleware, the router (one regular expression per
route until one matches) and the route's request/response wrapper: skipping them saved 3-5 % of
``werk serve``'s CPU per short relayed chat (``benchmarks/proxy_cpu_ab.py --before`` the commit
before, three sittings; docs/performance.md). None of them does anything for
these endpoints: each turns every exception into Werk's error response itself, takes no path
parameters and answers only ``POST``.

:class:`HotRoutes` sits outside the Starlette app. A ``POST`` whose path is exactly one of the
hot routes' goes through the same :class:`~werk.http.exchange.ExchangeMiddleware` work (request
id, framing rules, metrics under the route's template, access log, activity) straight to the
route's endpoint; every other request (another method, a trailing slash, any other path, the
lifespan) goes to the app unchanged, so Starlette answers it as before (405, 404, redirects).
"""

from __future__ import annotations

from collections.abc import Collection

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .activity import Activity
from .exchange import ExchangeMiddleware
from .metrics import HttpMetrics

__all__ = ["HotRoutes"]


class HotRoutes:
    """``app`` with the routes at ``paths`` (``POST`` only) dispatched directly.

    :ivar state: the app's ``state`` (what ``werk serve`` reads from the app it serves).
    :raises ValueError: a path in ``paths`` is not one of the app's ``POST`` routes.
    """

    def __init__(
        self,
        app: Starlette,
        paths: Collection[str],
        *,
        metrics: HttpMetrics,
        activity: Activity | None = None,
    ) -> None:
        self.app = app
        self.state = app.state
        routes = {
            route.path: route
            for route in app.routes
            if isinstance(route, Route) and route.path in paths and "POST" in (route.methods or ())
        }
        missing = sorted(set(paths) - set(routes))
        if missing:
            raise ValueError(f"no POST route for {', '.join(missing)}")
        self._routes = routes
        self._exchange = ExchangeMiddleware(self._dispatch, metrics=metrics, activity=activity)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self._routes:
            await self._exchange(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._routes[scope["path"]]
        scope["app"] = self.app
        scope["route"] = route  # the metrics' route template, as the router would set it
        scope["endpoint"] = route.endpoint
        scope["path_params"] = {}
        response = await route.endpoint(Request(scope, receive, send))
        await response(scope, receive, send)
