"""The dashboard's parts without a server: sessions, the activity tail, the live streams and the
shipped assets."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from werk.http.activity import Activity
from werk.http.dashboard.streams import EventStreams
from werk.http.sessions import SessionSigner
from werk.protocol import Unauthenticated

ASSETS = Path(__file__).resolve().parents[2] / "werk" / "http" / "dashboard" / "assets"


# -- sessions ---------------------------------------------------------------------------------


def test_a_session_names_its_principal_until_it_expires() -> None:
    now = [1_000_000.0]
    signer = SessionSigner(b"secret", ["p_a", "p_b"], lifetime=60, clock=lambda: now[0])
    cookie = signer.issue("p_a")
    assert signer.principal(cookie) == "p_a"
    assert "p_a" not in cookie and "secret" not in cookie  # base64, signed, not the key
    now[0] += 61
    with pytest.raises(Unauthenticated, match="expired"):
        signer.principal(cookie)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda c: c[:-2] + ("AA" if not c.endswith("AA") else "BB"),  # signature changed
        lambda c: "x" + c,  # payload changed
        lambda c: c.split(".")[0],  # no signature
        lambda c: c + "." + "A" * 600,  # oversized
        lambda c: "",
    ],
)
def test_a_forged_or_damaged_cookie_is_refused(tamper: Any) -> None:
    signer = SessionSigner(b"secret", ["p_a"])
    with pytest.raises(Unauthenticated):
        signer.principal(tamper(signer.issue("p_a")))


def test_a_new_key_set_or_secret_revokes_every_session() -> None:
    cookie = SessionSigner(b"secret", ["p_a", "p_b"]).issue("p_a")
    assert SessionSigner(b"secret", ["p_b", "p_a"]).principal(cookie) == "p_a"  # same set
    with pytest.raises(Unauthenticated):
        SessionSigner(b"secret", ["p_a", "p_c"]).principal(cookie)  # the set changed
    with pytest.raises(Unauthenticated):
        SessionSigner(b"other", ["p_a", "p_b"]).principal(cookie)  # the namespace changed
    with pytest.raises(Unauthenticated):
        SessionSigner(None, ["p_a", "p_b"]).principal(cookie)  # a random secret: per process


def test_a_cookie_for_a_principal_outside_the_set_is_refused() -> None:
    signer = SessionSigner(b"secret", ["p_a"])
    with pytest.raises(Unauthenticated, match="no longer accepted"):
        signer.principal(signer.issue("p_gone"))


# -- the activity tail ------------------------------------------------------------------------


def _scope(principal: str | None, path: str, model: str | None = None) -> dict[str, Any]:
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": path}
    if principal is not None:
        scope["werk_principal"] = principal
    if model is not None:
        scope["werk_model"] = model
    return scope


def test_the_activity_tail_shows_a_caller_only_its_own_requests_newest_first() -> None:
    activity = Activity(size=10)
    activity.record(_scope("p_a", "/v1/chat/completions", "demo"), 200, 0.0123)
    activity.record(_scope("p_b", "/v1/chat/completions", "secret-model"), 200, 0.01)
    activity.record(_scope("p_a", "/werk/v1/states"), 404, 0.001)
    activity.record(_scope(None, "/werk/v1/health"), 200, 0.001)  # nobody was admitted
    activity.record(_scope("p_a", "/dashboard/events"), 200, 5.0)  # the dashboard's own
    activity.record(_scope("p_a", "/"), 200, 0.001)
    mine = activity.recent("p_a")
    assert [(e.path, e.status, e.model) for e in mine] == [
        ("/werk/v1/states", 404, None),
        ("/v1/chat/completions", 200, "demo"),
    ]
    assert mine[1].milliseconds == 12.3
    assert [e.model for e in activity.recent("p_b")] == ["secret-model"]
    assert activity.recent("p_c") == []


def test_the_activity_tail_is_bounded() -> None:
    activity = Activity(size=3)
    for n in range(5):
        activity.record(_scope("p_a", f"/v1/models/{n}"), 200, 0.001)
    assert [e.path for e in activity.recent("p_a", limit=10)] == [
        "/v1/models/4",
        "/v1/models/3",
        "/v1/models/2",
    ]


# -- the live streams -------------------------------------------------------------------------


class _Counting:
    """Stands for :class:`werk.http.dashboard.snapshot.Snapshots`: numbered updates."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.count = 0
        self.fail_at = fail_at

    async def next(self) -> dict[str, Any]:
        self.count += 1
        if self.count == self.fail_at:
            raise RuntimeError("boom")
        return {"n": self.count}


async def _read(body: Any, events: int) -> list[bytes]:
    out = []
    async for chunk in body:
        out.append(chunk)
        if len(out) == events:
            break
    return out


@pytest.mark.anyio
async def test_a_stream_sends_snapshots_at_its_interval_and_ends_at_its_lifetime() -> None:
    streams = EventStreams(interval=0.01, lifetime=0.2)
    chunks = [chunk async for chunk in streams.events("p_a", _Counting())]  # type: ignore[arg-type]
    assert chunks[0] == b"retry: 3000\n\n"
    snapshots = [c for c in chunks if c.startswith(b"event: snapshot\n")]
    assert 3 <= len(snapshots) <= 25, len(snapshots)
    assert snapshots[0] == b'event: snapshot\ndata: {"n":1}\n\n'
    assert not any(c.startswith(b"event: ended") for c in chunks)  # the browser reconnects
    assert len(streams) == 0


@pytest.mark.anyio
async def test_a_failed_update_is_reported_and_the_stream_goes_on() -> None:
    streams = EventStreams(interval=0.0, lifetime=10)
    body = streams.events("p_a", _Counting(fail_at=2))  # type: ignore[arg-type]
    chunks = await _read(body, 4)
    await body.aclose()  # type: ignore[attr-defined]
    assert chunks[2].startswith(b"event: problem\ndata: ")
    assert b"internal error" in chunks[2]
    assert chunks[3] == b'event: snapshot\ndata: {"n":3}\n\n'
    assert len(streams) == 0


@pytest.mark.anyio
async def test_one_more_page_of_a_caller_ends_its_oldest_stream_with_the_reason() -> None:
    streams = EventStreams(interval=0.01, lifetime=10, per_caller=2)
    first = streams.events("p_a", _Counting())  # type: ignore[arg-type]
    second = streams.events("p_a", _Counting())  # type: ignore[arg-type]
    other = streams.events("p_b", _Counting())  # type: ignore[arg-type]
    assert len(streams) == 0  # nothing is open before a body is iterated
    for body in (first, second, other):
        await _read(body, 1)
    assert len(streams) == 3
    third = streams.events("p_a", _Counting())  # type: ignore[arg-type]
    await _read(third, 1)
    chunks = [chunk async for chunk in first]
    assert chunks[-1].startswith(b"event: ended\ndata: ")
    assert b"a newer dashboard page" in chunks[-1]
    assert len(streams) == 3  # second, third and the other caller's
    for body in (second, other, third):
        assert (await _read(body, 1))[0].startswith(b"event: snapshot")
        await body.aclose()  # type: ignore[attr-defined]
    assert len(streams) == 0


@pytest.mark.anyio
async def test_stopping_the_server_ends_every_stream_at_once() -> None:
    streams = EventStreams(interval=30, lifetime=600)
    bodies = [streams.events(p, _Counting()) for p in ("p_a", "p_b")]  # type: ignore[arg-type]
    for body in bodies:
        await _read(body, 2)  # the stream now waits its 30 s interval
    with anyio.fail_after(5):
        streams.stop()
        for body in bodies:
            rest = [chunk async for chunk in body]
            assert rest and b"the server is stopping" in rest[-1]
        late = [chunk async for chunk in streams.events("p_c", _Counting())]  # type: ignore[arg-type]
    assert b"the server is stopping" in late[-1]
    assert len(streams) == 0


# -- the shipped page -------------------------------------------------------------------------


def test_the_assets_are_small_local_and_free_of_inline_script() -> None:
    files = sorted(p for p in ASSETS.iterdir() if p.is_file())
    assert {p.suffix for p in files} == {".html", ".css", ".js"}
    assert sum(p.stat().st_size for p in files) <= 300 * 1024
    for path in files:
        text = path.read_text()
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text), path  # no CDN
        assert "eval(" not in text and "new Function" not in text and "innerHTML" not in text
        assert "localStorage" not in text and "sessionStorage" not in text, path
    page = (ASSETS / "index.html").read_text()
    assert re.findall(r"<script\b[^>]*>", page) == [
        '<script type="module" src="/dashboard/assets/app.js">'
    ]
    assert " style=" not in page and "<style" not in page  # style-src 'self' only
    assert not re.search(r"<[^>]+\son[a-z]+=", page)  # no inline event handlers
