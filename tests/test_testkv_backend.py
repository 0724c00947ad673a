"""The ``testkv`` test backend (``tests/test_backend/``) works through the real hook dispatch.

The plugin is imported from its source directory (put on ``sys.path`` by ``monkeypatch``, never
installed into the dev venv) and registered in-memory with :func:`werk.get_plugin_manager`; every
operation goes through ``pm.call_operation`` exactly as the control service will call it. What
this proves: the states are real opaque bytes and files (snapshots are files on disk that
restore reads back, with a verified header and checksum); reuse reports a computed prefix length;
decode is deterministic and honours ``max_tokens`` and ``stop``; cross-runtime and malformed
payloads fail with the right typed errors; capability rows follow runtime liveness; ``/v1``
answers match decode and stream valid chunks; and (slow) a ``pip install --target`` copy on
``PYTHONPATH`` is discovered through its entry point by a separate interpreter.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import werk

TEST_BACKEND_DIR = Path(__file__).resolve().parent / "test_backend"
PACKAGE_DIR = TEST_BACKEND_DIR / "werk_test_backend"
DIST = "werk-test-backend"
VOCAB_A = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda"
VOCAB_B = "one two three four five six seven eight nine ten"
ALL_STATE_ROWS = (
    "runtime.state.prefix_cache",
    "runtime.state.persistence",
    "runtime.state.restore",
    "runtime.state.tier.disk",
    "runtime.pd.prefill",
    "runtime.pd.decode",
    "runtime.pd.handoff",
)


@pytest.fixture
def testkv(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The ``werk_test_backend`` package, imported from ``tests/test_backend/``."""
    monkeypatch.syspath_prepend(str(TEST_BACKEND_DIR))
    module = importlib.import_module("werk_test_backend")
    assert Path(module.__file__ or "").resolve().parent == PACKAGE_DIR
    return module


@pytest.fixture
def pm(testkv: ModuleType) -> werk.WerkPluginManager:
    plugin = importlib.import_module("werk_test_backend.plugin")
    return werk.get_plugin_manager(load_entrypoints=False, plugins=[(DIST, plugin)], environ={})


def make_spec(tmp_path: Path, text: str, *, model_id: str = "m", name: str = "model") -> Any:
    path = tmp_path / f"{name}.testkv"
    path.write_text(text, encoding="utf-8")
    identity = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    return werk.ModelSpec(id=model_id, backend="testkv", identity=identity, files=(path,))


@contextlib.asynccontextmanager
async def running(pm: werk.WerkPluginManager, spec: werk.ModelSpec) -> AsyncIterator[Any]:
    descriptor = pm.backends["testkv"]
    assert descriptor.start is not None and descriptor.stop is not None
    runtime = await descriptor.start(spec)
    try:
        yield runtime
    finally:
        await descriptor.stop(runtime)


async def prefill(
    pm: werk.WerkPluginManager, runtime: werk.Runtime, **kwargs: Any
) -> werk.PrefillOutcome:
    out = await pm.call_operation(werk.Operation.PREFILL, runtime, call=werk.PrefillCall(**kwargs))
    assert isinstance(out, werk.PrefillOutcome)
    return out


async def decode(
    pm: werk.WerkPluginManager, runtime: werk.Runtime, state: werk.BackendState, **kwargs: Any
) -> werk.DecodeOutcome:
    out = await pm.call_operation(
        werk.Operation.DECODE, runtime, call=werk.DecodeCall(state=state, **kwargs)
    )
    assert isinstance(out, werk.DecodeOutcome)
    return out


async def snapshot(
    pm: werk.WerkPluginManager, runtime: werk.Runtime, state: werk.BackendState
) -> werk.BackendState:
    out = await pm.call_operation(werk.Operation.SNAPSHOT, runtime, state=state)
    assert isinstance(out, werk.BackendState)
    return out


async def restore(
    pm: werk.WerkPluginManager, runtime: werk.Runtime, payload: werk.BackendState
) -> werk.BackendState:
    out = await pm.call_operation(werk.Operation.RESTORE, runtime, payload=payload)
    assert isinstance(out, werk.BackendState)
    return out


def bytes_payload(data: bytes, generation: str = "g_0") -> werk.BackendState:
    return werk.BackendState(kind=werk.StateKind.BYTES, data=data, generation=generation)


# -- registration ----------------------------------------------------------------------------


def test_registers_testkv_with_its_hooks(pm: werk.WerkPluginManager) -> None:
    record = pm.records[DIST]
    assert record.status == "loaded" and record.error is None
    assert record.backends == ["testkv"]
    assert record.hooks == [
        "werk_capabilities",
        "werk_decode",
        "werk_openai",
        "werk_prefill",
        "werk_register_backends",
        "werk_restore",
        "werk_snapshot",
    ]
    descriptor = pm.backends["testkv"]
    assert descriptor.formats == ("testkv",)
    assert descriptor.start is not None and descriptor.stop is not None
    assert "TEST CODE" in descriptor.description


def test_imports_only_public_werk_names() -> None:
    """Every module is documented as test code and imports only ``werk`` / ``werk.protocol``."""
    modules = sorted(PACKAGE_DIR.glob("*.py"))
    assert len(modules) >= 5
    for module in modules:
        tree = ast.parse(module.read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree) or ""
        assert "TEST CODE" in doc, module.name
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                if name.split(".")[0] == "werk":
                    assert name in ("werk", "werk.protocol"), f"{module.name} imports {name}"
    init_doc = ast.get_docstring(ast.parse((PACKAGE_DIR / "__init__.py").read_text()))
    assert "never loaded by default; installed only by the test suite" in (init_doc or "")


# -- runtime lifecycle -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_start_gives_distinct_live_runtimes_and_stop_kills(
    pm: werk.WerkPluginManager, tmp_path: Path
) -> None:
    spec = make_spec(tmp_path, VOCAB_A)
    descriptor = pm.backends["testkv"]
    assert descriptor.start is not None and descriptor.stop is not None
    first = await descriptor.start(spec)
    second = await descriptor.start(spec)
    try:
        for runtime in (first, second):
            assert re.fullmatch(r"g_[0-9a-f]{16}", runtime.generation)
            assert runtime.backend == "testkv" and runtime.model is spec
            assert runtime.executable == "" and runtime.args == ("--testkv",)
            assert runtime.cache_layout == "testkv-v1" and runtime.alive
            assert runtime.handle.state_dir.is_dir()
        assert first.generation != second.generation
    finally:
        await descriptor.stop(second)
    state_dir = first.handle.state_dir
    await descriptor.stop(first)
    await descriptor.stop(first)  # idempotent
    assert not first.alive and not state_dir.exists()
    with pytest.raises(werk.Unavailable) as err:
        await prefill(pm, first, prompt="hello")
    assert first.generation in err.value.message


@pytest.mark.anyio
async def test_start_refuses_bad_model_files(
    pm: werk.WerkPluginManager, testkv: ModuleType, tmp_path: Path
) -> None:
    start = pm.backends["testkv"].start
    assert start is not None
    no_files = werk.ModelSpec(id="m", backend="testkv", identity="sha256:0")
    empty = make_spec(tmp_path, "  \n\t ", name="empty")
    binary = make_spec(tmp_path, "", name="binary")
    binary.files[0].write_bytes(b"\xff\xfe\x00weights")
    missing = werk.ModelSpec(
        id="m", backend="testkv", identity="sha256:0", files=(tmp_path / "gone.testkv",)
    )
    for spec in (no_files, empty, binary, missing):
        with pytest.raises(werk.BackendError) as err:
            await start(spec)
        assert str(tmp_path) not in err.value.message
    with pytest.raises(RuntimeError, match="simulated start failure"):
        await start(make_spec(tmp_path, f"alpha {testkv.FAIL_START} beta", name="fail"))


# -- prefill / snapshot / restore ------------------------------------------------------------


@pytest.mark.anyio
async def test_prefill_snapshot_restore_then_reuse(
    pm: werk.WerkPluginManager, testkv: ModuleType, tmp_path: Path
) -> None:
    prompt = "The quick brown fox — naïve ✓"
    tokens = prompt.encode("utf-8")
    async with running(pm, make_spec(tmp_path, VOCAB_A)) as runtime:
        fresh = await prefill(pm, runtime, prompt=prompt)
        assert fresh.prompt_tokens == len(tokens) and fresh.cached_tokens == 0
        assert fresh.state.kind is werk.StateKind.HANDLE
        assert fresh.state.generation == runtime.generation
        assert fresh.state.tokens == len(tokens)

        snap = await snapshot(pm, runtime, fresh.state)
        assert snap.kind is werk.StateKind.FILE and snap.path is not None
        assert snap.path.parent == runtime.handle.state_dir
        data = snap.path.read_bytes()
        assert snap.logical_bytes == len(data) == fresh.state.logical_bytes
        assert data.startswith(b"TESTKV01")
        assert runtime.generation.encode() in data and tokens in data
        assert data[-32:] == hashlib.sha256(data[:-32]).digest()
        assert oct(snap.path.stat().st_mode & 0o777) == oct(0o600)
        assert not [p for p in snap.path.parent.iterdir() if p.name.endswith(".tmp")]

        restored = await restore(pm, runtime, snap)
        assert restored.kind is werk.StateKind.HANDLE and restored.tokens == len(tokens)
        from_bytes = await restore(pm, runtime, bytes_payload(data, runtime.generation))
        assert from_bytes.handle == restored.handle

        same = await prefill(pm, runtime, prompt=prompt, reuse_from=restored)
        assert same.cached_tokens == same.prompt_tokens == len(tokens)
        longer = await prefill(pm, runtime, prompt=prompt + " jumps", reuse_from=snap)
        assert longer.cached_tokens == len(tokens)
        assert longer.prompt_tokens == len(tokens) + len(" jumps")

        world = await prefill(pm, runtime, prompt="hello world")
        there = await prefill(pm, runtime, prompt="hello there", reuse_from=world.state)
        assert there.cached_tokens == len("hello ") and there.prompt_tokens == len("hello there")
        nothing = await prefill(pm, runtime, prompt="xyz", reuse_from=world.state)
        assert nothing.cached_tokens == 0


@pytest.mark.anyio
async def test_messages_use_the_template_and_reuse_across_turns(
    pm: werk.WerkPluginManager, testkv: ModuleType, tmp_path: Path
) -> None:
    from werk.protocol import ChatMessage

    turn1 = [ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="hi")]
    turn2 = [
        *turn1,
        ChatMessage(role="assistant", content="hey"),
        ChatMessage(role="user", content="?"),
    ]
    expected = "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    assert testkv.render_messages((m.role, m.content) for m in turn1) == expected
    async with running(pm, make_spec(tmp_path, VOCAB_A)) as runtime:
        first = await prefill(pm, runtime, messages=turn1)
        assert first.prompt_tokens == len(expected.encode())
        second = await prefill(pm, runtime, messages=turn2, reuse_from=first.state)
        assert second.cached_tokens == first.prompt_tokens < second.prompt_tokens


# -- decode ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_decode_is_deterministic_and_honours_limits(
    pm: werk.WerkPluginManager, tmp_path: Path
) -> None:
    async with running(pm, make_spec(tmp_path, VOCAB_A)) as runtime:
        out = await prefill(pm, runtime, prompt="Tell me a story")
        full = await decode(pm, runtime, out.state)
        again = await decode(pm, runtime, out.state, temperature=0.9, seed=7)
        assert (again.text, again.finish_reason, again.completion_tokens) == (
            full.text,
            full.finish_reason,
            full.completion_tokens,
        )
        words = full.text.split(" ")
        assert full.finish_reason == "stop" and 3 <= full.completion_tokens <= 16
        assert len(words) == full.completion_tokens and set(words) <= set(VOCAB_A.split())

        restored = await restore(pm, runtime, await snapshot(pm, runtime, out.state))
        assert (await decode(pm, runtime, restored)).text == full.text

        one = await decode(pm, runtime, out.state, max_tokens=1)
        assert (one.text, one.finish_reason, one.completion_tokens) == (words[0], "length", 1)
        zero = await decode(pm, runtime, out.state, max_tokens=0)
        assert (zero.text, zero.finish_reason, zero.completion_tokens) == ("", "length", 0)

        stop = words[1]
        cut = await decode(pm, runtime, out.state, stop=["never-produced", stop])
        assert cut.finish_reason == "stop" and stop not in cut.text
        assert cut.text == full.text[: full.text.index(stop)]

        other_prompt = await prefill(pm, runtime, prompt="Tell me a story!")
        other = await decode(pm, runtime, other_prompt.state)
        assert set(other.text.split(" ")) <= set(VOCAB_A.split())

    async with running(pm, make_spec(tmp_path, VOCAB_B, name="b")) as runtime_b:
        out_b = await prefill(pm, runtime_b, prompt="Tell me a story")
        text_b = (await decode(pm, runtime_b, out_b.state)).text
        assert set(text_b.split(" ")) <= set(VOCAB_B.split())
        assert text_b != full.text


@pytest.mark.anyio
async def test_magic_prompts_fail_or_overflow(
    pm: werk.WerkPluginManager, testkv: ModuleType, tmp_path: Path
) -> None:
    plugin = importlib.import_module("werk_test_backend.plugin")
    async with running(pm, make_spec(tmp_path, VOCAB_A)) as runtime:
        with pytest.raises(werk.BackendError) as err:
            await prefill(pm, runtime, prompt=f"x {testkv.FAIL_PREFILL} y")
        assert testkv.FAILURE_DETAIL not in err.value.message
        with pytest.raises(RuntimeError, match=re.escape(testkv.FAILURE_DETAIL)):
            await plugin.werk_prefill(runtime, werk.PrefillCall(prompt=testkv.FAIL_PREFILL))

        doomed = await prefill(pm, runtime, prompt=f"x {testkv.FAIL_DECODE}")
        with pytest.raises(werk.BackendError) as err:
            await decode(pm, runtime, doomed.state)
        assert testkv.FAILURE_DETAIL not in err.value.message

        huge = await prefill(pm, runtime, prompt=f"give me {testkv.HUGE}")
        out = await decode(pm, runtime, huge.state, max_tokens=4)
        assert len(out.text.encode("utf-8")) == testkv.HUGE_COMPLETION_BYTES == 1024 * 1024 + 1
        assert out.finish_reason == "length"
        assert runtime.alive  # simulated failures do not kill the runtime


# -- incompatible and malformed states -------------------------------------------------------


@pytest.mark.anyio
async def test_states_of_another_runtime_are_incompatible(
    pm: werk.WerkPluginManager, testkv: ModuleType, tmp_path: Path
) -> None:
    spec = make_spec(tmp_path, VOCAB_A)
    async with running(pm, spec) as a, running(pm, spec) as b:
        out = await prefill(pm, a, prompt="shared prompt")
        snap = await snapshot(pm, a, out.state)
        with pytest.raises(werk.IncompatibleState, match="process generation"):
            await restore(pm, b, snap)
        with pytest.raises(werk.IncompatibleState):
            await decode(pm, b, out.state)
        with pytest.raises(werk.IncompatibleState):
            await prefill(pm, b, prompt="shared prompt", reuse_from=out.state)
        with pytest.raises(werk.IncompatibleState):
            await snapshot(pm, b, out.state)

        forged = testkv.KVState(
            generation=b.generation,
            model_identity=spec.identity,
            weights="sha256:" + "0" * 64,
            cache_layout="testkv-v1",
            tokens=b"abc",
        ).encode()
        with pytest.raises(werk.IncompatibleState, match="model weights"):
            await restore(pm, b, bytes_payload(forged, b.generation))
        assert snap.path is not None and snap.path.exists()  # a failed restore changes nothing


def _reframe(header: bytes, tokens: bytes) -> bytes:
    """A payload with a *valid* checksum around arbitrary header bytes."""
    body = b"TESTKV01" + len(header).to_bytes(4, "big") + header + tokens
    return body + hashlib.sha256(body).digest()


def _malformed_payloads(valid: bytes) -> dict[str, bytes]:
    good_header = json.loads(valid[12 : 12 + int.from_bytes(valid[8:12], "big")])
    flipped = bytearray(valid)
    flipped[len(valid) // 2] ^= 0x01
    return {
        "empty": b"",
        "not a state": b"this is not a testkv state, only some text" * 2,
        "truncated": valid[:-1],
        "bit flip": bytes(flipped),
        "wrong magic": b"TESTKV99" + valid[8:],
        "header not json": _reframe(b"{not json", b"abc"),
        "header wrong fields": _reframe(json.dumps({**good_header, "x": 1}).encode(), b"abc"),
        "token count lies": _reframe(json.dumps({**good_header, "tokens": 99}).encode(), b"abc"),
        "header length lies": b"TESTKV01" + (10**6).to_bytes(4, "big") + valid[12:],
    }


@pytest.mark.anyio
async def test_malformed_payloads_are_backend_errors(
    pm: werk.WerkPluginManager, tmp_path: Path
) -> None:
    async with running(pm, make_spec(tmp_path, VOCAB_A)) as runtime:
        out = await prefill(pm, runtime, prompt="abc")
        snap = await snapshot(pm, runtime, out.state)
        assert snap.path is not None
        valid = snap.path.read_bytes()
        for name, data in _malformed_payloads(valid).items():
            with pytest.raises(werk.BackendError) as err:
                await restore(pm, runtime, bytes_payload(data, runtime.generation))
            assert "malformed" in err.value.message, name
            bad_file = tmp_path / "bad.testkv-state"
            bad_file.write_bytes(data)
            file_state = werk.BackendState(
                kind=werk.StateKind.FILE, path=bad_file, generation=runtime.generation
            )
            with pytest.raises(werk.BackendError) as err:
                await restore(pm, runtime, file_state)
            assert str(tmp_path) not in err.value.message, name
        missing = werk.BackendState(
            kind=werk.StateKind.FILE, path=tmp_path / "missing", generation=runtime.generation
        )
        with pytest.raises(werk.BackendError) as err:
            await restore(pm, runtime, missing)
        assert str(tmp_path) not in err.value.message
        with pytest.raises(werk.BackendError):  # restore wants a payload, not a live handle
            await restore(pm, runtime, out.state)
        with pytest.raises(werk.BackendError):  # decode wants a live handle
            await decode(pm, runtime, snap)
        foreign = werk.BackendState(
            kind=werk.StateKind.HANDLE, handle=object(), generation=runtime.generation
        )
        with pytest.raises(werk.BackendError):
            await decode(pm, runtime, foreign)
        assert (await restore(pm, runtime, snap)).tokens == 3  # the good one still restores


@pytest.mark.anyio
async def test_move_experts_is_unsupported(pm: werk.WerkPluginManager, tmp_path: Path) -> None:
    async with running(pm, make_spec(tmp_path, VOCAB_A)) as runtime:
        with pytest.raises(werk.Unsupported) as err:
            await pm.call_operation(
                werk.Operation.MOVE_EXPERTS,
                runtime,
                move=werk.ExpertMove(expert_ids=["e0"], target="ram"),
            )
    assert err.value.capability == "runtime.experts.residency"


# -- capabilities and liveness ---------------------------------------------------------------


def _rows(pm: werk.WerkPluginManager, context: werk.CapabilityContext) -> dict[str, Any]:
    rows = pm.capabilities(context)
    assert all(r.backend == "testkv" for r in rows)
    assert all(r.model == (context.model.id if context.model else None) for r in rows)
    return {r.id: (r.status.value, r.reason) for r in rows}


def _static_rows() -> dict[str, Any]:
    return {
        "runtime.model_residency": ("supported", None),
        "runtime.state.restore.cross_restart": (
            "unavailable",
            "testkv states are bound to one in-process runtime generation",
        ),
        "runtime.state.tier.ram": (
            "unsupported",
            "testkv keeps live states only inside its runtime",
        ),
        "runtime.state.tier.vram": ("unsupported", "testkv has no accelerator memory"),
        "runtime.experts.residency": ("unsupported", "testkv models have no experts"),
    }


@pytest.mark.anyio
async def test_capability_rows_follow_runtime_liveness(
    pm: werk.WerkPluginManager, testkv: ModuleType, tmp_path: Path
) -> None:
    spec = make_spec(tmp_path, VOCAB_A)
    dead = {cap: ("unavailable", "no live testkv runtime") for cap in ALL_STATE_ROWS}
    assert _rows(pm, werk.CapabilityContext(backend="testkv")) == {**_static_rows(), **dead}
    assert _rows(pm, werk.CapabilityContext(backend="testkv", model=spec)) == {
        **_static_rows(),
        **dead,
    }
    async with running(pm, spec) as runtime:
        context = werk.CapabilityContext(backend="testkv", model=spec, runtime=runtime)
        live_reason = f"testkv runtime generation {runtime.generation} is live"
        live = {cap: ("experimental", live_reason) for cap in ALL_STATE_ROWS}
        assert _rows(pm, context) == {**_static_rows(), **live}
        runtime.handle.kill()
        assert _rows(pm, context) == {**_static_rows(), **dead}
        assert not runtime.alive
        with pytest.raises(werk.Unavailable):
            await prefill(pm, runtime, prompt="hello")

    async with running(pm, spec) as runtime:  # a kill file kills only the runtime noticing it
        context = werk.CapabilityContext(backend="testkv", model=spec, runtime=runtime)
        assert _rows(pm, context)["runtime.pd.prefill"][0] == "experimental"
        kill = testkv.kill_file(spec.files[0])
        assert kill == spec.files[0].with_name("model.testkv.kill")
        kill.touch()
        assert _rows(pm, context) == {**_static_rows(), **dead}
        assert not kill.exists() and not runtime.alive
    async with running(pm, spec) as runtime:
        context = werk.CapabilityContext(backend="testkv", model=spec, runtime=runtime)
        assert _rows(pm, context)["runtime.pd.prefill"][0] == "experimental"


@pytest.mark.anyio
async def test_kill_file_fails_the_next_operation(
    pm: werk.WerkPluginManager, testkv: ModuleType, tmp_path: Path
) -> None:
    spec = make_spec(tmp_path, VOCAB_A)
    async with running(pm, spec) as runtime:
        out = await prefill(pm, runtime, prompt="before the crash")
        testkv.kill_file(spec.files[0]).touch()
        with pytest.raises(werk.Unavailable) as err:
            await decode(pm, runtime, out.state)
        assert err.value.retryable and not runtime.alive
        assert not testkv.kill_file(spec.files[0]).exists()
        for operation, kwargs in (
            (werk.Operation.SNAPSHOT, {"state": out.state}),
            (werk.Operation.PREFILL, {"call": werk.PrefillCall(prompt="x")}),
        ):
            with pytest.raises(werk.Unavailable):
                await pm.call_operation(operation, runtime, **kwargs)


# -- OpenAI-compatible replies ---------------------------------------------------------------


async def openai(
    pm: werk.WerkPluginManager,
    runtime: werk.Runtime,
    route: str,
    body: dict[str, Any],
    stream: bool = False,
) -> werk.OpenAIReply:
    call = werk.OpenAICall(route=route, body=body, stream=stream)  # type: ignore[arg-type]
    reply = await pm.call_operation(werk.Operation.OPENAI, runtime, call=call)
    assert isinstance(reply, werk.OpenAIReply)
    return reply


async def collect(reply: werk.OpenAIReply) -> list[dict[str, Any]]:
    assert reply.body is None and reply.stream is not None
    chunks: list[dict[str, Any]] = []
    async for payload in reply.stream:
        assert isinstance(payload, bytes)
        assert not payload.startswith(b"data:") and payload.strip() != b"[DONE]"
        chunks.append(json.loads(payload))
    return chunks


@pytest.mark.anyio
async def test_openai_bodies_match_werk_decode(pm: werk.WerkPluginManager, tmp_path: Path) -> None:
    from werk.protocol import ChatMessage

    async with running(pm, make_spec(tmp_path, VOCAB_A)) as runtime:
        prompt = "Once upon a time"
        state = (await prefill(pm, runtime, prompt=prompt)).state
        expected = await decode(pm, runtime, state, max_tokens=5, stop=["zeta"])
        reply = await openai(
            pm,
            runtime,
            "completions",
            {"model": "m", "prompt": prompt, "max_tokens": 5, "stop": "zeta"},
        )
        assert reply.stream is None and reply.body is not None
        body = reply.body
        assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
        assert isinstance(body["created"], int) and body["model"] == "m"
        assert body["system_fingerprint"] == runtime.generation
        assert body["choices"] == [
            {
                "index": 0,
                "text": expected.text,
                "finish_reason": expected.finish_reason.value,
                "logprobs": None,
            }
        ]
        n_prompt = len(prompt.encode())
        assert body["usage"] == {
            "prompt_tokens": n_prompt,
            "completion_tokens": expected.completion_tokens,
            "total_tokens": n_prompt + expected.completion_tokens,
        }

        messages = [{"role": "user", "content": "hi"}]
        chat_state = (
            await prefill(pm, runtime, messages=[ChatMessage(role="user", content="hi")])
        ).state
        chat_expected = await decode(pm, runtime, chat_state, max_tokens=64)
        chat = await openai(pm, runtime, "chat.completions", {"model": "m", "messages": messages})
        assert chat.body is not None
        assert chat.body["object"] == "chat.completion"
        assert chat.body["id"].startswith("chatcmpl-")
        assert chat.body["choices"][0]["message"] == {
            "role": "assistant",
            "content": chat_expected.text,
        }
        assert chat.body["choices"][0]["finish_reason"] == chat_expected.finish_reason.value
        parts = [
            {
                "role": "user",
                "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}],
            }
        ]
        as_parts = await openai(
            pm, runtime, "chat.completions", {"model": "m", "messages": parts, "max_tokens": 64}
        )
        assert as_parts.body is not None
        assert as_parts.body["choices"][0]["message"]["content"] == chat_expected.text


@pytest.mark.anyio
async def test_openai_streams_valid_chunks(pm: werk.WerkPluginManager, tmp_path: Path) -> None:
    async with running(pm, make_spec(tmp_path, VOCAB_A)) as runtime:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "stream please"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        whole = await openai(pm, runtime, "chat.completions", {**body, "stream": False})
        assert whole.body is not None
        chunks = await collect(await openai(pm, runtime, "chat.completions", body, stream=True))
        assert len(chunks) >= 6  # role, >= 3 words, finish, usage
        assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
        assert content == whole.body["choices"][0]["message"]["content"]
        finish = chunks[-2]["choices"][0]
        assert finish["delta"] == {} and finish["finish_reason"] == "stop"
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole.body["usage"]
        assert all(c["usage"] is None for c in chunks[:-1])

        text_body = {"model": "m", "prompt": "plain text", "max_tokens": 2}
        text_whole = await openai(pm, runtime, "completions", text_body)
        assert text_whole.body is not None
        text_chunks = await collect(await openai(pm, runtime, "completions", text_body, True))
        assert {c["object"] for c in text_chunks} == {"text_completion"}
        assert all("usage" not in c for c in text_chunks)
        assert (
            "".join(c["choices"][0]["text"] for c in text_chunks)
            == (text_whole.body["choices"][0]["text"])
        )
        assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.anyio
async def test_openai_streams_fail_midway(
    pm: werk.WerkPluginManager, testkv: ModuleType, tmp_path: Path
) -> None:
    async with running(pm, make_spec(tmp_path, VOCAB_A)) as runtime:
        body = {"model": "m", "prompt": f"a {testkv.FAIL_DECODE}"}
        reply = await openai(pm, runtime, "completions", body, stream=True)
        assert reply.stream is not None
        first = json.loads(await reply.stream.__anext__())
        assert first["choices"][0]["text"] == ""
        with pytest.raises(RuntimeError, match="simulated decode failure"):
            await reply.stream.__anext__()
        with pytest.raises(werk.BackendError):  # non-streaming: the host's summary
            await openai(pm, runtime, "completions", body)

        reply = await openai(pm, runtime, "completions", {"prompt": "fine"}, stream=True)
        assert reply.stream is not None
        await reply.stream.__anext__()
        runtime.handle.kill()
        with pytest.raises(werk.Unavailable):
            await reply.stream.__anext__()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("chat.completions", {}),
        ("chat.completions", {"messages": []}),
        ("chat.completions", {"messages": [{"content": "no role"}]}),
        ("chat.completions", {"messages": [{"role": "user", "content": [{"type": "image"}]}]}),
        ("completions", {"prompt": [1, 2, 3]}),
        ("completions", {"prompt": "x", "n": 2}),
        ("completions", {"prompt": "x", "max_tokens": -1}),
        ("completions", {"prompt": "x", "max_tokens": True}),
        ("completions", {"prompt": "x", "stop": 5}),
        ("completions", {"prompt": "x", "stream_options": "yes"}),
    ],
)
async def test_openai_rejects_bodies_it_cannot_honour(
    pm: werk.WerkPluginManager, tmp_path: Path, route: str, body: dict[str, Any]
) -> None:
    async with running(pm, make_spec(tmp_path, VOCAB_A)) as runtime:
        with pytest.raises(werk.InvalidRequest):
            await openai(pm, runtime, route, body)


# -- installation through the entry point (what `werk serve` tests rely on) ------------------

DISCOVERY_SCRIPT = r"""
import json, pathlib
from importlib.metadata import entry_points
import anyio, werk

found = [(e.name, e.dist.name if e.dist else None, e.value) for e in entry_points(group="werk")]
pm = werk.get_plugin_manager()
record = pm.records["werk-test-backend"]


async def main():
    spec = werk.ModelSpec(id="m", backend="testkv", identity="sha256:0",
                          files=(pathlib.Path("model.testkv").resolve(),))
    runtime = await pm.backends["testkv"].start(spec)
    try:
        out = await pm.call_operation(werk.Operation.PREFILL, runtime,
                                      call=werk.PrefillCall(prompt="hello"))
        return out.prompt_tokens
    finally:
        await pm.backends["testkv"].stop(runtime)


import werk_test_backend
print(json.dumps({"entry_points": found, "status": record.status.value,
                  "backends": record.backends, "file": werk_test_backend.__file__,
                  "prompt_tokens": anyio.run(main)}))
"""


def _run(argv: Sequence[str | Path], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_pip_target_install_is_discovered_through_its_entry_point(tmp_path: Path) -> None:
    """``pip install --no-deps --target SITE`` + ``PYTHONPATH=SITE``: a fresh interpreter of the
    dev venv finds ``werk-test-backend`` in the ``werk`` group; the dev venv is untouched."""
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WERK_", "PYTHONPATH"))}
    started = time.perf_counter()
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--no-input",
            "--target",
            site,
            TEST_BACKEND_DIR,
        ],
        cwd=tmp_path,
        env=env,
    )
    print(f"pip install --target: {time.perf_counter() - started:.2f}s", file=sys.stderr)
    assert (site / "werk_test_backend" / "plugin.py").is_file()
    (tmp_path / "model.testkv").write_text(VOCAB_A, encoding="utf-8")
    script = tmp_path / "discover.py"
    script.write_text(DISCOVERY_SCRIPT, encoding="utf-8")

    started = time.perf_counter()
    out = json.loads(_run([sys.executable, script], tmp_path, {**env, "PYTHONPATH": str(site)}))
    print(f"discovery subprocess: {time.perf_counter() - started:.2f}s", file=sys.stderr)
    assert ["testkv", DIST, "werk_test_backend.plugin"] in out["entry_points"]
    assert out["status"] == "loaded" and out["backends"] == ["testkv"]
    assert Path(out["file"]).resolve().is_relative_to(site.resolve())
    assert out["prompt_tokens"] == 5

    bare = _run(
        [
            sys.executable,
            "-c",
            "from importlib.metadata import entry_points as e;"
            "print([x.name for x in e(group='werk')])",
        ],
        tmp_path,
        env,
    )
    assert "testkv" not in bare, "the dev venv itself must not have the test backend installed"
