"""The dashboard in a real browser (Debian's Chromium driven by Playwright) against a real
``werk serve`` with real backends: the llama.cpp demo model (a real ``llama-server``) and a
tiny Diffusers pipeline (the real media worker).

One session walks what a user does: sign in (a wrong key refused first), load the demo model and
see its memory appear, pin and prune a state after its preview, unload the model, watch an image
job finish and its thumbnail render, and read the request tail; axe-core checks WCAG 2.1 A/AA at
a small laptop size and at a phone width. Screenshots of each panel are taken on every run;
``WERK_DASHBOARD_SCREENSHOTS=DIR`` keeps them (``make screenshots`` writes docs/images/).

Nothing here skips on this machine: ``make test`` installs Chromium and the backends first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Browser, Page, expect, sync_playwright
from werk_llamacpp.executable import locate_llama_server

from werk.testing.server import WERK, WerkServer, server_env, werk_serve

pytestmark = pytest.mark.slow

KEY = "dashboard-key-0123456789abcdef"
DEMO, IMAGE = "demo", "tiny-image"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WCAG = {"runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]}}
PANELS = ("memory", "runtimes", "states", "jobs", "reuse", "activity", "capabilities")


def _chromium() -> str:
    found = os.environ.get("WERK_CHROMIUM") or shutil.which("chromium")
    if not found:
        pytest.fail(
            "no Chromium: `make test` installs Debian's chromium "
            "(apt-get install --no-install-recommends chromium)"
        )
    return found


BACKENDS = os.environ.get("WERK_BACKENDS_DIR", "")  # read before a test's hermetic environment
LLAMA_SERVER = locate_llama_server().path


def _backends() -> str:
    backends = BACKENDS
    if not backends:
        pytest.fail("WERK_BACKENDS_DIR is not set: run the suite with `make test` (make media-env)")
    return backends


def _env() -> dict[str, str]:
    if LLAMA_SERVER is None:
        pytest.skip("no llama-server executable on this machine")
    return {"WERK_BACKENDS_DIR": _backends(), "WERK_LLAMA_SERVER": str(LLAMA_SERVER)}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WerkServer]:
    env = _env()
    home = tmp_path_factory.mktemp("dashboard") / "home"
    home.mkdir()
    for made in (
        ["models", "create-demo", "--id", DEMO],
        ["models", "create-demo", "--kind", "image", "--id", IMAGE],
    ):
        subprocess.run(
            [str(WERK), *made], check=True, capture_output=True, env=server_env(home, None, env)
        )
    args = ["--model", DEMO, "--model", IMAGE, "--api-key", KEY]
    with werk_serve(home, None, args, env=env, startup_timeout=120) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=_chromium(), args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(
        os.environ.get("WERK_DASHBOARD_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots")
    )


def _api(server: WerkServer) -> httpx.Client:
    return server.client(KEY, timeout=300)


def _row(page: Page, table: str, key: str) -> Any:
    return page.locator(f"#{table} tbody tr[data-key='{key}']")


def _axe(page: Page, where: str) -> None:
    results = Axe().run(page, options=WCAG)
    assert results.violations_count == 0, f"{where}:\n{results.generate_snapshot()}"


def _shoot(page: Page, shots: Path, name: str) -> None:
    shots.mkdir(parents=True, exist_ok=True)
    path = shots / f"dashboard-{name}.png"
    page.locator(f"#{name}-panel").screenshot(path=path)
    assert path.stat().st_size > 1000


def test_a_user_signs_in_and_runs_the_server_from_the_page(
    server: WerkServer, browser: Browser, shots: Path
) -> None:
    context = browser.new_context(viewport={"width": 1024, "height": 600})
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(server.base_url + "/")

    # -- sign in: a wrong key is refused, the right one gives an HttpOnly, Strict cookie -------
    expect(page.locator("#sign-in-panel")).to_be_visible()
    expect(page.locator("#panels")).to_be_hidden()
    page.fill("#api-key", "not-the-key")
    page.click("#sign-in button[type=submit]")
    expect(page.locator("#sign-in-error")).to_contain_text("Sign-in refused")
    assert not context.cookies()
    _axe(page, "sign-in form")
    page.fill("#api-key", KEY)
    page.click("#sign-in button[type=submit]")
    expect(page.locator("#panels")).to_be_visible()
    expect(page.locator("#connection")).to_have_text("Live", timeout=15_000)
    (cookie,) = context.cookies()
    assert (
        cookie["name"] == "werk_session" and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    )
    assert "werk_session" not in page.evaluate("document.cookie")
    assert page.evaluate("localStorage.length + sessionStorage.length") == 0
    assert KEY not in page.content() and KEY not in cookie["value"] and KEY not in page.url

    # -- load the demo model: its runtime and resident memory appear ----------------------------
    with _api(server) as api:  # `werk serve --model demo` loaded it at start: begin unloaded
        assert api.post(f"/werk/v1/models/{DEMO}/unload", json={}).status_code == 200
    demo = _row(page, "runtimes", DEMO)
    expect(demo.locator("td").nth(1)).to_contain_text("not loaded", timeout=15_000)
    page.get_by_role("button", name=f"Load {DEMO}").click()
    expect(demo.locator("td").nth(1)).to_contain_text("loaded", timeout=120_000)
    expect(demo.locator("td").nth(1)).not_to_contain_text("not loaded")
    expect(demo.locator("td").nth(3)).to_contain_text("iB", timeout=30_000)  # resident bytes
    observed = page.locator("#accounting dt:has-text('Observed') + dd")
    expect(observed).to_contain_text("MiB")  # the llama-server process holds tens of MiB
    gauge = page.get_by_role("progressbar", name="Host memory")
    assert 0 < float(gauge.get_attribute("aria-valuenow") or "0") <= 100
    expect(page.locator("#plot-summary")).to_contain_text("Host memory used over the last")

    # -- a state saved through the API shows up; pin it, then prune it after the preview -------
    with _api(server) as api:
        made = api.post(
            "/werk/v1/prefill",
            json={
                "model": DEMO,
                "prompt": "The dashboard lists the states of the signed-in key.",
                "allow_experimental": True,
                "policy": {"retention": "disk"},
            },
        )
        assert made.status_code == 200, made.text
        state_id = made.json()["state"]["id"]
        handoff = made.json()["handoff"]["token"]
        decoded = api.post("/werk/v1/decode", json={"handoff": handoff, "max_tokens": 4})
        assert decoded.status_code == 200, decoded.text  # no live handoff holds the state now
    state = _row(page, "states", state_id)
    expect(state).to_be_visible(timeout=15_000)
    page.get_by_role("button", name=f"Pin {state_id}").click()
    expect(state.locator("td").nth(5)).to_have_text("yes", timeout=15_000)
    page.get_by_role("button", name=f"Unpin {state_id}").click()
    expect(state.locator("td").nth(5)).to_have_text("no", timeout=15_000)
    page.get_by_role("checkbox", name=f"Select {state_id}").check()
    page.click("#prune-preview")
    expect(page.locator("#prune-plan")).to_be_visible()
    expect(page.locator("#prune-list")).to_contain_text(state_id)
    with _api(server) as api:  # a preview deletes nothing
        assert api.get(f"/werk/v1/states/{state_id}").status_code == 200
    _shoot(page, shots, "states")
    page.click("#prune-confirm")
    expect(page.locator("#action-result")).to_contain_text("Pruned 1 state(s)")
    expect(state).to_have_count(0, timeout=15_000)
    with _api(server) as api:
        assert api.get(f"/werk/v1/states/{state_id}").status_code == 404

    # -- reuse figures and the request tail, for this key -----------------------------------
    expect(_row(page, "reuse", DEMO)).to_be_visible(timeout=15_000)
    expect(page.locator("#activity tbody")).to_contain_text("POST /werk/v1/prefill")

    # -- an image job: its thumbnail renders ---------------------------------------------------
    with _api(server) as api:
        request = {"model": IMAGE, "prompt": "a red square", "size": "64x64", "steps": 2, "seed": 3}
        job = api.post("/v1/jobs", json={"kind": "images.generations", "request": request})
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
    thumbnail = page.locator(f"#jobs li[data-key='{job_id}'] img")
    expect(thumbnail).to_be_visible(timeout=300_000)
    page.wait_for_function(
        "(img) => img.complete && img.naturalWidth === 64", arg=thumbnail.element_handle()
    )
    expect(page.locator(f"#jobs li[data-key='{job_id}']")).to_contain_text("completed")

    # -- screenshots of each panel and the accessibility check, laptop and phone widths ---------
    for name in PANELS:
        if name != "states":
            _shoot(page, shots, name)
    page.screenshot(path=shots / "dashboard.png", full_page=True)
    _axe(page, "dashboard at 1024x600")
    page.set_viewport_size({"width": 390, "height": 844})
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways at a phone width ({width} px)"
    _axe(page, "dashboard at 390x844")
    page.set_viewport_size({"width": 1024, "height": 600})

    # -- unload: the runtime goes -------------------------------------------------------------
    page.get_by_role("button", name=f"Unload {DEMO}").click()
    expect(demo.locator("td").nth(1)).to_contain_text("not loaded", timeout=60_000)
    with _api(server) as api:
        assert DEMO not in [r["model"] for r in api.get("/werk/v1/runtimes").json()["runtimes"]]

    # -- sign out: the stream ends and the page asks for a key again ---------------------------
    page.click("#sign-out")
    expect(page.locator("#sign-in-panel")).to_be_visible()
    assert not [c for c in context.cookies() if c["name"] == "werk_session"]
    assert problems == []
    context.close()


def test_a_valid_session_cookie_sent_with_a_foreign_origin_changes_nothing(
    server: WerkServer, browser: Browser
) -> None:
    """The cookie a real sign-in gave, replayed by a client that says it comes from another
    site, cannot load a model (a browser would not even send a SameSite=Strict cookie
    cross-site; the Origin check holds without relying on that). With API keys the Host is not
    what protects the server (as on ``/werk/v1``), so a read under another Host still works."""
    context = browser.new_context()
    page = context.new_page()
    page.goto(server.base_url + "/")
    page.fill("#api-key", KEY)
    page.click("#sign-in button[type=submit]")
    expect(page.locator("#panels")).to_be_visible()
    (cookie,) = context.cookies()
    with httpx.Client(base_url=server.base_url, timeout=30) as forged:
        forged.cookies.set("werk_session", cookie["value"], domain="127.0.0.1")
        answer = forged.post(
            f"/werk/v1/models/{DEMO}/load", json={}, headers={"Origin": "http://evil.example"}
        )
        assert answer.status_code == 400
        assert "Origin" in answer.json()["error"]["message"]
        assert forged.get("/werk/v1/runtimes", headers={"Host": "evil.example"}).status_code == 200
    context.close()
    deadline = time.monotonic() + 1  # nothing was loaded by the refused request
    with _api(server) as api:
        while time.monotonic() < deadline:
            loading = api.get("/werk/v1/runtimes").json()["loading"]
            assert DEMO not in [r["model"] for r in loading]
            time.sleep(0.1)


def test_without_api_keys_the_page_opens_directly(
    tmp_path: Path, server: WerkServer, browser: Browser
) -> None:
    """Unauthenticated local mode: no sign-in, no sign-out, the local user's view."""
    home = tmp_path / "home"
    shutil.copytree(server.home / "models", home / "models")  # the same generated models
    with werk_serve(home, None, ["--model", DEMO], env=_env(), startup_timeout=120) as local:
        page = browser.new_page()
        page.goto(local.base_url + "/")
        expect(page.locator("#panels")).to_be_visible()
        expect(page.locator("#sign-in-panel")).to_be_hidden()
        expect(page.locator("#sign-out")).to_be_hidden()
        expect(page.locator("#server-line")).to_contain_text("local mode, no key")
        expect(_row(page, "runtimes", DEMO)).to_contain_text("loaded", timeout=60_000)
        assert not page.context.cookies()
        page.close()
