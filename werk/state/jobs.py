"""Durable job records and their outputs under ``WERK_HOME/jobs`` (seed "JobRecord").

Layout: ``jobs/<job id>.json`` (one record, replaced atomically: temporary file, fsync,
rename, fsync of the directory) and ``jobs/outputs/<output id>`` (a file a job produced,
written once, 0600). Every path is reached relative to an open directory with ``O_NOFOLLOW``
(:mod:`werk._fs`), like the state store.

A record stores what the job is (kind, the validated request without media bytes), its
status, its output and error, its times, and the principal it belongs to: reads by another
principal are ``not_found``. Terminal records survive a restart; :meth:`JobStore.recover`
(called when a server starts) turns every ``queued`` or ``running`` record into ``failed``
with "interrupted by a server restart" — a job is never resumed. At most
:data:`MAX_TERMINAL_JOBS` terminal records are kept: creating a job removes the oldest beyond
that, with their outputs.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec

from .. import _fs
from ..protocol import (
    IN_PROGRESS_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobDeleted,
    JobError,
    JobOutput,
    JobRecord,
    JobStatus,
    NotFound,
)
from ..protocol.base import rfc3339
from ._root import ensure_dir, storage_errors

__all__ = ["INTERRUPTED", "MAX_TERMINAL_JOBS", "JobStore"]

JOBS_DIR, OUTPUTS_DIR = "jobs", "outputs"
MAX_RECORD_BYTES = 1024 * 1024
MAX_OUTPUT_BYTES = 512 * 1024 * 1024
MAX_TERMINAL_JOBS = 1000
INTERRUPTED = "interrupted by a server restart"


class _Stored(msgspec.Struct, frozen=True, kw_only=True):
    """The file's shape: the public record plus its owner."""

    principal: str
    record: JobRecord


class JobStore:
    """Job records of one ``WERK_HOME`` (thread-safe; callers run it off the event loop)."""

    def __init__(self, home: Path, *, clock: Callable[[], float]) -> None:
        self._home = home
        self._clock = clock
        self._lock = threading.Lock()

    # -- directories ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _dirs(self) -> Iterator[tuple[int, int]]:
        with storage_errors("open the job store"):
            self._home.mkdir(parents=True, exist_ok=True, mode=0o700)
            home = os.open(self._home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                jobs = ensure_dir(home, JOBS_DIR, repair=True)
                try:
                    outputs = ensure_dir(jobs, OUTPUTS_DIR, repair=True)
                    try:
                        yield jobs, outputs
                    finally:
                        os.close(outputs)
                finally:
                    os.close(jobs)
            finally:
                os.close(home)

    def _read(self, jobs: int, job_id: str) -> _Stored | None:
        try:
            data = _fs.read_small(f"{job_id}.json", jobs, MAX_RECORD_BYTES)
        except (FileNotFoundError, _fs.Rejected):
            return None
        try:
            return msgspec.json.decode(data, type=_Stored)
        except msgspec.DecodeError:
            return None  # a corrupt record is never served (it stays for inspection)

    def _write(self, jobs: int, stored: _Stored) -> None:
        with storage_errors("write a job record"):
            _fs.replace_private_file(jobs, f"{stored.record.id}.json", msgspec.json.encode(stored))

    def _all(self, jobs: int) -> list[_Stored]:
        found = []
        for name in os.listdir(jobs):
            if name.endswith(".json") and not name.startswith(_fs.TMP_PREFIX):
                stored = self._read(jobs, name[: -len(".json")])
                if stored is not None:
                    found.append(stored)
        return found

    # -- operations ---------------------------------------------------------------------------

    def create(self, principal: str, kind: str, request: dict[str, Any]) -> JobRecord:
        now = rfc3339(self._clock())
        record = JobRecord(
            id="job_" + secrets.token_urlsafe(16),
            kind=kind,
            status=JobStatus.QUEUED,
            created_at=now,
            updated_at=now,
            request=request,
        )
        with self._lock, self._dirs() as (jobs, outputs):
            self._prune(jobs, outputs)
            self._write(jobs, _Stored(principal=principal, record=record))
        return record

    def create_finished(
        self, principal: str, kind: str, request: dict[str, Any], data: bytes, content_type: str
    ) -> JobRecord:
        """A ``completed`` record holding ``data`` as its output, in one step: what a
        synchronous request answered by URL keeps (``response_format: url``). The output is
        written (fsync) before the record, so a record never names a missing output."""
        now = rfc3339(self._clock())
        job_id = "job_" + secrets.token_urlsafe(16)
        output = self.save_output(job_id, data, content_type)
        record = JobRecord(
            id=job_id,
            kind=kind,
            status=JobStatus.COMPLETED,
            created_at=now,
            updated_at=now,
            request=request,
            output=output,
        )
        with self._lock, self._dirs() as (jobs, outputs):
            self._prune(jobs, outputs)
            self._write(jobs, _Stored(principal=principal, record=record))
        return record

    def get(self, principal: str, job_id: str) -> JobRecord:
        """The record, if it belongs to ``principal`` (``not_found`` otherwise)."""
        with self._lock, self._dirs() as (jobs, _):
            stored = self._read(jobs, job_id) if _valid_id(job_id, "job_") else None
        if stored is None or stored.principal != principal:
            raise NotFound("no such job")
        return stored.record

    def records(self, principal: str) -> list[JobRecord]:
        with self._lock, self._dirs() as (jobs, _):
            mine = [s.record for s in self._all(jobs) if s.principal == principal]
        return sorted(mine, key=lambda r: (r.created_at, r.id))

    def every_record(self) -> list[tuple[str, JobRecord]]:
        """Every principal's records with their owner (the local ``werk jobs`` command: whoever
        can read ``WERK_HOME`` owns them all). Creates nothing when there are none."""
        if not (self._home / JOBS_DIR).is_dir():
            return []
        with self._lock, self._dirs() as (jobs, _):
            found = [(s.principal, s.record) for s in self._all(jobs)]
        return sorted(found, key=lambda pair: (pair[1].created_at, pair[1].id))

    def update(self, job_id: str, **changes: Any) -> JobRecord:
        """Change a record (any principal: the runner's call); ``updated_at`` moves."""
        with self._lock, self._dirs() as (jobs, _):
            stored = self._read(jobs, job_id)
            if stored is None:
                raise NotFound("no such job")
            record = msgspec.structs.replace(
                stored.record, updated_at=rfc3339(self._clock()), **changes
            )
            self._write(jobs, _Stored(principal=stored.principal, record=record))
        return record

    def cancel(self, principal: str, job_id: str) -> JobRecord | JobDeleted:
        """``DELETE /v1/jobs/{id}``: ``queued`` → ``cancelled`` now; ``loading``/``running``/
        ``encoding`` → ``cancel_requested`` (the runner discards its result); a finished job
        (``completed``, ``failed``, ``cancelled``) is deleted with its output."""
        record = self.get(principal, job_id)
        if record.status is JobStatus.QUEUED:
            return self.update(job_id, status=JobStatus.CANCELLED)
        if record.status in IN_PROGRESS_JOB_STATUSES:
            return record if record.cancel_requested else self.update(job_id, cancel_requested=True)
        if self.remove(job_id, principal) == "gone":  # a concurrent DELETE was first
            raise NotFound("no such job")
        return JobDeleted(id=job_id)  # a finished record never becomes unfinished again

    def remove(
        self, job_id: str, principal: str | None = None
    ) -> Literal["removed", "gone", "unfinished"]:
        """Delete a finished record and its output (``werk cache purge``; ``DELETE`` with the
        owner's ``principal``): ``removed``; ``gone`` when it is not there (or not the
        principal's); ``unfinished`` (nothing deleted) while a runner may still write it."""
        with self._lock, self._dirs() as (jobs, outputs), storage_errors("remove a job"):
            stored = self._read(jobs, job_id) if _valid_id(job_id, "job_") else None
            if stored is None or (principal is not None and stored.principal != principal):
                return "gone"
            if stored.record.status not in TERMINAL_JOB_STATUSES:
                return "unfinished"
            if stored.record.output is not None:
                _fs.remove_entry(outputs, stored.record.output.id)
                _fs.fsync_dir(outputs)
            _fs.remove_entry(jobs, f"{job_id}.json")
            _fs.fsync_dir(jobs)
        return "removed"

    def save_output(self, job_id: str, data: bytes, content_type: str) -> JobOutput:
        if len(data) > MAX_OUTPUT_BYTES:
            raise ValueError("output too large")
        output_id = "out_" + secrets.token_urlsafe(16)
        with self._lock, self._dirs() as (_, outputs), storage_errors("write a job output"):
            _fs.create_private_file(outputs, output_id, data)
            _fs.fsync_dir(outputs)
        return JobOutput(
            id=output_id,
            url=f"/v1/outputs/{output_id}",
            content_type=content_type,
            bytes=len(data),
        )

    def output(self, principal: str, output_id: str) -> tuple[bytes, str]:
        """An output's bytes and content type, if a job of ``principal`` produced it."""
        if not _valid_id(output_id, "out_"):
            raise NotFound("no such output")
        with self._lock, self._dirs() as (jobs, outputs):
            owner = next(
                (
                    s
                    for s in self._all(jobs)
                    if s.record.output is not None and s.record.output.id == output_id
                ),
                None,
            )
            if owner is None or owner.principal != principal or owner.record.output is None:
                raise NotFound("no such output")
            try:
                data = _fs.read_small(output_id, outputs, MAX_OUTPUT_BYTES)
            except (FileNotFoundError, _fs.Rejected):
                raise NotFound("no such output") from None
        return data, owner.record.output.content_type

    def recover(self) -> list[str]:
        """At startup: every unfinished record becomes ``failed`` (never resumed)."""
        interrupted = []
        with self._lock, self._dirs() as (jobs, _):
            for name in os.listdir(jobs):
                if name.startswith(_fs.TMP_PREFIX):
                    _fs.remove_entry(jobs, name)
            for stored in self._all(jobs):
                if stored.record.status in TERMINAL_JOB_STATUSES:
                    continue
                record = msgspec.structs.replace(
                    stored.record,
                    status=JobStatus.FAILED,
                    updated_at=rfc3339(self._clock()),
                    error=JobError(code="interrupted", message=INTERRUPTED),
                )
                self._write(jobs, _Stored(principal=stored.principal, record=record))
                interrupted.append(record.id)
        return interrupted

    def _prune(self, jobs: int, outputs: int) -> None:
        finished = [s for s in self._all(jobs) if s.record.status in TERMINAL_JOB_STATUSES]
        excess = len(finished) - (MAX_TERMINAL_JOBS - 1)
        if excess <= 0:
            return
        for stored in sorted(finished, key=lambda s: s.record.updated_at)[:excess]:
            if stored.record.output is not None:
                _fs.remove_entry(outputs, stored.record.output.id)
            _fs.remove_entry(jobs, f"{stored.record.id}.json")
        _fs.fsync_dir(jobs)


def _valid_id(value: str, prefix: str) -> bool:
    body = value[len(prefix) :]
    return (
        value.startswith(prefix)
        and 0 < len(body) <= 64
        and all(c.isalnum() or c in "-_" for c in body)
    )
