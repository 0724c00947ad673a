"""Job records (§8). Jobs are principal-scoped like states.

A job-backed media request (``"async": true`` on ``/v1/audio/speech`` or
``/v1/images/generations``, or ``POST /v1/jobs``) is stored as a :class:`JobRecord` under
``WERK_HOME/jobs``; its status moves ``queued`` → ``loading`` (the model's runtime starts) →
``running`` (the backend works) → ``encoding`` (the output is stored) → ``completed``, or ends
``failed`` | ``cancelled``. A record is durable: terminal records survive a restart, and a
record found unfinished at startup becomes ``failed`` ("interrupted by a server restart"),
never resumed. What a job produced is an :class:`JobOutput`, downloaded from its ``url``.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import msgspec

from .base import Request, Response

__all__ = [
    "IN_PROGRESS_JOB_STATUSES",
    "TERMINAL_JOB_STATUSES",
    "JobDeleted",
    "JobError",
    "JobOutput",
    "JobRecord",
    "JobRequest",
    "JobStatus",
]


class JobStatus(enum.StrEnum):
    """A job's status (issue 13's names; PROTOCOL.md §8 had ``succeeded`` and no phases)."""

    QUEUED = "queued"
    LOADING = "loading"
    RUNNING = "running"
    ENCODING = "encoding"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_JOB_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
IN_PROGRESS_JOB_STATUSES = frozenset({JobStatus.LOADING, JobStatus.RUNNING, JobStatus.ENCODING})


class JobError(Response, frozen=True, kw_only=True):
    code: str
    message: str


class JobOutput(Response, frozen=True, kw_only=True):
    """A file a job produced: ``GET url`` (``/v1/outputs/{id}``) downloads it."""

    id: str
    url: str
    content_type: str
    bytes: int


class JobRecord(Response, frozen=True, kw_only=True):
    id: str
    kind: str
    status: JobStatus
    created_at: str
    updated_at: str
    result: dict[str, Any] | None = None
    error: JobError | None = None
    output: JobOutput | None = None
    cancel_requested: bool = False
    request: dict[str, Any] | None = None
    """The request as validated (media bytes left out)."""


class JobDeleted(Response, frozen=True, kw_only=True):
    """``DELETE /v1/jobs/{id}`` of a finished job: it was deleted with its output (OpenAI's
    deletion shape, as for files)."""

    id: str
    object: Literal["job.deleted"] = "job.deleted"
    deleted: bool = True


class JobRequest(Request, frozen=True, kw_only=True):
    """``POST /v1/jobs``: run one media request as a job.

    :ivar kind: the ``/v1`` route (``audio.speech`` or ``images.generations``).
    :ivar request: that route's request body.
    """

    kind: Literal["audio.speech", "images.generations"]
    request: Annotated[dict[str, Any], msgspec.Meta(max_length=32)]
