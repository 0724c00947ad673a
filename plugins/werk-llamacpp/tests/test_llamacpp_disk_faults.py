"""A full ``WERK_HOME`` under ``werk serve`` and its real llama-server (a small ``tmpfs``,
skipped with the reason where this machine cannot mount one).

The disk state's slot file is written by llama-server into its slot directory under
``WERK_HOME``, sealed by Werk, then committed into the state store: whichever of the three
the full disk stops, the prefill answers ``507`` (``unavailable``, retryable, ``Retry-After``),
never a bare ``502``; reads and ``/v1`` go on, and with the space back the same prefill works
and the earlier state is reused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from test_llamacpp_states_e2e import _create_demo, _env
from test_llamacpp_states_support import needs_llama_server

from werk.testing.disk import FilesystemUnavailable, fill, small_filesystem
from werk.testing.server import WERK, server_env, werk_serve

pytestmark = [pytest.mark.slow, needs_llama_server]


def test_a_full_disk_under_llama_server_is_a_retryable_507(tmp_path: Path) -> None:
    outer = tmp_path / "outer"
    outer.mkdir()
    _create_demo(outer, _env())  # the model file lives off the small disk
    model = outer / "models" / "files" / "demo.gguf"
    try:
        with small_filesystem(tmp_path / "home", 64 * 1024 * 1024) as home:
            subprocess.run(
                [str(WERK), "models", "import", str(model), "--id", "demo"],
                check=True,
                capture_output=True,
                env=server_env(home, None, _env()),
            )
            with (
                werk_serve(home, None, ["--model", "demo"], env=_env(), startup_timeout=60) as srv,
                srv.client(timeout=120) as http,
            ):
                _full_disk(home, http)
    except FilesystemUnavailable as exc:
        pytest.skip(f"no small file system can be mounted here: {exc}")


def _prefill(http: httpx.Client, prompt: str, reuse: str = "disabled") -> httpx.Response:
    body = {"model": "demo", "prompt": prompt, "allow_experimental": True,
            "policy": {"retention": "disk", "reuse": reuse}}  # fmt: skip
    return http.post("/werk/v1/prefill", json=body)


def _full_disk(home: Path, http: httpx.Client) -> None:
    first = _prefill(http, "A story about a clock that ran backwards.")
    assert first.status_code == 200, first.text
    state_id = first.json()["state"]["id"]
    filler = fill(home)
    refused = _prefill(http, "A story about a lighthouse keeper and a fox.")
    assert refused.status_code == 507, refused.text
    error = refused.json()["error"]
    assert error["code"] == "unavailable" and error["retryable"] is True, error
    assert int(refused.headers["Retry-After"]) >= 1
    listed = http.get("/werk/v1/states").json()["states"]
    assert [s["id"] for s in listed] == [state_id]
    chat = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert http.post("/v1/chat/completions", json=chat).status_code == 200
    filler.unlink()
    again = _prefill(http, "A story about a lighthouse keeper and a fox.")
    assert again.status_code == 200, again.text
    reused = _prefill(http, "A story about a clock that ran backwards.", reuse="required")
    assert reused.status_code == 200, reused.text
    reuse = reused.json()["reuse"]
    assert (reuse["outcome"], reuse["state_id"], reuse["match"]) == ("reused", state_id, "exact")
