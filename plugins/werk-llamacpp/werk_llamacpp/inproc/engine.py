"""One loaded GGUF model in this process: its llama.cpp context, prompts, generation, states.

Every method runs on the model's lane (``lane.py``: one worker thread at a time); nothing here is
thread-safe and nothing here may run on the event loop.

The context holds one sequence (id 0). **Reuse** follows ``Llama.generate``: the context's tokens
and a request's prompt share a prefix, the sequence is trimmed to it and only the rest is
evaluated; before that the chat-session cache (``sessions.py``) may put back a saved sequence
that shares a longer prefix. **What was evaluated** is read from llama.cpp's own counters
(``llama_perf_context``: prompt tokens evaluated in batches plus single-token evaluations, reset
before each request), so ``cached_tokens`` is the prompt minus what llama.cpp really computed.
**Sessions** are saved lazily: a chat's sequence is copied into the session cache only when a
request that does not continue it is about to overwrite it, so a conversation that goes on in
turn costs no copy. **States** are the sequence's bytes (``llama_state_seq_get_data``) and its
tokens (:class:`~werk_llamacpp.inproc.sessions.Saved`); restoring one clears the sequence first,
and a refused restore leaves it empty, never half-filled.
"""

from __future__ import annotations

import ctypes
import importlib
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from werk import BackendError, GeneratedText, InvalidRequest, Unavailable, Unsupported

from .library import load_library
from .options import InprocOptions
from .sessions import Saved, SessionCache, shared_prefix

__all__ = ["Engine", "Evaluation"]


@dataclass(frozen=True)
class Evaluation:
    """What a prompt cost: tokens in it, and how many llama.cpp evaluated for it."""

    prompt_tokens: int
    evaluated: int

    @property
    def cached(self) -> int:
        return self.prompt_tokens - self.evaluated


class _EndOfGeneration:
    """The model's end-of-generation tokens (``llama_vocab_is_eog``), as a container."""

    def __init__(self, lib: ModuleType, vocab: Any) -> None:
        self._lib = lib
        self._vocab = vocab

    def __contains__(self, token: object) -> bool:
        return isinstance(token, int) and bool(self._lib.llama_vocab_is_eog(self._vocab, token))


class Engine:
    """A ``llama_cpp.Llama`` and what Werk keeps beside it."""

    def __init__(
        self, lib: ModuleType, llm: Any, options: InprocOptions, session_bytes: int | None = None
    ) -> None:
        self.lib = lib
        self.llm = llm
        self.options = options
        self.n_ctx = int(llm.n_ctx())
        bound = options.session_cache_mb << 20 if session_bytes is None else session_bytes
        self.sessions = SessionCache(max_entries=options.session_entries, max_bytes=bound)
        self._eog = _EndOfGeneration(lib, lib.llama_model_get_vocab(llm.model))
        self._template = llm.metadata.get("tokenizer.chat_template") or None
        self.result: dict[str, Any] | None = None
        self._session_live = 0  # > 0: the sequence holds a conversation with this long a prompt
        self._formatter: Any = None

    @classmethod
    def load(cls, path: Path, options: InprocOptions, session_bytes: int | None = None) -> Engine:
        """Load ``path`` (already checked as a GGUF Werk can read) into a new context.

        :raises werk.Unavailable: llama.cpp refused the file or the settings.
        """
        lib, _ = load_library()
        try:
            llm = lib.Llama(
                model_path=str(path),
                n_ctx=options.ctx_size,
                n_batch=options.batch_size,
                n_ubatch=options.batch_size,
                n_threads=options.compute_threads,
                n_threads_batch=options.compute_threads,
                n_gpu_layers=0,
                seed=0,
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise Unavailable(
                f"llama.cpp could not load {path.name}: {exc}", retryable=False
            ) from None
        return cls(lib, llm, options, session_bytes)

    def close(self) -> None:
        self.sessions.clear()
        self.llm.close()

    # -- prompts ---------------------------------------------------------------------------------

    def _token_text(self, token: int) -> str:
        return bytes(self.llm.detokenize([token], special=True)).decode("utf-8", "replace")

    def prompt_tokens(self, text: str) -> list[int]:
        """A text prompt's tokens (a beginning-of-sequence token where the model asks for one)."""
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True))

    def chat_tokens(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The tokens of ``messages`` rendered with the model's chat template (the assistant's
        turn opened). A last ``assistant`` message is continued, as llama-server renders it
        (its ``prefill_assistant``): the messages before it with the assistant's turn opened,
        then its text — so a conversation kept with its reply is a prefix of the next turn.

        :raises werk.Unsupported: the model's file has no chat template.
        """
        if self._template is None:
            raise Unsupported("this model's GGUF has no chat template; use /v1/completions")
        if self._formatter is None:  # compiling the template costs ~1 ms: once per model
            chat_format = importlib.import_module("llama_cpp.llama_chat_format")
            self._formatter = chat_format.Jinja2ChatFormatter(
                template=self._template,
                eos_token=self._token_text(self.llm.token_eos()),
                bos_token=self._token_text(self.llm.token_bos()),
                add_generation_prompt=True,
            )
        history, opened = list(messages), ""
        last = history[-1] if len(history) > 1 else {}
        if last.get("role") == "assistant" and isinstance(last.get("content"), str):
            opened = history.pop()["content"]
        try:
            rendered = self._formatter(messages=history).prompt + opened
        except Exception as exc:  # the template's own raise_exception, or a Jinja error
            raise InvalidRequest(f"the model's chat template refused the messages: {exc}") from None
        return list(self.llm.tokenize(rendered.encode("utf-8"), add_bos=False, special=True))

    def _text(self, ids: list[int]) -> str:
        return bytes(self.llm.detokenize(ids)).decode("utf-8", "replace")

    # -- the sequence ----------------------------------------------------------------------------

    def live_tokens(self) -> list[int]:
        return [int(t) for t in self.llm.input_ids[: self.llm.n_tokens]]

    def save(self) -> Saved:
        """The sequence's tokens and bytes as they are now."""
        tokens = tuple(self.live_tokens())
        if not tokens:
            return Saved((), b"")
        ctx = self.llm.ctx
        size = int(self.lib.llama_state_seq_get_size(ctx, 0))
        buffer = (ctypes.c_uint8 * size)()
        written = int(self.lib.llama_state_seq_get_data(ctx, buffer, size, 0))
        if not 0 < written <= size:
            raise BackendError("llama.cpp could not copy the sequence state")
        return Saved(tokens, ctypes.string_at(buffer, written))

    def _stash(self, tokens: Sequence[int]) -> None:
        """Keep the live conversation in the session cache before a request whose prompt
        departs from it before the end of its last prompt overwrites it. A conversation that
        goes on (or the same prompt again) costs no copy: it only drops the reply's tail."""
        if self._session_live and shared_prefix(self.live_tokens(), tokens) < self._session_live:
            self._session_live = 0
            self.sessions.put(self.save())

    def clear(self) -> None:
        """Empty the sequence."""
        self._session_live = 0
        self.llm._ctx.kv_cache_seq_rm(0, 0, -1)
        self.llm.n_tokens = 0
        self.llm._requires_eval = True

    def restore(self, saved: Saved) -> None:
        """Make the sequence hold exactly ``saved``.

        :raises werk.BackendError: llama.cpp refused the bytes (the sequence is left empty).
        """
        self._stash(saved.tokens)
        self.clear()
        if not saved.tokens:
            return
        if len(saved.tokens) >= self.n_ctx:
            raise BackendError(
                f"the state holds {len(saved.tokens)} tokens; this context has {self.n_ctx}"
            )
        buffer = (ctypes.c_uint8 * len(saved.data)).from_buffer_copy(saved.data)
        read = int(self.lib.llama_state_seq_set_data(self.llm.ctx, buffer, len(saved.data), 0))
        if read != len(saved.data):
            self.clear()
            raise BackendError("llama.cpp refused the state's bytes for this context")
        self.llm.input_ids[: len(saved.tokens)] = saved.tokens
        self.llm.n_tokens = len(saved.tokens)
        self.llm._requires_eval = True  # logits are not part of a sequence state

    def _reset_counters(self) -> None:
        self.lib.llama_perf_context_reset(self.llm.ctx)

    def _evaluated(self) -> int:
        """Tokens llama.cpp evaluated since the last reset (its counters report at least 1 even
        when nothing ran; a zero time says nothing did)."""
        self.lib.llama_synchronize(self.llm.ctx)  # the counters count finished work only
        data = self.lib.llama_perf_context(self.llm.ctx)
        batched = int(data.n_p_eval) if data.t_p_eval_ms > 0 else 0
        single = int(data.n_eval) if data.t_eval_ms > 0 else 0
        return batched + single

    def _check_fits(self, tokens: Sequence[int]) -> None:
        if not tokens:
            raise InvalidRequest("the prompt is empty")
        if len(tokens) >= self.n_ctx:
            raise InvalidRequest(
                f"the prompt has {len(tokens)} tokens; this model's context is {self.n_ctx} "
                "(model option ctx_size)"
            )

    def evaluate(self, tokens: Sequence[int]) -> Evaluation:
        """Make the sequence hold ``tokens``, evaluating only what it does not share with them.

        :raises werk.InvalidRequest: the prompt does not fit the context.
        """
        self._check_fits(tokens)
        self._stash(tokens)
        self._session_live = 0  # a named state's prompt, not a conversation
        common = shared_prefix(self.live_tokens(), tokens)
        self._reset_counters()
        if common >= len(tokens):
            self.llm._ctx.kv_cache_seq_rm(0, len(tokens), -1)
            self.llm.n_tokens = len(tokens)
            self.llm._requires_eval = True
        else:
            self.llm.n_tokens = common  # eval() drops the sequence from here on
            try:
                self.llm.eval(list(tokens[common:]))
            except RuntimeError as exc:  # llama_decode's failure, as llama-cpp-python raises it
                self.clear()
                raise BackendError(f"llama.cpp failed to evaluate the prompt: {exc}") from None
        return Evaluation(len(tokens), self._evaluated())

    def _start_from(self, tokens: Sequence[int]) -> None:
        """Put back the saved session sharing the longest prefix, when it shares more than the
        live sequence does."""
        best = self.sessions.best(tokens)
        if best is not None and best[1] > shared_prefix(self.live_tokens(), tokens):
            self.restore(best[0])

    # -- generation ------------------------------------------------------------------------------

    def generation(
        self,
        tokens: Sequence[int],
        *,
        max_tokens: int | None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stops: Sequence[str] = (),
        remember: bool = False,
        sessions: bool = True,
        prompt_ids: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Generate after ``tokens``: events ``{"text", "ids"}``; then :attr:`result` holds the
        finish reason and usage (with ``cached_tokens``), as :func:`werk.generation_reply` reads
        them. With ``remember`` the sequence is a conversation: it is saved into the session cache
        when a later request that does not continue it takes the context (also when this caller
        stops early: what the sequence holds is consistent either way).

        :raises werk.InvalidRequest: the prompt does not fit the context.
        """
        self.result = None
        self._check_fits(tokens)
        budget = self.n_ctx - len(tokens)
        if max_tokens is not None:
            budget = min(budget, max_tokens)
        self._stash(tokens)
        if sessions:
            self._start_from(tokens)
        self._session_live = 0
        self.llm.set_seed(seed if seed is not None else secrets.randbits(31))
        self._reset_counters()
        generator = self.llm.generate(
            list(tokens),
            temp=temperature,
            top_p=top_p,
            top_k=0,
            min_p=0.0,
            typical_p=1.0,
            repeat_penalty=1.0,
            reset=True,
        )
        evaluated: list[int] = []

        def sampled() -> Iterator[int]:
            for token in generator:
                if not evaluated:  # the prompt is evaluated, nothing generated is yet
                    evaluated.append(self._evaluated())
                yield int(token)

        text = GeneratedText(self._text, list(stops))
        try:
            yield from text.follow(sampled(), self._eog, budget)
        except RuntimeError as exc:  # llama_decode's failure, as llama-cpp-python raises it
            self.clear()
            raise BackendError(f"llama.cpp failed during generation: {exc}") from None
        finally:
            generator.close()
            # kept when the next request goes elsewhere
            self._session_live = len(tokens) if remember else 0
        spent = evaluated[0] if evaluated else self._evaluated()
        result: dict[str, Any] = {
            "finish_reason": "stop" if text.finish == "stop" else "length",
            "usage": {
                "prompt_tokens": len(tokens),
                "completion_tokens": len(text.ids),
                "cached_tokens": max(0, len(tokens) - spent),
            },
        }
        if prompt_ids:
            result["prompt_ids"] = list(tokens)
        self.result = result

    def complete(self, tokens: Sequence[int], **sampling: Any) -> tuple[str, str, int]:
        """A whole generation: its text, finish reason and completion token count."""
        parts = [str(event.get("text", "")) for event in self.generation(tokens, **sampling)]
        result = self.result or {}
        return (
            "".join(parts),
            str(result.get("finish_reason")),
            int(result.get("usage", {}).get("completion_tokens", 0)),
        )
