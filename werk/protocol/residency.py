"""Model residency and expert residency shapes (§7)."""

from __future__ import annotations

import enum
import math
from typing import Annotated

import msgspec

from .base import Request, Response
from .durations import parse_duration_seconds
from .errors import InvalidRequest

__all__ = [
    "MAX_EXPERTS_PER_REQUEST",
    "ExpertAction",
    "ExpertActionRequest",
    "ExpertActionResult",
    "ExpertInfo",
    "ExpertList",
    "ExpertSkip",
    "ExpertTier",
    "LoadingRuntime",
    "ModelInfo",
    "ModelList",
    "PagePreparation",
    "ResidencyRequest",
    "ResidencyResult",
    "RuntimeInfo",
    "RuntimeList",
]

MAX_EXPERTS_PER_REQUEST = 4096

ExpertId = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class ModelInfo(Response, frozen=True, kw_only=True):
    id: str
    backend: str
    identity: str
    resident: bool | None = None


class ModelList(Response, frozen=True, kw_only=True):
    models: list[ModelInfo]


class PagePreparation(Response, frozen=True, kw_only=True):
    """What page preparation did before a runtime's native load (``werk ps -v``).

    ``outcome``: ``completed``, ``stopped: <why>`` (deadline, memory pressure, cancelled, an
    error: every mapping was dropped) or ``skipped: <why>``. ``checked_bytes``: residency
    checked with ``mincore``; ``missing_bytes``: of those, not resident before;
    ``prefaulted_bytes``: populated with ``MADV_POPULATE_READ``; ``retained_bytes``: still
    mapped while the runtime lives (0 unless completed).
    """

    outcome: str
    seconds: float = 0.0
    checked_bytes: int = 0
    missing_bytes: int = 0
    prefaulted_bytes: int = 0
    retained_bytes: int = 0


class RuntimeInfo(Response, frozen=True, kw_only=True):
    """One loaded runtime (``GET /werk/v1/runtimes``, ``werk ps``). Runtimes serve models, not
    principals: nothing here belongs to a caller.

    ``idle_until`` is when it is unloaded if nothing uses it (``null`` while busy, or when its
    keep-alive is "never"); ``keep_alive_seconds`` is the keep-alive that applies when it next
    goes idle (``null``: never). ``reserved_bytes`` is Werk's memory reservation for it
    (``null`` until its backend supplies a memory requirement); ``observed_bytes`` the resident
    memory of its process tree now (``null`` without a process or when it cannot be read).
    ``preparation`` is what page preparation did before its native load (``null`` when none
    applied, e.g. a dense model).
    """

    model: str
    backend: str
    generation: str
    pid: int | None
    started_at: str
    age_seconds: int
    busy: int
    idle_until: str | None
    keep_alive_seconds: float | None
    reserved_bytes: int | None
    observed_bytes: int | None
    preparation: PagePreparation | None = None


class LoadingRuntime(Response, frozen=True, kw_only=True):
    """A runtime being started (``werk ps`` shows it before it is loaded).

    ``phase`` is ``reserving memory`` (waiting until the model fits), ``opening files`` or
    ``starting`` (the backend loads the model and waits for its readiness); ``waiting`` counts
    the requests that wait for this start, the one that began it included.
    """

    model: str
    backend: str
    phase: str
    started_at: str
    elapsed_seconds: int
    waiting: int


class RuntimeList(Response, frozen=True, kw_only=True):
    """``GET /werk/v1/runtimes``: the loaded runtimes, and those being started (``loading``)."""

    runtimes: list[RuntimeInfo]
    loading: list[LoadingRuntime] = msgspec.field(default_factory=list)


class ResidencyRequest(Request, frozen=True, kw_only=True):
    dry_run: bool = False


class ResidencyResult(Response, frozen=True, kw_only=True):
    model: str
    resident: bool


class ExpertTier(enum.StrEnum):
    VRAM = "vram"
    RAM = "ram"
    EXTERNAL = "external"


class ExpertInfo(Response, frozen=True, kw_only=True):
    id: str
    tier: ExpertTier
    bytes: int | None
    hotness: float
    pinned: bool


class ExpertList(Response, frozen=True, kw_only=True):
    model: str
    experts: list[ExpertInfo]


class ExpertActionRequest(Request, frozen=True, kw_only=True):
    """``POST /werk/v1/experts/{model}/prefetch|evict``. Dry run and no opt-in by default."""

    experts: Annotated[
        list[ExpertId], msgspec.Meta(min_length=1, max_length=MAX_EXPERTS_PER_REQUEST)
    ]
    target: ExpertTier = ExpertTier.RAM
    dry_run: bool = True
    allow_experimental: bool = False


class ExpertAction(Response, frozen=True, kw_only=True):
    id: str
    from_: ExpertTier = msgspec.field(name="from")
    to: ExpertTier


class ExpertSkip(Response, frozen=True, kw_only=True):
    id: str
    reason: str


class ExpertActionResult(Response, frozen=True, kw_only=True):
    dry_run: bool
    planned: list[ExpertAction]
    applied: list[ExpertAction]
    skipped: list[ExpertSkip]


KEEP_ALIVE_MAX_SECONDS = 30 * 86400


def parse_keep_alive(value: object) -> float | None:
    """A keep-alive as ``werk serve --keep-alive`` and a ``/v1`` body's ``keep_alive`` accept it
    (Ollama's forms): seconds as a number or numeric string, or a duration such as ``"300ms"``,
    ``"10s"``, ``"5m"``, ``"1h30m"`` (:func:`~werk.protocol.durations.parse_duration_seconds`);
    ``0`` unloads right after the request; any negative value (``-1``, ``"-1m"``) keeps the
    model loaded forever (returns ``None``).

    :raises werk.InvalidRequest: anything else, or more than 30 days (use ``-1`` for never).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidRequest("'keep_alive' must be a number of seconds or a duration like '5m'")
    if isinstance(value, str):
        text = value.strip()
        negative = text.startswith("-")
        try:
            seconds = parse_duration_seconds(text[1:] if negative else text)
        except ValueError:
            raise InvalidRequest(
                f"'keep_alive' {value!r} is not a duration (examples: 300, '10s', '5m', "
                "'1h30m', 0, -1)"
            ) from None
        if negative:
            return None
    else:
        seconds = float(value)
        if not math.isfinite(seconds):
            raise InvalidRequest("'keep_alive' must be finite")
    if seconds < 0:
        return None
    if seconds > KEEP_ALIVE_MAX_SECONDS:
        raise InvalidRequest(
            f"'keep_alive' may be at most {KEEP_ALIVE_MAX_SECONDS} seconds; use -1 for never"
        )
    return seconds
