"""The kit's ``/v1`` checks: chat and text completions, streamed and not, a stream the client
closes early, and a malformed body."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec

from ..control.service import LocalControlService
from ..protocol import Unsupported
from .describe import describe, is_typed
from .report import ConformanceReport

__all__ = ["CLOSE_BOUND_SECONDS", "MAX_TOKENS", "PRINCIPAL", "check_v1"]

PRINCIPAL = "p_" + "0" * 64
CLOSE_BOUND_SECONDS = 1.0
MAX_TOKENS = 8


def chat_body(model: str, *, stream: bool, content: Any = "Say hello.") -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "stream": stream,
    }


def _completion_body(model: str, *, stream: bool) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": "Once upon a time",
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "stream": stream,
    }


def finish_reason(payload: Any) -> str | None:
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            return str(choice["finish_reason"])
    return None


async def _aclose(stream: AsyncIterator[bytes]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


class _V1:
    def __init__(
        self,
        report: ConformanceReport,
        service: LocalControlService,
        model: str,
        plugin: tuple[Path, ...],
    ) -> None:
        self.report, self.service, self.model, self.plugin = report, service, model, plugin

    def fail(self, name: str, exc: BaseException) -> None:
        self.report.add(name, False, describe(exc, self.plugin))

    def refused(self, name: str, exc: BaseException) -> None:
        """``Unsupported`` is the backend's honest answer for a route it does not serve (a
        skip); anything else fails the check."""
        if isinstance(exc, Unsupported):
            self.report.add(name, None, f"the backend says it does not serve it: {exc.message}")
        else:
            self.fail(name, exc)

    async def answered(self, name: str, route: Any, body: dict[str, Any]) -> None:
        try:
            reply = await self.service.openai_request(PRINCIPAL, route, body)
        except Exception as exc:
            self.refused(name, exc)
            return
        reason = finish_reason(reply.body)
        self.report.add(
            name,
            reason is not None,
            "" if reason else "the reply has no choice with a finish_reason",
        )

    async def streamed(self, name: str, route: Any, body: dict[str, Any]) -> None:
        try:
            reply = await self.service.openai_request(PRINCIPAL, route, body)
            if reply.stream is None:
                self.report.add(name, False, "a request with stream: true got no stream")
                return
            reasons: list[str] = []
            chunks = 0
            try:
                async for payload in reply.stream:
                    chunks += 1
                    reason = finish_reason(msgspec.json.decode(payload))
                    if reason:
                        reasons.append(reason)
            finally:
                await _aclose(reply.stream)
        except Exception as exc:
            self.refused(name, exc)
            return
        self.report.add(
            name,
            bool(reasons),
            f"{chunks} chunk(s)"
            if reasons
            else f"none of {chunks} chunk(s) has a finish_reason (werk run and werk chat need one)",
        )

    async def closed_early(self) -> None:
        name = "/v1 stream closed by the client"
        try:
            reply = await self.service.openai_request(
                PRINCIPAL, "chat.completions", chat_body(self.model, stream=True)
            )
            assert reply.stream is not None
            with anyio.fail_after(30):
                await reply.stream.__anext__()
            with anyio.move_on_after(CLOSE_BOUND_SECONDS) as scope:
                await _aclose(reply.stream)
            closed = not scope.cancelled_caught
            after = await self.service.openai_request(
                PRINCIPAL, "chat.completions", chat_body(self.model, stream=False)
            )
        except Exception as exc:
            self.fail(name, exc)
            return
        self.report.add(
            name,
            closed and finish_reason(after.body) is not None,
            "" if closed else f"aclose() did not return within {CLOSE_BOUND_SECONDS:g}s",
        )

    async def malformed(self) -> None:
        name = "/v1 malformed request refused"
        try:
            await self.service.openai_request(
                PRINCIPAL, "chat.completions", {"model": self.model, "messages": "not a list"}
            )
        except Exception as exc:
            self.report.add(name, is_typed(exc), describe(exc, self.plugin))
            return
        self.report.add(name, False, "a body with non-list messages was answered")


async def check_v1(
    report: ConformanceReport,
    service: LocalControlService,
    model: str,
    plugin: tuple[Path, ...] = (),
) -> None:
    """Chat and text completions (a backend that answers ``unsupported`` for text completions
    is skipped there, not failed), an early close and a malformed body."""
    v1 = _V1(report, service, model, plugin)
    await v1.answered("/v1 chat completion", "chat.completions", chat_body(model, stream=False))
    await v1.streamed(
        "/v1 streamed chat completion", "chat.completions", chat_body(model, stream=True)
    )
    await v1.closed_early()
    await v1.malformed()
    await v1.answered("/v1 text completion", "completions", _completion_body(model, stream=False))
    await v1.streamed(
        "/v1 streamed text completion", "completions", _completion_body(model, stream=True)
    )
