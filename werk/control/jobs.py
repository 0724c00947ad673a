"""Durable jobs through the service: a bounded queue of ``/v1`` media requests run one at a
time, each with its record (``queued`` → ``loading`` → ``running`` → ``encoding`` →
``completed``/``failed``/``cancelled``) and its output kept in the job store.
"""

from __future__ import annotations

import base64
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream

from ..backends import OpenAIReply, OpenAIRoute
from ..protocol import (
    BackendError,
    InvalidRequest,
    JobDeleted,
    JobError,
    JobRecord,
    JobStatus,
    ResourceExhausted,
    Unavailable,
    Unsupported,
    WerkError,
)
from .context import ServiceContext

__all__ = ["JOB_KINDS", "JOB_QUEUE_SIZE", "JobQueue"]

log = logging.getLogger("werk.control")

JOB_KINDS: tuple[OpenAIRoute, ...] = ("audio.speech", "images.generations")
JOB_QUEUE_SIZE = 256
_QueuedJob = tuple[str, str, OpenAIRoute, dict[str, Any]]
"""(job id, principal, route, validated body)."""

RunRequest = Callable[..., Awaitable[OpenAIReply]]
"""``run(principal, route, body, started=…)``: one ``/v1`` request (the service's own)."""


def job_artifact(kind: OpenAIRoute, reply: OpenAIReply) -> tuple[bytes, str]:
    """The file a finished job keeps: the speech audio, or the (one) image as PNG."""
    if kind == "audio.speech":
        if reply.content is None or reply.media_type is None:
            raise BackendError("the backend answered speech without audio")
        return reply.content, reply.media_type
    data = (reply.body or {}).get("data") or [{}]
    encoded = data[0].get("b64_json") if isinstance(data[0], dict) else None
    if not isinstance(encoded, str):
        raise BackendError("the backend answered the image request without an image")
    return base64.b64decode(encoded), "image/png"


class JobQueue:
    """The job routes of :class:`~werk.control.service.LocalControlService`; :meth:`run` is
    the worker ``werk serve`` runs in the background."""

    def __init__(self, service: ServiceContext, run_request: RunRequest) -> None:
        self._service = service
        self._run_request = run_request
        self._send: MemoryObjectSendStream[_QueuedJob] | None = None  # while run() runs

    async def get(self, principal: str, job_id: str) -> JobRecord:
        return await anyio.to_thread.run_sync(self._service.job_store.get, principal, job_id)

    async def listing(self, principal: str) -> list[JobRecord]:
        return await anyio.to_thread.run_sync(self._service.job_store.records, principal)

    async def submit(self, principal: str, kind: OpenAIRoute, body: dict[str, Any]) -> JobRecord:
        service = self._service
        if kind not in JOB_KINDS:
            raise InvalidRequest(f"{kind} cannot run as a job (jobs: {', '.join(JOB_KINDS)})")
        model = body.get("model")
        spec = service.spec(model if isinstance(model, str) else "")
        if kind not in service.pm.backends[spec.backend].routes:
            raise Unsupported(
                f"model {spec.id!r} (backend {spec.backend!r}) does not serve "
                f"/v1/{kind.replace('.', '/')}"
            )
        if kind == "images.generations" and body.get("n", 1) != 1:
            raise InvalidRequest("an image job makes one image: use 'n': 1")
        if kind == "images.generations":  # a job's image is always a stored output
            body = {**body, "response_format": "b64_json"}
        queue = self._send
        if queue is None:
            raise Unavailable("this server runs no job queue", retryable=False)
        store = service.job_store
        record = await anyio.to_thread.run_sync(store.create, principal, kind, body)
        try:
            queue.send_nowait((record.id, principal, kind, body))
        except anyio.WouldBlock:
            await anyio.to_thread.run_sync(
                functools.partial(
                    store.update,
                    record.id,
                    status=JobStatus.FAILED,
                    error=JobError(code="resource_exhausted", message="the job queue is full"),
                )
            )
            raise ResourceExhausted("the job queue is full; retry later") from None
        return record

    async def cancel(self, principal: str, job_id: str) -> JobRecord | JobDeleted:
        return await anyio.to_thread.run_sync(self._service.job_store.cancel, principal, job_id)

    async def output(self, principal: str, output_id: str) -> tuple[bytes, str]:
        return await anyio.to_thread.run_sync(self._service.job_store.output, principal, output_id)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        send, receive = anyio.create_memory_object_stream[_QueuedJob](JOB_QUEUE_SIZE)
        async with send, receive:
            interrupted = await anyio.to_thread.run_sync(self._service.job_store.recover)
            if interrupted:
                log.warning("%d unfinished job(s) of an earlier server failed", len(interrupted))
            self._send = send
            task_status.started()
            try:
                async for job_id, principal, kind, body in receive:
                    await self._run_job(job_id, principal, kind, body)
            finally:
                self._send = None

    async def _run_job(
        self, job_id: str, principal: str, kind: OpenAIRoute, body: dict[str, Any]
    ) -> None:
        store = self._service.job_store
        record = await anyio.to_thread.run_sync(store.get, principal, job_id)
        if record.status is not JobStatus.QUEUED:
            return  # cancelled while queued

        async def phase(status: JobStatus) -> None:
            await anyio.to_thread.run_sync(functools.partial(store.update, job_id, status=status))

        await phase(JobStatus.LOADING)
        changes: dict[str, Any]
        try:
            reply = await self._run_request(
                principal, kind, body, started=lambda: phase(JobStatus.RUNNING)
            )
            data, content_type = job_artifact(kind, reply)
            current = await anyio.to_thread.run_sync(store.get, principal, job_id)
            if current.cancel_requested:
                changes = {"status": JobStatus.CANCELLED}
            else:
                await phase(JobStatus.ENCODING)
                output = await anyio.to_thread.run_sync(
                    store.save_output, job_id, data, content_type
                )
                changes = {"status": JobStatus.COMPLETED, "output": output}
        except WerkError as exc:
            changes = {
                "status": JobStatus.FAILED,
                "error": JobError(code=exc.code.value, message=exc.message),
            }
        except Exception:
            log.exception("job %s failed", job_id)
            changes = {
                "status": JobStatus.FAILED,
                "error": JobError(code="internal", message="the job failed inside Werk"),
            }
        await anyio.to_thread.run_sync(functools.partial(store.update, job_id, **changes))
