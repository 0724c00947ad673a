"""A stand-in for the ``omlx`` CLI (test code; never shipped). Real oMLX runs only on macOS on
Apple silicon, so the Linux test suite runs this instead; it stands for oMLX and says so.

What it reproduces, read from jundot/omlx (``omlx/cli.py``, ``omlx/server.py``,
``omlx/api/openai_models.py`` at commit 01496518, and ``docs/admin-api.md``):

* the CLI: ``omlx serve`` with the real flags (``--model-dir``, ``--host``, ``--port``,
  ``--base-path``, ``--api-key``, ``--paged-ssd-cache-dir``, ``--paged-ssd-cache-max-size``,
  ``--no-cache``, …; argparse help text like the real one). The real CLI has no ``--version``;
  this one answers ``omlx --version`` with ``omlx 0.6.4 (werk test stand-in)``;
* models discovered as the subdirectories of ``--model-dir`` holding ``config.json`` and
  ``*.safetensors`` (the directory name is the model id), loaded on demand or by
  ``POST /v1/models/{id}/load``;
* the routes ``GET /health`` (``{"status": "healthy", "default_model", "engine_pool": {…},
  "mcp"}``, no key), ``GET /v1/models``, ``GET /v1/models/status`` (``{"models": [{"id",
  "loaded", "pinned", "size", "max_context_window", "max_tokens"}], "loaded_count",
  "max_model_memory"}``), ``POST /v1/models/{id}/load|unload``, ``POST /v1/chat/completions``
  and ``POST /v1/completions`` (streamed and not; a non-streamed answer starts with the
  keepalive space oMLX sends), the Bearer key on ``/v1/*`` (``401`` otherwise), OpenAI error
  bodies (``{"error": {"message", "type", "param", "code"}}``) and in-stream errors
  (``data: {"error": …}`` then ``[DONE]``);
* usage with the cached prompt tokens: top-level ``usage.cached_tokens`` (oMLX's ``Usage``
  extension) in non-streamed answers, ``usage.prompt_tokens_details.cached_tokens`` in the
  streamed usage chunk (``stream_options.include_usage``), the two positions oMLX versions use.

What is real: inference with ``mlx-lm`` on the CPU over the model's weights, greedy at
temperature 0, and exact-prefix reuse of the KV cache (``mlx_lm``'s prompt cache, trimmed to the
longest common token prefix) only while the paged SSD cache is enabled (``--paged-ssd-cache-dir``
and not ``--no-cache``); the cached-token counts are what that cache really skipped. After each
request the prompt cache is written with ``mlx_lm``'s ``save_prompt_cache`` under
``<paged-ssd-cache-dir>/<model>/``, oldest files removed beyond ``--paged-ssd-cache-max-size``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

VERSION = "0.6.4"
SIZE_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}
DEFAULT_MAX_TOKENS = 64


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?B)\s*", text.upper())
    if not match:
        raise SystemExit(f"Configuration error: invalid size {text!r}")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2)])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omlx", description="omlx: Production-ready LLM server for Apple Silicon"
    )
    parser.add_argument(
        "--version", action="version", version=f"omlx {VERSION} (werk test stand-in)"
    )
    commands = parser.add_subparsers(dest="command", help="Commands")
    serve = commands.add_parser("serve", help="Start multi-model OpenAI-compatible server")
    serve.add_argument(
        "--model-dir",
        type=str,
        default=None,
        help="Directory containing model subdirectories (default: ~/.omlx/models)",
    )
    serve.add_argument(
        "--max-model-memory",
        type=str,
        default=None,
        help="Maximum memory for loaded models (e.g., 32GB, 'disabled').",
    )
    serve.add_argument(
        "--max-process-memory",
        type=str,
        default=None,
        help="Max total process memory as percentage of system RAM.",
    )
    serve.add_argument("--host", type=str, default=None, help="Host to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="Port to bind (default: 8000)")
    serve.add_argument(
        "--log-level",
        type=str,
        default=None,
        choices=["trace", "debug", "info", "warning", "error"],
        help="Log level (default: info).",
    )
    serve.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=None,
        help="Max requests processed simultaneously. (default: 8)",
    )
    serve.add_argument(
        "--paged-ssd-cache-dir",
        type=str,
        default=None,
        help="Directory for paged SSD cache storage (enables oMLX prefix cache)",
    )
    serve.add_argument(
        "--paged-ssd-cache-max-size",
        type=str,
        default=None,
        help="Maximum paged SSD cache size (e.g., '100GB'). Default: 100GB",
    )
    serve.add_argument(
        "--paged-ssd-cache-clear-on-unload",
        action="store_true",
        help="Clear SSD cache when model is unloaded. Default: false",
    )
    serve.add_argument(
        "--hot-cache-max-size",
        type=str,
        default=None,
        help="Maximum in-memory hot cache size (e.g., '8GB'). Default: 0",
    )
    serve.add_argument("--no-cache", action="store_true", help="Disable oMLX paged SSD cache.")
    serve.add_argument(
        "--initial-cache-blocks",
        type=int,
        default=None,
        help="Number of cache blocks to pre-allocate at startup (default: 256).",
    )
    serve.add_argument(
        "--mcp-config",
        type=str,
        default=None,
        help="Path to MCP configuration file (JSON/YAML) for tool integration",
    )
    serve.add_argument(
        "--base-path",
        type=str,
        default=None,
        help="Base directory for oMLX data (default: ~/.omlx)",
    )
    serve.add_argument(
        "--api-key", type=str, default=None, help="API key for authentication (optional)"
    )
    return parser  # fmt: skip


def discover(model_dir: Path) -> dict[str, Path]:
    found = {}
    for entry in sorted(model_dir.iterdir()) if model_dir.is_dir() else []:
        if (
            entry.is_dir()
            and (entry / "config.json").is_file()
            and any(entry.glob("*.safetensors"))
        ):
            found[entry.name] = entry
    return found


class Engine:
    """One model: weights loaded by mlx-lm, one request at a time, exact-prefix KV reuse."""

    def __init__(self, model_id: str, path: Path, cache_dir: Path | None, cache_max: int) -> None:
        self.model_id = model_id
        self.path = path
        self.cache_dir = cache_dir / model_id if cache_dir is not None else None
        self.cache_max = cache_max
        self.model: Any = None
        self.tokenizer: Any = None
        self.lock = threading.Lock()
        self.cache: Any = None
        self.cached_tokens: list[int] = []

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def load(self) -> None:
        if self.model is None:
            from mlx_lm import load

            self.model, self.tokenizer = load(str(self.path))

    def unload(self) -> None:
        self.model = self.tokenizer = self.cache = None
        self.cached_tokens = []

    def prompt_tokens(self, body: dict[str, Any], chat: bool) -> list[int]:
        if chat:
            messages = [
                {"role": str(m.get("role")), "content": str(m.get("content") or "")}
                for m in body.get("messages") or []
            ]
            return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt else ""
        return list(self.tokenizer.encode(str(prompt or "")))

    def _reusable(self, tokens: list[int]) -> int:
        """How many leading tokens of ``tokens`` the cache can skip (at least one is fed)."""
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        if self.cache_dir is None or self.cache is None:
            return 0
        common = 0
        for mine, theirs in zip(self.cached_tokens, tokens, strict=False):
            if mine != theirs:
                break
            common += 1
        common = min(common, len(tokens) - 1)
        if common <= 0 or not can_trim_prompt_cache(self.cache):
            return 0
        trim_prompt_cache(self.cache, len(self.cached_tokens) - common)
        self.cached_tokens = self.cached_tokens[:common]
        return common

    def generate(self, tokens: list[int], body: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        """Yields ("text", piece) per token, then ("done", (finish, prompt, completion, cached))."""
        import mlx.core as mx
        from mlx_lm.generate import stream_generate
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.sample_utils import make_sampler

        with self.lock:
            self.load()
            reused = self._reusable(tokens)
            if reused == 0:
                self.cache, self.cached_tokens = make_prompt_cache(self.model), []
            if body.get("seed") is not None:
                mx.random.seed(int(body["seed"]))
            temperature = body.get("temperature")
            sampler = make_sampler(
                float(1.0 if temperature is None else temperature), float(body.get("top_p") or 1.0)
            )
            max_tokens = int(body.get("max_tokens") or DEFAULT_MAX_TOKENS)
            generated: list[int] = []
            finish = "length"
            for response in stream_generate(
                self.model, self.tokenizer, tokens[reused:], max_tokens=max_tokens,
                sampler=sampler, prompt_cache=self.cache,
            ):  # fmt: skip
                generated.append(int(response.token))
                if response.text:
                    yield "text", response.text
                if response.finish_reason:
                    finish = "stop" if response.finish_reason == "stop" else "length"
            self.cached_tokens = tokens + generated
            self._persist()
            yield "done", (finish, len(tokens), len(generated), reused)

    def _persist(self) -> None:
        """Write the prompt cache under the SSD cache directory; keep it within its bound."""
        if self.cache_dir is None or self.cache is None:
            return
        from mlx_lm.models.cache import save_prompt_cache

        self.cache_dir.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256(json.dumps(self.cached_tokens).encode()).hexdigest()[:24]
        save_prompt_cache(str(self.cache_dir / f"{name}.safetensors"), self.cache)
        files = sorted(self.cache_dir.glob("*.safetensors"), key=lambda p: p.stat().st_mtime)
        while files and sum(p.stat().st_size for p in files) > self.cache_max:
            files.pop(0).unlink(missing_ok=True)


def _error(message: str, status: int, code: str | None = None) -> Any:
    from starlette.responses import JSONResponse

    kind = {401: "authentication_error", 404: "not_found_error"}.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


def build_app(engines: dict[str, Engine], api_key: str | None) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def authorized(request: Request) -> bool:
        if api_key is None:
            return True
        header = request.headers.get("authorization", "")
        return header == f"Bearer {api_key}" or request.headers.get("x-api-key") == api_key

    async def health(request: Request) -> Any:
        loaded = sum(1 for e in engines.values() if e.loaded)
        return JSONResponse({
            "status": "healthy", "default_model": None, "mcp": None,
            "engine_pool": {"model_count": len(engines), "loaded_count": loaded,
                            "max_model_memory": None, "current_model_memory": 0},
        })  # fmt: skip

    async def models(request: Request) -> Any:
        if not authorized(request):
            return _error("API key required", 401)
        data = [
            {"id": mid, "object": "model", "created": int(time.time()), "owned_by": "omlx",
             "capabilities": {"type": "text", "streaming": True, "vision": False,
                              "function_calling": True, "max_tokens": 4096}}
            for mid in engines
        ]  # fmt: skip
        return JSONResponse({"object": "list", "data": data})

    async def status(request: Request) -> Any:
        if not authorized(request):
            return _error("API key required", 401)
        rows = [
            {"id": mid, "loaded": e.loaded, "pinned": False,
             "size": sum(p.stat().st_size for p in e.path.glob("*.safetensors")),
             "max_context_window": 4096, "max_tokens": DEFAULT_MAX_TOKENS}
            for mid, e in engines.items()
        ]  # fmt: skip
        loaded = sum(1 for e in engines.values() if e.loaded)
        return JSONResponse({"models": rows, "loaded_count": loaded, "max_model_memory": None})

    async def load_or_unload(request: Request) -> Any:
        if not authorized(request):
            return _error("API key required", 401)
        model_id = request.path_params["model_id"]
        engine = engines.get(model_id)
        if engine is None:
            return _error(f"Model not found: {model_id}", 404)
        if request.path_params["action"] == "load":
            await asyncio.to_thread(engine.load)
        elif not engine.loaded:
            return _error(f"Model not loaded: {model_id}", 400)
        else:
            engine.unload()
        return JSONResponse({"status": "ok", "model_id": model_id})

    async def complete(request: Request) -> Any:
        if not authorized(request):
            return _error("API key required", 401)
        chat = request.url.path.endswith("/chat/completions")
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error("body: invalid JSON", 422)
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return _error("model: Field required", 422, None)
        engine = engines.get(body["model"])
        if engine is None:
            available = ", ".join(engines) or "(none)"
            return _error(f"Model '{body['model']}' not found. Available models: {available}", 404)
        await asyncio.to_thread(engine.load)
        tokens = engine.prompt_tokens(body, chat)
        kind = "chat.completion" if chat else "text_completion"
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:8]
        if body.get("stream"):
            return StreamingResponse(
                _stream(engine, tokens, body, chat, kind, ident), media_type="text/event-stream"
            )
        return StreamingResponse(
            _whole(engine, tokens, body, chat, kind, ident), media_type="application/json"
        )

    return Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/status", status, methods=["GET"]),
        Route("/v1/models/{model_id}/{action:str}", load_or_unload, methods=["POST"]),
        Route("/v1/chat/completions", complete, methods=["POST"]),
        Route("/v1/completions", complete, methods=["POST"]),
    ])  # fmt: skip


async def _pieces(engine: Engine, tokens: list[int], body: dict[str, Any]) -> AsyncIterator[Any]:
    """The engine's generator, run in a thread, its items handed over as they come."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    end = object()

    def produce() -> None:
        try:
            for item in engine.generate(tokens, body):
                loop.call_soon_threadsafe(queue.put_nowait, item)
        except Exception as exc:  # reported in the answer, as oMLX does
            loop.call_soon_threadsafe(queue.put_nowait, ("error", exc))
        loop.call_soon_threadsafe(queue.put_nowait, end)

    threading.Thread(target=produce, daemon=True).start()
    while (item := await queue.get()) is not end:
        yield item


async def _whole(
    engine: Engine, tokens: list[int], body: dict[str, Any], chat: bool, kind: str, ident: str
) -> AsyncIterator[str]:
    yield " "  # oMLX's keepalive before a non-streamed JSON answer
    text, summary = [], None
    async for tag, value in _pieces(engine, tokens, body):
        if tag == "text":
            text.append(value)
        elif tag == "done":
            summary = value
        else:
            yield json.dumps({"error": {"message": str(value), "type": "server_error"}})
            return
    assert summary is not None
    finish, prompt, completion, cached = summary
    content = "".join(text)
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
        if chat
        else {"index": 0, "text": content, "finish_reason": finish}
    )
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": prompt + completion, "cached_tokens": cached or None}  # fmt: skip
    yield json.dumps({"id": ident, "object": kind, "created": int(time.time()),
                      "model": body["model"], "choices": [choice], "usage": usage})  # fmt: skip


async def _stream(
    engine: Engine, tokens: list[int], body: dict[str, Any], chat: bool, kind: str, ident: str
) -> AsyncIterator[str]:
    chunk_kind = f"{kind}.chunk" if chat else kind

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        data = {"id": ident, "object": chunk_kind, "created": int(time.time()),
                "model": body["model"], "choices": choices, **extra}  # fmt: skip
        return f"data: {json.dumps(data)}\n\n"

    if chat:
        yield event([{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}])
    async for tag, value in _pieces(engine, tokens, body):
        if tag == "text":
            part = {"delta": {"content": value}} if chat else {"text": value}
            yield event([{"index": 0, **part, "finish_reason": None}])
        elif tag == "done":
            finish, prompt, completion, cached = value
            part = {"delta": {}} if chat else {"text": ""}
            yield event([{"index": 0, **part, "finish_reason": finish}])
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                         "total_tokens": prompt + completion,
                         "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
                yield event([], usage=usage)
        else:
            error = {"error": {"message": str(value), "type": "server_error"}}
            yield f"data: {json.dumps(error)}\n\n"
            break
    yield "data: [DONE]\n\n"


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    base = Path(args.base_path or Path.home() / ".omlx")
    model_dir = Path(args.model_dir or base / "models")
    (base / "logs").mkdir(parents=True, exist_ok=True)
    cache_dir = None
    if not args.no_cache:
        cache_dir = Path(args.paged_ssd_cache_dir or base / "cache")
    cache_max = parse_size(args.paged_ssd_cache_max_size or "100GB")
    print("oMLX - LLM inference, optimized for your Mac (werk test stand-in)")
    print(f"└─ Version: {VERSION}")
    print(f"Base path: {base}")
    print(f"Model directories: {model_dir}")
    if cache_dir is None:
        print("Mode: Multi-model serving (no oMLX cache, mlx-lm BatchGenerator only)")
    else:
        print("Mode: Multi-model serving (continuous batching + paged SSD cache)")
        print(f"paged SSD cache: {cache_dir} (max: {cache_max / 1024**3:.1f}GB)")
    engines = {
        mid: Engine(mid, path, cache_dir, cache_max) for mid, path in discover(model_dir).items()
    }
    host, port = args.host or "127.0.0.1", args.port or 8000
    print(f"Starting server at http://{host}:{port}", flush=True)
    uvicorn.run(build_app(engines, args.api_key), host=host, port=port, log_level="warning")


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if args.command == "serve":
        serve(args)
    else:
        parser.print_help()
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
