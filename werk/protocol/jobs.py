"""Job records (§8). Jobs are principal-scoped like states."""

from __future__ import annotations

import enum
from typing import Any

from .base import Response

__all__ = ["JobError", "JobRecord", "JobStatus"]


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobError(Response, frozen=True, kw_only=True):
    code: str
    message: str


class JobRecord(Response, frozen=True, kw_only=True):
    id: str
    kind: str
    status: JobStatus
    created_at: str
    updated_at: str
    result: dict[str, Any] | None = None
    error: JobError | None = None
