"""``HotRoutes``: the ``/v1`` completion routes straight to their endpoints, the rest unchanged."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from werk.http.access import configure_access_log, note_model
from werk.http.activity import Activity
from werk.http.exchange import ExchangeMiddleware
from werk.http.hot_routes import HotRoutes
from werk.http.metrics import HttpMetrics


class Layers:
    """A middleware inside the Starlette app that records the paths passing through it."""

    seen: list[str]

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            Layers.seen.append(scope["path"])
        await self.app(scope, receive, send)


def _served() -> tuple[HotRoutes, HttpMetrics, Activity, list[str]]:
    lifespan_events: list[str] = []

    async def chat(request: Request) -> Response:
        body = await request.json()
        request.scope["werk_principal"] = "p_test"  # what admit() records for the activity tail
        note_model(request, body.get("model"))
        return JSONResponse({"echo": body, "route": request.scope["route"].path})

    async def other(request: Request) -> Response:
        return JSONResponse({"other": True})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        lifespan_events.append("start")
        yield
        lifespan_events.append("stop")

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", other, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    metrics = HttpMetrics()
    app.add_middleware(ExchangeMiddleware, metrics=metrics, activity=Activity())
    app.add_middleware(Layers)
    Layers.seen = []
    app.state.marker = "kept"
    activity = Activity()
    hot = HotRoutes(app, ["/v1/chat/completions"], metrics=metrics, activity=activity)
    return hot, metrics, activity, lifespan_events


def test_a_hot_post_skips_the_app_layers_and_keeps_the_exchange_work(
    capsys: pytest.CaptureFixture[str],
) -> None:
    hot, metrics, activity, _ = _served()
    configure_access_log(True)  # to the stderr capsys captures
    try:
        with TestClient(hot) as client:
            answer = client.post("/v1/chat/completions", json={"model": "m"})
    finally:
        configure_access_log(False)
    assert answer.status_code == 200
    assert answer.json() == {"echo": {"model": "m"}, "route": "/v1/chat/completions"}
    request_id = answer.headers["x-werk-request-id"]
    assert request_id.startswith("req_")
    assert Layers.seen == []  # not through the Starlette app's middleware stack
    requests, _ = metrics.snapshot()
    assert requests == {("/v1/chat/completions", "POST", "2xx"): 1}
    [line] = [x for x in capsys.readouterr().err.splitlines() if x.startswith("werk: ")]
    assert " 200 POST /v1/chat/completions model=m " in line and line.endswith(request_id)
    [entry] = activity.recent("p_test")
    assert (entry.method, entry.path, entry.status, entry.model) == (
        "POST",
        "/v1/chat/completions",
        200,
        "m",
    )


def test_everything_else_goes_through_the_app_as_before() -> None:
    hot, metrics, _, events = _served()
    with TestClient(hot, follow_redirects=False) as client:
        assert client.get("/v1/models").json() == {"other": True}
        assert client.get("/v1/chat/completions").status_code == 405  # Starlette's answer
        slash = client.post("/v1/chat/completions/", json={})
        assert slash.status_code == 307  # Starlette's redirect to the path without the slash
        assert client.post("/nowhere", json={}).status_code == 404
    assert Layers.seen == [
        "/v1/models",
        "/v1/chat/completions",
        "/v1/chat/completions/",
        "/nowhere",
    ]
    assert events == ["start", "stop"]  # the lifespan reaches the app
    assert hot.state.marker == "kept"
    requests, _ = metrics.snapshot()
    assert requests[("/v1/models", "GET", "2xx")] == 1
    assert requests[("/v1/chat/completions", "GET", "4xx")] == 1


def test_a_hot_path_the_app_lacks_is_refused() -> None:
    app = Starlette(routes=[Route("/v1/models", lambda r: Response(), methods=["GET"])])
    with pytest.raises(ValueError, match="/v1/chat/completions"):
        HotRoutes(app, ["/v1/chat/completions"], metrics=HttpMetrics())
    with pytest.raises(ValueError, match="/v1/models"):  # a GET route cannot be a hot one
        HotRoutes(app, ["/v1/models"], metrics=HttpMetrics())
