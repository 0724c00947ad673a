"""``llamacpp-inproc`` pieces that need no llama.cpp library: the chat-session cache, the state
payload layout, the model options, refusing a bad GGUF before the native loader, and what the
backend reports when the library is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from werk_llamacpp.inproc import runtime
from werk_llamacpp.inproc.options import parse_inproc_options
from werk_llamacpp.inproc.sessions import Saved, SessionCache, shared_prefix
from werk_llamacpp.inproc.states import MAGIC, decode_payload, encode

from werk import BackendError, InvalidRequest, ModelSpec

WERK = Path(sys.executable).parent / "werk"


# -- sessions ---------------------------------------------------------------------------------


def test_shared_prefix() -> None:
    assert shared_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert shared_prefix([], [1]) == 0
    assert shared_prefix([1, 2], [1, 2, 3]) == 2


def test_the_session_sharing_the_longest_prefix_wins() -> None:
    cache = SessionCache(max_entries=4, max_bytes=1 << 20)
    cache.put(Saved((1, 2, 3, 4), b"a" * 10))
    cache.put(Saved((1, 2, 9, 9, 9), b"b" * 10))
    best = cache.best([1, 2, 3, 4, 5])
    assert best is not None and best[0].tokens == (1, 2, 3, 4) and best[1] == 4
    assert cache.best([7, 8]) is None


def test_a_session_extended_by_a_newer_one_is_dropped() -> None:
    cache = SessionCache(max_entries=4, max_bytes=1 << 20)
    cache.put(Saved((1, 2), b"x" * 4))
    cache.put(Saved((1, 2, 3), b"y" * 6))
    assert len(cache) == 1 and cache.nbytes == 6


def test_the_least_recently_used_session_goes_first_within_both_bounds() -> None:
    cache = SessionCache(max_entries=2, max_bytes=100)
    cache.put(Saved((1,), b"a" * 40))
    cache.put(Saved((2,), b"b" * 40))
    assert cache.best([1]) is not None  # (1,) is now the most recently used
    cache.put(Saved((3,), b"c" * 40))  # over both bounds: (2,) goes
    assert cache.best([2]) is None and cache.best([1]) is not None
    assert cache.nbytes == 80
    assert not cache.put(Saved((4,), b"d" * 101))  # alone over the byte bound: not kept
    assert cache.nbytes == 80
    off = SessionCache(max_entries=0, max_bytes=100)
    assert not off.put(Saved((1,), b"a")) and len(off) == 0


# -- the payload ----------------------------------------------------------------------------


def test_a_payload_round_trips_and_every_damage_is_refused() -> None:
    saved = Saved((5, 1 << 20, 0, 7), b"\x00\x01state-bytes" * 50)
    raw = encode(saved)
    assert raw.startswith(MAGIC)
    assert decode_payload(raw) == saved
    flipped = bytearray(raw)
    flipped[-3] ^= 0xFF
    header_end = raw.index(b"\n", len(MAGIC))
    damaged = {
        "checksum": bytes(flipped),
        "truncated": raw[: len(raw) // 2],
        "magic": b"NOTWERK1\n" + raw[len(MAGIC) :],
        "header": raw[: len(MAGIC)] + b"{not json}\n" + raw[header_end + 1 :],
        "no header end": MAGIC + b"x" * 300,
        "longer": raw + b"\x00",
    }
    for name, payload in damaged.items():
        with pytest.raises(BackendError):
            decode_payload(payload)
        print(name, "refused")


def test_an_empty_state_round_trips() -> None:
    assert decode_payload(encode(Saved((), b""))) == Saved((), b"")


# -- options ------------------------------------------------------------------------------------


def test_options_defaults_bounds_and_the_envelope_arguments() -> None:
    options = parse_inproc_options({})
    assert (options.ctx_size, options.batch_size, options.session_cache_mb) == (2048, 512, 256)
    assert options.compute_threads >= 1
    assert options.runtime_args() == (
        "n_ctx=2048",
        "n_batch=512",
        "type_k=f16",
        "type_v=f16",
        "seq_id=0",
    )
    assert parse_inproc_options({"ctx_size": 1024}).runtime_args()[0] == "n_ctx=1024"
    # the session bound: 256 MiB, or what 8 whole-context sequences take if that is less
    assert options.session_bytes(1 << 20) == 8 << 20
    assert options.session_bytes(1 << 30) == 256 << 20
    assert parse_inproc_options({"session_entries": 0}).session_bytes(1 << 20) == 0
    with pytest.raises(InvalidRequest, match="unknown llamacpp-inproc model option"):
        parse_inproc_options({"parallel": 2})
    for bad in ({"ctx_size": 10}, {"batch_size": True}, {"threads": -1}, {"ctx_size": "big"}):
        with pytest.raises(InvalidRequest, match="must be an integer"):
            parse_inproc_options(bad)


# -- refusals before the native loader ----------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_file_that_is_not_a_gguf_is_refused_before_llama_cpp_sees_it(
    tmp_path: Path,
) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + os.urandom(200))
    spec = ModelSpec(id="junk", backend="llamacpp-inproc", identity="sha256:0", files=(junk,))
    with pytest.raises(InvalidRequest, match="not a readable GGUF"):
        await runtime.start(spec)
    with pytest.raises(InvalidRequest, match="unknown llamacpp-inproc model option"):
        await runtime.start(
            ModelSpec(id="x", backend="llamacpp-inproc", identity="sha256:0", options={"n": 1})
        )


def _werk(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(home), WERK_BACKENDS_DIR=str(home / "no-backends"))
    return subprocess.run(
        [str(WERK), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_import_refuses_a_junk_gguf_and_the_rows_say_how_to_install(tmp_path: Path) -> None:
    home = tmp_path / "home"
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 64)
    refused = _werk(
        home, "models", "import", str(junk), "--id", "j", "--backend", "llamacpp-inproc"
    )
    assert refused.returncode != 0 and "not a readable GGUF" in refused.stderr, refused.stderr
    listed = _werk(home, "backends", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)["environments"]}
    assert rows["llamacpp-inproc"]["state"] == "missing"
    caps = _werk(home, "capabilities", "--json")
    residency = {
        row["id"]: row
        for row in json.loads(caps.stdout)["capabilities"]
        if row["backend"] == "llamacpp-inproc"
    }["runtime.model_residency"]
    assert residency["status"] == "unavailable"
    assert "werk backends install llamacpp-inproc" in residency["reason"]
