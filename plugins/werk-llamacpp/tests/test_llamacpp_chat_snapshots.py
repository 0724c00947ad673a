"""Native KV snapshots of persistent terminal chats (``chat_snapshots.py``).

Unit tests (fast): the index and receipt validation rules, and that opening a session, judging
a receipt or refusing an incompatible snapshot never sends a single request to the runtime (a
recording HTTP server on loopback stands in for llama-server and counts them).

End-to-end tests (``slow``; skipped only without a llama-server executable): the real ``werk``
CLI with the real llama-server and the tiny generated demo model. ``werk chat --persistence``
is driven through a pseudo-terminal for two turns, quit, and resumed in a new process whose first
request restores the snapshot, gets a positive backend cached-token count and records the
receipt; a snapshot with one flipped byte is refused, the receipt invalidated, and the answer
still arrives, rebuilt from the conversation.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from test_llamacpp_process_support import (
    WERK,
    create_demo,
    kill_leftovers,
    needs_llama_server,
    werk_env,
)
from test_llamacpp_states_support import loopback_to
from werk_llamacpp.chat_snapshots import (
    EVIDENCE,
    INDEX,
    MAX_INDEX_BYTES,
    MAX_RECEIPT_BYTES,
    RECEIPT,
    LlamaChatCache,
    Namespace,
    Receipt,
    SnapshotIndex,
    conversation_digest,
    open_private_dir,
    read_index,
    read_receipt,
)
from werk_llamacpp.handle import LlamaHandle
from werk_llamacpp.proxy import PinnedSlot, _pinned_slot
from werk_llamacpp.slots import allocator_for

from werk import (
    BackendError,
    LoopbackClient,
    ModelSpec,
    NativeContext,
    OpenAICall,
    Runtime,
    TurnOutcome,
)
from werk.testing.terminal import PtyChat

NAMESPACE = Namespace(
    model_identity="sha256:" + "1" * 64,
    runtime_sha256="2" * 64,
    libraries_sha256="3" * 64,
    environment_sha256="4" * 64,
    args=["-m", "<model>", "--port", "<port>", "-np", "2", "--cache-ram", "0"],
    cache_layout="llama.cpp slots v1 n_ctx=4096 n_parallel=2 state_slots=1",
)
HISTORY = [
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "hi there"},
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- records ---------------------------------------------------------------------------------


def _index(**changes: Any) -> dict[str, Any]:
    index = SnapshotIndex(
        schema=1,
        format="werk-llamacpp-chat-snapshot/1",
        file="snapshot-" + "a" * 32 + ".slot",
        sha256="b" * 64,
        size=1000,
        n_saved=40,
        n_written=1000,
        namespace=NAMESPACE,
        conversation_sha256=conversation_digest(HISTORY) or "",
        saved_at=1.0,
    )
    data: dict[str, Any] = msgspec.to_builtins(index)
    data.update(changes)
    return data


def _receipt(**changes: Any) -> dict[str, Any]:
    receipt = Receipt(
        schema=1,
        format="werk-llamacpp-chat-receipt/1",
        evidence=EVIDENCE,
        namespace=NAMESPACE,
        snapshot_sha256="b" * 64,
        restored_tokens=40,
        cached_tokens=40,
        prompt_tokens=70,
        observed_at=1.0,
    )
    data: dict[str, Any] = msgspec.to_builtins(receipt)
    data.update(changes)
    return data


def _other(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = msgspec.to_builtins(NAMESPACE)
    data.update(changes)
    return data


@pytest.fixture
def native(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    path = tmp_path / "native"
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    fd = open_private_dir(path)
    try:
        yield path, fd
    finally:
        os.close(fd)


def _put(path: Path, data: bytes | dict[str, Any], mode: int = 0o600) -> None:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    path.write_bytes(raw)
    path.chmod(mode)


def test_a_valid_index_is_read(native: tuple[Path, int]) -> None:
    path, fd = native
    assert read_index(fd) == (None, "no snapshot")
    _put(path / INDEX, _index())
    index, why = read_index(fd)
    assert why == "snapshot found"
    assert index is not None and index.namespace == NAMESPACE and index.n_saved == 40


@pytest.mark.parametrize(
    ("content", "mode", "expected"),
    [
        (_index(schema=2), 0o600, "another schema (2,"),
        (_index(format="werk-llamacpp-slot/1"), 0o600, "another schema"),
        (_index(extra=1), 0o600, "malformed"),
        (_index(sha256="not-hex"), 0o600, "malformed"),
        (_index(file="../../etc/passwd"), 0o600, "malformed"),
        (_index(n_saved=0), 0o600, "malformed"),
        (_index(size=999), 0o600, "inconsistent (size != n_written)"),
        (_index(namespace=_other(unknown="x")), 0o600, "malformed"),
        (b"{not json", 0o600, "malformed"),
        (json.dumps(_index()).encode() + b" " * MAX_INDEX_BYTES, 0o600, "larger than"),
        (_index(), 0o644, "not a private single-link file"),
    ],
    ids=[
        "schema",
        "format",
        "unknown-field",
        "bad-hash",
        "path-name",
        "no-tokens",
        "size-mismatch",
        "namespace-field",
        "not-json",
        "oversized",
        "group-readable",
    ],
)
def test_a_bad_index_means_no_snapshot(
    native: tuple[Path, int], content: bytes | dict[str, Any], mode: int, expected: str
) -> None:
    path, fd = native
    _put(path / INDEX, content, mode)
    index, why = read_index(fd)
    assert index is None
    assert expected in why


def test_a_linked_index_is_not_followed(native: tuple[Path, int], tmp_path: Path) -> None:
    path, fd = native
    _put(tmp_path / "elsewhere.json", _index())
    (path / INDEX).symlink_to(tmp_path / "elsewhere.json")
    index, why = read_index(fd)
    assert index is None and "is a link" in why


def test_a_valid_receipt_is_historical_evidence(native: tuple[Path, int]) -> None:
    path, fd = native
    assert read_receipt(fd, NAMESPACE).reason == "no receipt"
    assert read_receipt(None, NAMESPACE).reason == "no receipt"
    _put(path / RECEIPT, _receipt())
    view = read_receipt(fd, NAMESPACE)
    assert view.observed and view.receipt is not None
    assert view.reason.startswith("40 of 40 restored tokens were reused on ")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (_receipt(namespace=_other(model_identity="sha256:" + "9" * 64)), "other model files"),
        (_receipt(namespace=_other(runtime_sha256="9" * 64)), "other runtime binary"),
        (_receipt(namespace=_other(libraries_sha256="9" * 64)), "other runtime libraries"),
        (_receipt(namespace=_other(environment_sha256="9" * 64)), "other environment"),
        (_receipt(namespace=_other(args=["-m", "<model>"])), "other effective arguments"),
        (_receipt(namespace=_other(cache_layout="x")), "other cache layout"),
        (_receipt(schema=2), "another schema (2)"),
        (_receipt(format="werk-llamacpp-chat-receipt/0"), "another schema"),
        (_receipt(evidence="synthetic_probe"), "not earned by a real request ('synthetic_probe')"),
        (_receipt(evidence=None), "not earned by a real request (None)"),
        (_receipt(cached_tokens=41), "inconsistent"),
        (_receipt(prompt_tokens=10), "inconsistent"),
        (_receipt(cached_tokens=0), "malformed"),
        (_receipt(extra=True), "malformed"),
        (b"[1, 2", "malformed"),
        (json.dumps(_receipt()).encode() + b" " * MAX_RECEIPT_BYTES, "larger than"),
    ],
    ids=[
        "model",
        "binary",
        "libraries",
        "environment",
        "args",
        "layout",
        "schema",
        "format",
        "synthetic-probe",
        "no-evidence",
        "more-than-restored",
        "more-than-prompt",
        "zero",
        "unknown-field",
        "not-json",
        "oversized",
    ],
)
def test_any_other_receipt_leaves_reuse_unverified(
    native: tuple[Path, int], content: bytes | dict[str, Any], expected: str
) -> None:
    path, fd = native
    _put(path / RECEIPT, content)
    view = read_receipt(fd, NAMESPACE)
    assert not view.observed and view.receipt is None
    assert expected in view.reason


def test_namespace_differences_are_named() -> None:
    assert NAMESPACE.differs(NAMESPACE) is None
    assert NAMESPACE.differs(msgspec.structs.replace(NAMESPACE, args=[])) == "effective arguments"
    changed = msgspec.structs.replace(NAMESPACE, model_identity="x", runtime_sha256="9" * 64)
    assert NAMESPACE.differs(changed) == "model files"  # the first difference is named


def test_conversation_digest_needs_text_messages() -> None:
    assert conversation_digest(HISTORY) == conversation_digest([dict(m) for m in HISTORY])
    assert conversation_digest(HISTORY) != conversation_digest(HISTORY[:1])
    assert conversation_digest([{"role": "user", "content": ["an image"]}]) is None
    assert conversation_digest(["text"]) is None


# -- a cache around a recording loopback server ------------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str]

    def _any(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _any

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server that records every request (and answers 500)."""
    seen: list[str] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class NativeDir:
    """A session's private ``native/`` directory as ``werk chat`` hands it to the provider
    (``NativeContext.native_dir``): 0700, created only when asked."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, create: bool) -> Path | None:
        if create and not self.path.is_dir():
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.path.mkdir(mode=0o700)
        return self.path if self.path.is_dir() else None


@pytest.fixture
def session(tmp_path: Path) -> NativeDir:
    return NativeDir(tmp_path / "sessions" / "s1" / "native")


async def _cache(
    tmp_path: Path, url: str, native_dir: NativeDir, phases: list[str]
) -> tuple[LlamaChatCache, LoopbackClient]:
    slot_dir = tmp_path / "slots"
    slot_dir.mkdir(mode=0o700, exist_ok=True)
    client = loopback_to(url)
    handle = LlamaHandle(
        base_url=url,
        api_key="key",
        http=client,
        pid=os.getpid(),
        generation="g_test",
        slot_dir=slot_dir,
        total_slots=2,
        state_slots=(1,),
        help_text="",
        args=(),
        log_path=tmp_path / "server.log",
    )
    model = ModelSpec(id="demo", backend="llamacpp", identity=NAMESPACE.model_identity)
    runtime = Runtime(backend="llamacpp", model=model, generation="g_test", handle=handle)
    context = NativeContext(
        runtime=runtime,
        native_dir=native_dir,
        phase=phases.append,
    )
    slot, epoch = allocator_for(handle).acquire()
    cache = LlamaChatCache(
        runtime=runtime, handle=handle, context=context, namespace=NAMESPACE, slot=slot, epoch=epoch
    )
    await anyio.to_thread.run_sync(cache.load)
    return cache, client


def _native_of(native_dir: NativeDir) -> Path:
    path = native_dir(True)
    assert path is not None
    return path


@pytest.mark.anyio
async def test_receipts_and_incompatible_snapshots_never_cause_a_request(
    tmp_path: Path, recorder: tuple[str, list[str]], session: NativeDir
) -> None:
    url, seen = recorder
    native = _native_of(session)
    _put(native / INDEX, _index(namespace=_other(args=["-m", "<model>", "-t", "1"])))
    _put(native / RECEIPT, b'{"schema": 1, "format": "werk-llamacpp-chat-receipt/1", "evid')
    phases: list[str] = []
    cache, client = await _cache(tmp_path, url, session, phases)
    try:
        assert cache.index is not None  # well-formed, of another namespace
        body = {"model": "demo", "messages": [*HISTORY, {"role": "user", "content": "next"}]}
        sent = await cache.before_request(body)
        again = await cache.before_request(body)
    finally:
        await cache.close()
        await client.aclose()
    assert seen == []  # no inference, no /slots request: nothing at all
    assert sent["id_slot"] == PinnedSlot(slot=1, generation="g_test")
    assert again["id_slot"] == sent["id_slot"] and body.get("id_slot") is None
    assert "native KV evidence: unverified (the receipt is malformed)" in phases
    skipped = [p for p in phases if p.startswith("restore:")]
    assert skipped == [
        "restore: skipped; the snapshot was made with other effective arguments; the "
        "conversation is resent"
    ]


@pytest.mark.anyio
async def test_a_snapshot_of_another_conversation_state_is_not_restored(
    tmp_path: Path, recorder: tuple[str, list[str]], session: NativeDir
) -> None:
    url, seen = recorder
    _put(_native_of(session) / INDEX, _index())
    phases: list[str] = []
    cache, client = await _cache(tmp_path, url, session, phases)
    try:
        body = {"model": "demo", "messages": [{"role": "user", "content": "after /reset"}]}
        await cache.before_request(body)
    finally:
        await cache.close()
        await client.aclose()
    assert seen == []
    assert any("the snapshot holds another state of this conversation" in p for p in phases)


@pytest.mark.anyio
async def test_an_incomplete_turn_publishes_nothing(
    tmp_path: Path, recorder: tuple[str, list[str]], session: NativeDir
) -> None:
    url, seen = recorder
    phases: list[str] = []
    cache, client = await _cache(tmp_path, url, session, phases)
    try:
        body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
        await cache.before_request(body)
        usage = {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 5}}
        await cache.after_response(TurnOutcome(complete=False, usage=usage, reply="partial"))
    finally:
        await cache.close()
        await client.aclose()
    assert seen == []  # no slot save was even asked for
    assert session(False) is None  # nothing created either
    assert "native KV snapshot: not saved (the turn did not complete)" in phases
    assert not any("reuse observed" in p for p in phases)


def test_only_an_in_process_pin_of_a_state_slot_is_honoured(tmp_path: Path) -> None:
    handle = LlamaHandle(
        base_url="http://127.0.0.1:9",
        api_key="key",
        http=loopback_to("http://127.0.0.1:9"),
        pid=os.getpid(),
        generation="g_test",
        slot_dir=tmp_path,
        total_slots=3,
        state_slots=(2,),
        help_text="",
        args=(),
        log_path=tmp_path / "server.log",
    )

    def pin(value: object) -> int | None:
        body = {"messages": [], "id_slot": value}
        return _pinned_slot(handle, OpenAICall(route="chat.completions", body=body))  # type: ignore[arg-type]

    assert pin(PinnedSlot(slot=2, generation="g_test")) == 2
    assert pin(2) is None  # a JSON client's integer: the proxy picks a general slot as always
    assert pin({"slot": 2, "generation": "g_test"}) is None
    with pytest.raises(BackendError):
        pin(PinnedSlot(slot=0, generation="g_test"))  # a general slot
    with pytest.raises(BackendError):
        pin(PinnedSlot(slot=2, generation="g_other"))  # another child


@pytest.mark.parametrize(
    ("complete", "usage", "expected"),
    [
        (True, None, "unverified (the backend reported no cached-token count)"),
        (True, {"prompt_tokens": 50}, "unverified (the backend reported no cached-token count)"),
        (True, {"prompt_tokens_details": {"cached_tokens": 0}}, "cache miss"),
        (True, {"prompt_tokens_details": {"cached_tokens": 41}}, "inconsistent usage"),
        (
            True,
            {"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 35}},
            "inconsistent usage",
        ),
        (True, {"prompt_tokens_details": {"cached_tokens": True}}, "no cached-token count"),
        (
            False,
            {"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 40}},
            "the first request after the restore did not complete",
        ),
    ],
    ids=["no-usage", "no-count", "zero", "over-restored", "over-prompt", "bool", "incomplete"],
)
@pytest.mark.anyio
async def test_only_positive_consistent_counts_are_evidence(
    tmp_path: Path,
    recorder: tuple[str, list[str]],
    session: NativeDir,
    complete: bool,
    usage: dict[str, Any] | None,
    expected: str,
) -> None:
    url, seen = recorder
    native = _native_of(session)
    phases: list[str] = []
    cache, client = await _cache(tmp_path, url, session, phases)
    try:
        outcome = TurnOutcome(complete=complete, usage=usage)
        await cache._judge(outcome, 40, "b" * 64)  # as after the first request after a restore
        good = {"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 40}}
        assert not (native / RECEIPT).exists()
        await cache._judge(TurnOutcome(complete=True, usage=good), 40, "b" * 64)
    finally:
        await cache.close()
        await client.aclose()
    assert seen == []
    assert expected in phases[-2]
    assert "native KV restored reuse observed" not in phases[-2]
    assert phases[-1].startswith("native KV restored reuse observed: 40 cached tokens of 40")
    assert stat.S_IMODE((native / RECEIPT).stat().st_mode) == 0o600
    fd = open_private_dir(native)
    try:
        view = read_receipt(fd, NAMESPACE)
    finally:
        os.close(fd)
    assert view.observed and view.receipt is not None
    assert (view.receipt.cached_tokens, view.receipt.prompt_tokens) == (40, 50)


# -- the real thing -----------------------------------------------------------------------------

PROMPT = ">>> "
SAMPLING = ("--temperature", "0", "--seed", "1", "--max-tokens", "8")
CACHED = re.compile(r"reply complete: [^\n]*cached (\d+) \(reported by the backend\)")


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _messages(home: Path, name: str = "s1") -> list[tuple[str, str]]:
    record = _json(home / "chat-sessions" / name / "messages.json")
    return [(m["role"], m["content"]) for m in record["messages"]]


def _run(
    home: Path, prompt: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WERK), "run", "demo", prompt, *SAMPLING, *extra],
        env=env or _env(home),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _env(home: Path, **extra: str) -> dict[str, str]:
    return werk_env(home, {"WERK_LOAD_PLUGINS": "werk-llamacpp", **extra})


@pytest.fixture
def demo_home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "werk-home"
    create_demo(home)
    try:
        yield home
    finally:
        kill_leftovers(str(home))


def _chat(home: Path, *args: str) -> PtyChat:
    return PtyChat(["chat", "demo", *SAMPLING, *args], _env(home))


def _finish(chat: PtyChat, send: str) -> str:
    try:
        chat.send(send)
        assert chat.wait() == 0, chat.text()
        return chat.text()
    finally:
        chat.close()


@pytest.mark.slow
@needs_llama_server
def test_a_resumed_chat_restores_its_snapshot_and_observes_reuse(demo_home: Path) -> None:
    home = demo_home
    native = home / "chat-sessions" / "s1" / "native"

    # Process 1: two turns, then /exit.
    chat = _chat(home, "--persistence", "--session", "s1", "-v")
    chat.expect("native KV snapshot: no snapshot; the first request runs directly")
    chat.expect(PROMPT, 1)
    chat.send("hello there, how are you\n")
    chat.expect("native KV snapshot: saved ")
    chat.expect(PROMPT, 2)
    chat.send("tell me more about it\n")
    chat.expect("native KV snapshot: saved ", 2)
    chat.expect(PROMPT, 3)
    first = _finish(chat, "/exit\n")
    assert "restore:" in first and "restore: no snapshot; the request runs directly" in first
    assert "native KV restored reuse observed" not in first
    history = _messages(home)
    assert [role for role, _ in history] == ["user", "assistant"] * 2

    index = _json(native / INDEX)
    snapshot = native / index["file"]
    assert snapshot.stat().st_size == index["size"] == index["n_written"]
    assert stat.S_IMODE(native.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in native.iterdir()} == {0o600}
    assert sorted(p.name for p in native.iterdir()) == sorted([INDEX, index["file"]])
    assert not (native / RECEIPT).exists()  # nothing restored yet: nothing observed

    # Process 2: resume; the first request restores the snapshot; two more turns; Ctrl+D.
    chat = _chat(home, "--session", "s1", "-v")
    chat.expect("resumed session s1: 4 message(s) of model demo")
    for line in (
        "cache capability probe: skipped; reuse checked on actual requests",
        "runtime inspection: llama-server ",
        "native readiness: pid ",
        "preparation: ",
        "native KV evidence: unverified (no receipt)",
    ):
        chat.expect(line)
    chat.expect(PROMPT, 1)
    chat.send("and what happened next\n")
    chat.expect("native KV snapshot: saved ")
    chat.expect(PROMPT, 2)
    chat.send("thanks\n")
    chat.expect("native KV snapshot: saved ", 2)
    chat.expect(PROMPT, 3)
    resumed = _finish(chat, "\x04")

    assert f"restore: {index['n_saved']} tokens restored into slot " in resumed
    cached = [int(n) for n in CACHED.findall(resumed)]
    assert len(cached) == 2 and 0 < cached[0] <= index["n_saved"]
    assert resumed.count("native KV restored reuse observed") == 1  # the later hit proves nothing
    assert f"native KV restored reuse observed: {cached[0]} cached tokens of " in resumed
    now = _messages(home)
    assert now[:4] == history and len(now) == 8  # the history was there and grew

    receipt = _json(native / RECEIPT)
    assert receipt["evidence"] == EVIDENCE
    assert receipt["cached_tokens"] == cached[0]
    assert receipt["restored_tokens"] == index["n_saved"]
    assert receipt["snapshot_sha256"] == index["sha256"]
    assert receipt["namespace"] == index["namespace"]
    newer = _json(native / INDEX)
    assert newer["sha256"] != index["sha256"] and not snapshot.exists()  # replaced, old removed

    # Process 3: the receipt is historical evidence now (and is checked again).
    again = _run(home, "one more", "--session", "s1", "-v")
    assert again.returncode == 0, again.stderr
    assert "native KV evidence: historical receipt: " in again.stderr
    assert "native KV restored reuse observed" in again.stderr


@pytest.mark.slow
@needs_llama_server
def test_a_corrupt_snapshot_is_refused_and_the_conversation_rebuilt(demo_home: Path) -> None:
    home = demo_home
    native = home / "chat-sessions" / "s1" / "native"
    for prompt in ("first question here", "second question here"):
        done = _run(home, prompt, "--session", "s1", "-v")
        assert done.returncode == 0, done.stderr
    assert "native KV restored reuse observed" in done.stderr
    assert (native / RECEIPT).is_file()
    index = _json(native / INDEX)
    history = _messages(home)

    # The reference: the same history in a session without native data (a full prefill).
    ref = home / "chat-sessions" / "ref"
    ref.mkdir(mode=0o700)
    record = _json(home / "chat-sessions" / "s1" / "messages.json")
    _put(ref / "messages.json", {**record, "name": "ref"})
    expected = _run(home, "third question here", "--session", "ref")
    assert expected.returncode == 0, expected.stderr

    # One flipped byte in the middle of the snapshot (same size, same mode).
    snapshot = native / index["file"]
    data = bytearray(snapshot.read_bytes())
    data[len(data) // 2] ^= 0x01
    _put(snapshot, bytes(data))

    done = _run(home, "third question here", "--session", "s1", "-v")
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert "native KV evidence: historical receipt: " in err  # before the restore was tried
    assert (
        "restore refused: the snapshot's SHA-256 does not match its index; receipt invalidated, "
        "slot cleared, the conversation is rebuilt from the archive"
    ) in err
    assert "tokens restored into slot" not in err  # refused before any restore request
    assert [int(n) for n in CACHED.findall(err)] == [0]  # the whole conversation was evaluated
    assert "native KV restored reuse observed" not in err
    assert done.stdout.strip() and done.stdout == expected.stdout  # the answer still arrives
    assert _messages(home)[: len(history)] == history
    assert _messages(home)[len(history) :] == [
        ("user", "third question here"),
        ("assistant", done.stdout.rstrip("\n")),
    ]

    assert not (native / RECEIPT).exists()  # invalidated
    assert not snapshot.exists()  # the corrupt file is gone
    newer = _json(native / INDEX)  # the completed turn published a fresh snapshot
    assert newer["sha256"] != index["sha256"]
    assert sorted(p.name for p in native.iterdir()) == sorted([INDEX, newer["file"]])

    # Another effective argument: the snapshot and the receipt belong to another namespace.
    other = _run(home, "fourth", "--session", "s1", "-v", env=_env(home, WERK_LLAMA_ARGS="-t 1"))
    assert other.returncode == 0, other.stderr
    assert "restore: skipped; the snapshot was made with other effective arguments" in other.stderr
    assert "native KV restored reuse observed" not in other.stderr
