"""``werk runtime stats``: what reusing named states saved the caller (GET /werk/v1/stats)."""

from __future__ import annotations

from ...protocol import StatsResponse
from ._common import (
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT,
    Connection,
    JsonOpt,
    KeyFileOpt,
    ServerOpt,
    TimeoutOpt,
    respond,
)
from ._render import show, table

__all__ = ["stats"]


def stats(
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Your own prefills per model since the server started: prompt tokens, how many of them
    the backend reported as reused from a named state (its own count, e.g. llama.cpp's
    timings.cache_n), and restores attempted / verified (reuse reported) / refused."""
    respond(
        Connection(server, api_key_file, timeout),
        as_json,
        lambda client: client.stats(),
        _print,
    )


def _share(cached: int, prompt: int) -> str:
    return "-" if prompt == 0 else f"{100 * cached / prompt:.1f}%"


def _print(response: StatsResponse) -> None:
    if not response.models:
        show(f"No prefill since {response.since}.")
        return
    show(
        table(
            f"Verified reuse since {response.since}",
            [
                "MODEL",
                "PREFILLS",
                "PROMPT TOKENS",
                "REUSED",
                "SHARE",
                "RESTORES",
                "VERIFIED",
                "REFUSED",
            ],
            [
                (
                    m.model,
                    m.prefills,
                    m.prompt_tokens,
                    m.cached_tokens,
                    _share(m.cached_tokens, m.prompt_tokens),
                    m.restores.attempted,
                    m.restores.verified,
                    m.restores.refused,
                )
                for m in response.models
            ],
        )
    )
