"""``WerkControl``: one transport-neutral async method per protocol operation.

Implementations know nothing about HTTP headers or status codes; they raise
:class:`werk.WerkError` subclasses. The HTTP adapter and in-process callers (CLI, tests) share
this interface. Every method that touches principal-scoped data takes the caller's opaque
principal (``local`` or ``p_<hex>``), never an API key.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import anyio
import anyio.abc
import msgspec

from ..backends import OpenAIReply, OpenAIRoute
from ..protocol import (
    CapabilitiesResponse,
    ChatStateOptions,
    DecodeRequest,
    DecodeResponse,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertList,
    InfoResponse,
    JobDeleted,
    JobRecord,
    MemoryResponse,
    ModelList,
    PinRequest,
    PinResult,
    PrefillRequest,
    PrefillResponse,
    PruneRequest,
    PruneResult,
    ResidencyRequest,
    ResidencyResult,
    RuntimeList,
    StateList,
    StateSummary,
    StatsResponse,
    Tier,
    TierRequest,
    TierResult,
)
from .figures import ServiceFigures

__all__ = ["ImageModel", "StateQuery", "WerkControl"]


class StateQuery(msgspec.Struct, frozen=True, kw_only=True):
    """Filters of ``GET /werk/v1/states``."""

    model: str | None = None
    tier: Tier | None = None
    pinned: bool | None = None
    limit: int | None = None
    """At most this many states (1..1000); ``None``: all of them."""
    after: str | None = None
    """Only states whose id sorts after this one (the decoded ``cursor``)."""


class ImageModel(msgspec.Struct, frozen=True, kw_only=True):
    """A served Diffusers pipeline whose backend generates images (the checkpoints the
    AUTOMATIC1111 and ComfyUI routes offer).

    :ivar id: the model id.
    :ivar identity: its manifest identity (``sha256:…``).
    :ivar directory: the pipeline's folder.
    """

    id: str
    identity: str
    directory: str


class WerkControl(abc.ABC):
    """The Werk Protocol 1.0 operations, independent of any transport."""

    # discovery -------------------------------------------------------------------------------
    @abc.abstractmethod
    async def info(self) -> InfoResponse: ...

    @abc.abstractmethod
    async def capabilities(self, *, model: str | None = None) -> CapabilitiesResponse: ...

    @abc.abstractmethod
    async def memory(self) -> MemoryResponse: ...

    # models ----------------------------------------------------------------------------------
    @abc.abstractmethod
    async def models(self) -> ModelList: ...

    @abc.abstractmethod
    async def set_residency(
        self, model: str, request: ResidencyRequest, *, resident: bool
    ) -> ResidencyResult: ...

    # states ----------------------------------------------------------------------------------
    @abc.abstractmethod
    async def list_states(self, principal: str, query: StateQuery) -> StateList: ...

    @abc.abstractmethod
    async def inspect_state(self, principal: str, state_id: str) -> StateSummary: ...

    @abc.abstractmethod
    async def prune_states(self, principal: str, request: PruneRequest) -> PruneResult: ...

    @abc.abstractmethod
    async def pin_state(self, principal: str, state_id: str, request: PinRequest) -> PinResult: ...

    @abc.abstractmethod
    async def tier_state(
        self, principal: str, state_id: str, request: TierRequest
    ) -> TierResult: ...

    # prefill / decode ------------------------------------------------------------------------
    @abc.abstractmethod
    async def prefill(self, principal: str, request: PrefillRequest) -> PrefillResponse: ...

    @abc.abstractmethod
    async def decode(self, principal: str, request: DecodeRequest) -> DecodeResponse: ...

    # experts ---------------------------------------------------------------------------------
    @abc.abstractmethod
    async def experts(self, principal: str, model: str) -> ExpertList: ...

    @abc.abstractmethod
    async def expert_action(
        self,
        principal: str,
        model: str,
        action: Literal["prefetch", "evict"],
        request: ExpertActionRequest,
    ) -> ExpertActionResult: ...

    # jobs ------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def job(self, principal: str, job_id: str) -> JobRecord: ...

    @abc.abstractmethod
    async def jobs(self, principal: str) -> list[JobRecord]: ...

    @abc.abstractmethod
    async def submit_job(
        self, principal: str, kind: OpenAIRoute, body: dict[str, Any]
    ) -> JobRecord:
        """Queue a validated media request as a durable job (see :mod:`werk.state.jobs`)."""

    @abc.abstractmethod
    async def cancel_job(self, principal: str, job_id: str) -> JobRecord | JobDeleted:
        """Cancel a job that has not finished (its record), or delete a finished one with its
        output (:class:`JobDeleted`)."""

    @abc.abstractmethod
    async def job_output(self, principal: str, output_id: str) -> tuple[bytes, str]: ...

    @abc.abstractmethod
    async def run_jobs(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run queued jobs one at a time until cancelled (the server's lifespan starts it with
        ``TaskGroup.start``): first mark every unfinished record of an earlier server
        ``failed``, then report started, then serve the queue."""

    @abc.abstractmethod
    async def run_idle_unloads(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Unload runtimes idle past their keep-alive until cancelled (the server's lifespan
        starts it next to :meth:`run_jobs`); never one that is busy, holds a live handoff or a
        pinned in-memory state."""

    @abc.abstractmethod
    async def runtimes_listing(self) -> RuntimeList:
        """Loaded runtimes (``GET /werk/v1/runtimes``)."""

    @abc.abstractmethod
    async def stats(self, principal: str) -> StatsResponse:
        """The caller's verified-reuse figures (``GET /werk/v1/stats``)."""

    @abc.abstractmethod
    async def figures(self) -> ServiceFigures:
        """Everything ``/metrics`` reports besides HTTP traffic (no principal in it)."""

    # OpenAI-compatible /v1 ---------------------------------------------------------------------
    @abc.abstractmethod
    async def openai_models(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    async def image_models(self) -> list[ImageModel]:
        """The served models that are Diffusers pipelines of a backend serving
        ``images.generations``, in id order."""

    @abc.abstractmethod
    async def speech_models(self) -> list[str]:
        """The ids of served models of a backend serving ``audio.speech`` that are not image
        pipelines, in id order (a media backend's other models are listed too: a model that
        cannot speak fails its request with the backend's own error)."""

    @abc.abstractmethod
    async def openai_request(
        self,
        principal: str,
        route: OpenAIRoute,
        body: dict[str, Any],
    ) -> OpenAIReply: ...

    @abc.abstractmethod
    async def persisted_chat(
        self,
        principal: str,
        body: dict[str, Any],
        options: ChatStateOptions,
        *,
        on_text: Callable[[str], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        """A ``/v1`` chat turn with ``werk.persist``: prefill (continuing the longest saved
        prefix), decode, supersede (:mod:`werk.control.chat_states`); the
        ``chat.completion`` object. ``on_text`` gets the reply's text as it is generated
        (where the backend streams its decode; else all of it when the decode returns)."""

    # lifecycle -------------------------------------------------------------------------------
    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop every runtime this service owns."""
