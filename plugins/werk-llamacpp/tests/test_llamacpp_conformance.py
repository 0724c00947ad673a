"""The conformance kit (``werk.testing``, through its pytest fixture) against the real
llama-server and the generated demo model: registration, rows, ``/v1`` (streaming, a client
that leaves mid-stream, a malformed body) and the state round trip that proves the
``experimental`` rows (prefill → disk → decode, single-use handoff, restore with reuse evidence,
a truncated snapshot refused, decode's stop and seed, auto retention, a longer prompt continuing
a disk state: ``runtime.state.restore.prefix``), and a restart whose new
llama-server restores the first one's disk state (``runtime.state.restore.cross_restart``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from test_llamacpp_process_support import LLAMA_SERVER, demo_model, needs_llama_server
from werk_llamacpp import inspect as llama_inspect
from werk_llamacpp.process import ManagedHandle
from werk_llamacpp.slots import llama_json

from werk import ModelSpec
from werk.testing import ConformanceReport
from werk.testing.service import local_service

pytestmark = [pytest.mark.slow, needs_llama_server]


def test_llamacpp_passes_the_conformance_kit(
    werk_conformance: Callable[..., ConformanceReport],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert LLAMA_SERVER is not None
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(LLAMA_SERVER))
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "werk-home"))
    monkeypatch.delenv("WERK_LLAMA_ARGS", raising=False)
    llama_inspect.forget_inspections()
    gguf = demo_model(tmp_path / "models")
    report = werk_conformance("llamacpp", files=[gguf])
    passed = {c.name for c in report.checks if c.passed}
    assert {
        "restore",
        "restored continuation",
        "corrupted restore refused",
        "decode stop",
        "decode seed (temperature 0.9)",
        "auto retention",
        "runtime restart",
        "cross-restart restore",
        "prefix continuation",
        "/v1 text completion",
    } <= passed, report.summary()
    assert "claim runtime.state.restore experimental" in passed, report.summary()
    assert "claim runtime.state.restore.prefix experimental" in passed, report.summary()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_stream_the_host_closes_mid_reply_frees_its_slot_within_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the HTTP layer does when a client leaves (tests/server/test_contract_hardening.py
    proves that part over a real server): ``aclose()`` on the host's stream. llama-server must
    then stop generating in that slot, and Werk's slot picker must hold nothing."""
    assert LLAMA_SERVER is not None
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(LLAMA_SERVER))
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "werk-home"))
    llama_inspect.forget_inspections()
    gguf = demo_model(tmp_path / "models")
    spec = ModelSpec(id="demo", backend="llamacpp", identity="sha256:" + "5" * 64, files=(gguf,))
    async with local_service([spec], home=tmp_path / "werk-home") as service:
        body = {
            "model": "demo",
            "messages": [{"role": "user", "content": "count"}],
            "max_tokens": 400,
            "stream": True,
        }
        reply = await service.openai_request("local", "chat.completions", body)
        runtime = service.runtimes.live()["demo"]
        handle = runtime.handle
        assert isinstance(handle, ManagedHandle) and reply.stream is not None
        await reply.stream.__anext__()
        assert handle.picker.in_flight() == 1
        await reply.stream.aclose()
        assert handle.picker.in_flight() == 0

        async def processing() -> list[int]:
            slots = await llama_json(handle, "GET", "/slots", "slot listing")
            return [s["id"] for s in slots if s.get("is_processing")]

        with anyio.fail_after(1.0):
            while await processing():
                await anyio.sleep(0.05)
