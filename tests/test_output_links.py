"""Signed output links (:mod:`werk.http.links`): absolute, bound to one output and one
principal, expiring; anything altered is refused."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request

from werk.http.links import OutputLinks
from werk.protocol import Unauthenticated

NOW = 1_765_000_000.0


def _request(host: str = "127.0.0.1:11434", query: str = "", path: str = "/v1/jobs") -> Request:
    scope = {
        "type": "http",
        "method": "GET",
        "scheme": "http",
        "server": ("127.0.0.1", 11434),
        "path": path,
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(b"host", host.encode())],
    }
    return Request(scope)


def _links(clock: list[float], secret: bytes = b"s" * 32) -> OutputLinks:
    return OutputLinks(secret, lifetime=3600, clock=lambda: clock[0])


def _follow(links: OutputLinks, url: str, output_id: str) -> str | None:
    parts = urlsplit(url)
    return links.principal(_request(query=parts.query, path=parts.path), output_id)


def test_a_link_is_absolute_from_the_request_host_and_grants_its_output() -> None:
    clock = [NOW]
    links = _links(clock)
    url = links.absolute(_request("werk.local:8080"), "p_abc", "/v1/outputs/out_1")
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == (
        "http",
        "werk.local:8080",
        "/v1/outputs/out_1",
    )
    assert dict(parse_qsl(parts.query))["expires"] == str(int(NOW) + 3600)
    assert _follow(links, url, "out_1") == "p_abc"
    assert links.absolute(_request(), "p_abc", "https://elsewhere/x") == "https://elsewhere/x"


def test_no_link_leaves_the_decision_to_the_api_key() -> None:
    assert _links([NOW]).principal(_request(), "out_1") is None


def test_expired_forged_or_moved_links_are_refused() -> None:
    clock = [NOW]
    links = _links(clock)
    url = links.absolute(_request(), "p_abc", "/v1/outputs/out_1")
    with pytest.raises(Unauthenticated, match="signature"):
        _follow(links, url, "out_2")  # another output
    query = dict(parse_qsl(urlsplit(url).query))
    for changed in ({"principal": "p_other"}, {"expires": str(int(NOW) + 99999)}):
        forged = "/v1/outputs/out_1?" + urlencode({**query, **changed})
        with pytest.raises(Unauthenticated, match="signature"):
            _follow(links, forged, "out_1")
    with pytest.raises(Unauthenticated, match="incomplete"):
        _follow(links, "/v1/outputs/out_1?signature=x", "out_1")
    with pytest.raises(Unauthenticated, match="signature"):
        _follow(_links(clock, b"t" * 32), url, "out_1")  # another server's key
    clock[0] = NOW + 3601
    with pytest.raises(Unauthenticated, match="expired"):
        _follow(links, url, "out_1")


@given(signature=st.text(min_size=1, max_size=60))
def test_no_guessed_signature_is_accepted(signature: str) -> None:
    links = _links([NOW])
    query = urlencode({"principal": "p_abc", "expires": int(NOW) + 10, "signature": signature})
    with pytest.raises(Unauthenticated):
        links.principal(_request(query=query), "out_1")
