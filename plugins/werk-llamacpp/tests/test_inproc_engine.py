"""The ``llamacpp-inproc`` engine on the real llama-cpp-python build (the managed
``llamacpp-inproc`` environment that ``make test`` builds; these tests fail, never skip, without
``WERK_BACKENDS_DIR``), loaded into this test process with the tiny demo GGUF.

Evaluated-token counts come from llama.cpp's own counters; restored sequences are compared with
an uninterrupted generation; the lane serialises concurrent callers; a damaged or foreign state
is refused and leaves the sequence empty.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from werk_llamacpp.demo import create_demo_model
from werk_llamacpp.inproc.engine import Engine
from werk_llamacpp.inproc.lane import Lane
from werk_llamacpp.inproc.library import load_library
from werk_llamacpp.inproc.options import parse_inproc_options
from werk_llamacpp.inproc.sessions import Saved

from werk import BackendError, InvalidRequest

pytestmark = pytest.mark.slow

SYSTEM = "You are a careful assistant who answers in short sentences. " * 12
PROMPT = "Once upon a time, in a workshop full of clocks, a careful engineer wrote a test."


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    if not os.environ.get("WERK_BACKENDS_DIR"):
        pytest.fail("WERK_BACKENDS_DIR is not set: run the suite with `make test`")
    model = tmp_path_factory.mktemp("inproc") / "demo.gguf"
    create_demo_model(model)
    load_library()
    made = Engine.load(model, parse_inproc_options({"ctx_size": 1024}))
    yield made
    made.close()


def _chat(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _usage(engine: Engine) -> dict[str, int]:
    assert engine.result is not None
    return engine.result["usage"]  # type: ignore[no-any-return]


def test_a_shared_prefix_is_evaluated_once(engine: Engine) -> None:
    engine.clear()
    engine.sessions.clear()
    first = engine.chat_tokens(_chat("Hello"))
    list(engine.generation(first, max_tokens=4, temperature=0.0, remember=True))
    assert _usage(engine)["cached_tokens"] == 0
    second = engine.chat_tokens(_chat("What is a clock?"))
    list(engine.generation(second, max_tokens=4, temperature=0.0, remember=True))
    cached = _usage(engine)["cached_tokens"]
    shared = sum(1 for _ in zip(first, second, strict=False))  # upper bound
    assert 0 < cached < len(second) and cached <= shared
    # llama.cpp's counters say the same: evaluating the prompt again from its shared prefix
    # costs exactly the tokens after it
    engine.clear()
    evaluation = engine.evaluate(second[:cached])
    assert evaluation.evaluated == cached
    assert engine.evaluate(second).evaluated == len(second) - cached


def test_a_last_assistant_message_is_continued_as_llama_server_renders_it(
    engine: Engine,
) -> None:
    turn = _chat("Hello")
    opened = engine.chat_tokens(turn)
    with_reply = engine.chat_tokens([*turn, {"role": "assistant", "content": "Good day"}])
    next_turn = [*turn, {"role": "assistant", "content": "Good day"}]
    next_turn.append({"role": "user", "content": "And then?"})
    following = engine.chat_tokens(next_turn)
    # the assistant's turn opened, then its text (no end of turn, no second opening) ...
    assert with_reply[: len(opened)] == opened
    assert engine._text(with_reply[len(opened) :]) == "Good day"
    # ... so a conversation kept with its reply is a prefix of the next turn's prompt
    assert following[: len(with_reply)] == with_reply


def test_the_session_cache_puts_back_an_earlier_conversation(engine: Engine) -> None:
    engine.clear()
    engine.sessions.clear()
    a = engine.chat_tokens(_chat("Tell me about gears."))
    b = engine.prompt_tokens("An unrelated text prompt, nothing like the chat. " * 4)
    list(engine.generation(a, max_tokens=3, temperature=0.0, remember=True))
    list(engine.generation(b, max_tokens=3, temperature=0.0, remember=False, sessions=False))
    assert engine.live_tokens()[: len(b)] == b  # the context now holds b
    list(engine.generation(a, max_tokens=3, temperature=0.0, remember=True))
    assert _usage(engine)["cached_tokens"] >= len(a) - 1  # a's session was put back
    off = Engine(engine.lib, engine.llm, parse_inproc_options({"session_entries": 0}))
    off.clear()
    list(off.generation(b, max_tokens=1, temperature=0.0, remember=True))
    list(off.generation(a, max_tokens=1, temperature=0.0, remember=True))
    assert _usage(off)["cached_tokens"] == 0  # without a session cache, a starts over


def test_a_restored_state_continues_like_an_uninterrupted_generation(engine: Engine) -> None:
    tokens = engine.prompt_tokens(PROMPT)
    engine.clear()
    whole = engine.complete(tokens, max_tokens=12, temperature=0.0, sessions=False)
    engine.clear()
    assert engine.evaluate(tokens).evaluated == len(tokens)
    saved = engine.save()
    assert saved.tokens == tuple(tokens) and saved.data
    engine.clear()
    engine.restore(saved)
    assert engine.live_tokens() == tokens
    assert engine.complete(tokens, max_tokens=12, temperature=0.0, sessions=False) == whole


def test_damaged_or_oversized_states_are_refused_and_leave_the_sequence_empty(
    engine: Engine,
) -> None:
    tokens = engine.prompt_tokens(PROMPT)
    engine.clear()
    engine.evaluate(tokens)
    saved = engine.save()
    broken = Saved(saved.tokens, saved.data[: len(saved.data) // 3])
    with pytest.raises(BackendError, match="refused"):
        engine.restore(broken)
    assert engine.live_tokens() == []
    with pytest.raises(BackendError, match="this context has 1024"):
        engine.restore(Saved(tuple(range(2000)), saved.data))
    with pytest.raises(InvalidRequest, match="context is 1024"):
        list(engine.generation(list(range(1, 1100)), max_tokens=2))


def test_the_lane_serves_concurrent_generations_one_at_a_time(engine: Engine) -> None:
    lane = Lane(engine)
    tokens = engine.prompt_tokens(PROMPT)
    active: list[int] = []
    overlaps: list[int] = []

    def step(label: int) -> Iterator[dict[str, object]]:
        active.append(label)
        overlaps.append(len(active))
        try:
            yield from engine.generation(tokens, max_tokens=6, temperature=0.0)
        finally:
            active.remove(label)

    texts: dict[int, str] = {}

    async def one(label: int) -> None:
        async with lane.generation(lambda: step(label)) as events:
            texts[label] = "".join([str(event["text"]) async for event in events])

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for label in range(4):
                group.start_soon(one, label)

    anyio.run(main)
    assert max(overlaps) == 1  # never two generations on the context at once
    assert len(set(texts.values())) == 1 and len(texts) == 4  # greedy: the same answer


def test_a_generation_left_early_frees_the_lane(engine: Engine) -> None:
    lane = Lane(engine)
    tokens = engine.prompt_tokens(PROMPT)

    async def main() -> str:
        with anyio.fail_after(60):
            async with lane.generation(
                lambda: engine.generation(tokens, max_tokens=50, temperature=0.0)
            ) as events:
                async for _ in events:
                    break  # the client went away after the first event
            return await lane.run(lambda: engine.complete(tokens, max_tokens=3, temperature=0.0)[0])

    assert isinstance(anyio.run(main), str)
    assert load_library()[1].version == "0.3.36"


def test_a_gguf_werk_reads_but_llama_cpp_cannot_load_is_a_typed_error(tmp_path: Path) -> None:
    """Werk's header and tensor-directory checks pass (the metadata is complete), llama.cpp's
    loader refuses (tensors are missing): ``unavailable``, not a crash."""
    import gguf
    import numpy as np
    from werk_llamacpp.demo import SHAPES, _add_metadata, build_vocab
    from werk_llamacpp.requirement import read_header_facts

    from werk import Unavailable

    shape, vocab = SHAPES["tiny"], build_vocab()
    path = tmp_path / "missing-tensors.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    _add_metadata(writer, shape, vocab, 0, "tiny")
    embeddings = np.zeros((len(vocab.tokens), shape.n_embd), dtype=np.float16)
    writer.add_tensor("token_embd.weight", embeddings)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert read_header_facts(path).n_layer == shape.n_layer  # Werk's checks pass
    with pytest.raises(Unavailable, match=r"llama\.cpp could not load missing-tensors\.gguf"):
        Engine.load(path, parse_inproc_options({}))
