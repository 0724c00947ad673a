"""Error codes, their HTTP statuses, the error body, and the exception hierarchy.

There is one root, :class:`WerkError`, carrying a protocol :class:`ErrorCode`. Every code has
exactly one subclass. Transports map an exception to a response through
:data:`HTTP_STATUS` only; nothing else in the codebase knows HTTP status numbers.

Messages are Werk's own words. Backend error text is never passed through as a message.
"""

from __future__ import annotations

import enum
import errno
from typing import ClassVar

from .base import Response

__all__ = [
    "HTTP_STATUS",
    "BackendError",
    "Conflict",
    "ErrorBody",
    "ErrorCode",
    "ErrorDetail",
    "ExperimentalOptInRequired",
    "IncompatibleState",
    "InsufficientStorage",
    "InternalError",
    "InvalidHandoff",
    "InvalidRequest",
    "NotFound",
    "PayloadTooLarge",
    "ReadOnlyStorage",
    "ResourceExhausted",
    "ReuseUnavailable",
    "RuntimeEnded",
    "Unauthenticated",
    "Unavailable",
    "Unsupported",
    "UnsupportedMediaType",
    "WerkError",
    "WerkTimeout",
    "error_class",
    "storage_refusal",
]


class ErrorCode(enum.StrEnum):
    """Every error code of Werk Protocol 1.0 (PROTOCOL.md §1)."""

    INVALID_REQUEST = "invalid_request"
    UNAUTHENTICATED = "unauthenticated"
    EXPERIMENTAL_OPT_IN_REQUIRED = "experimental_opt_in_required"
    NOT_FOUND = "not_found"
    INVALID_HANDOFF = "invalid_handoff"
    INCOMPATIBLE_STATE = "incompatible_state"
    REUSE_UNAVAILABLE = "reuse_unavailable"
    CONFLICT = "conflict"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    INTERNAL = "internal"
    UNSUPPORTED = "unsupported"
    BACKEND_ERROR = "backend_error"
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.EXPERIMENTAL_OPT_IN_REQUIRED: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INVALID_HANDOFF: 410,
    ErrorCode.INCOMPATIBLE_STATE: 409,
    ErrorCode.REUSE_UNAVAILABLE: 409,
    ErrorCode.CONFLICT: 409,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.RESOURCE_EXHAUSTED: 429,
    ErrorCode.INTERNAL: 500,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.BACKEND_ERROR: 502,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.TIMEOUT: 504,
}
"""The single table from error code to HTTP status (PROTOCOL.md §1)."""


class ErrorDetail(Response, frozen=True, kw_only=True, omit_defaults=True):
    """The ``error`` member of an error body. ``capability`` only when a gate caused it.

    ``retryable`` has no default so that ``omit_defaults`` never drops ``"retryable": false``.
    """

    code: ErrorCode
    message: str
    retryable: bool
    request_id: str | None = None
    capability: str | None = None


class ErrorBody(Response, frozen=True, kw_only=True):
    """``{"error": {...}}`` — the body of every /werk/v1 error response."""

    error: ErrorDetail


class WerkError(Exception):
    """Root of every error Werk reports to a client.

    :param message: Werk's own human-readable summary (never raw backend output).
    :param capability: the capability id whose gate caused the error, if any.
    :param retryable: override the code's default retryability.
    :param retry_after: seconds a client should wait before retrying (sent as ``Retry-After``
        with a retryable error).
    :param param: the request member the error is about (OpenAI's ``param`` on ``/v1``).
    :param openai_code: the ``code`` an OpenAI client looks for on ``/v1`` (e.g.
        ``context_length_exceeded``), where it is more precise than the Werk code.
    """

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL
    default_retryable: ClassVar[bool] = False
    status_override: ClassVar[int | None] = None
    """A transport status more precise than the code's (only 415 for a wrong content type)."""

    def __init__(
        self,
        message: str,
        *,
        capability: str | None = None,
        retryable: bool | None = None,
        retry_after: int | None = None,
        param: str | None = None,
        openai_code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.capability = capability
        self.retryable = self.default_retryable if retryable is None else retryable
        self.retry_after = retry_after
        self.param = param
        self.openai_code = openai_code
        self.request_id: str | None = None
        """Set by the bundled client from the server's error body."""

    @property
    def http_status(self) -> int:
        return self.status_override or HTTP_STATUS[self.code]

    def to_body(self, request_id: str | None = None) -> ErrorBody:
        """The protocol error body for this exception."""
        return ErrorBody(
            error=ErrorDetail(
                code=self.code,
                message=self.message,
                retryable=self.retryable,
                request_id=request_id,
                capability=self.capability,
            )
        )

    def __repr__(self) -> str:
        cap = f", capability={self.capability!r}" if self.capability else ""
        return f"{type(self).__name__}({self.message!r}{cap})"


class InvalidRequest(WerkError):
    """Malformed JSON, wrong types, unknown fields or out-of-range values."""

    code = ErrorCode.INVALID_REQUEST


class UnsupportedMediaType(InvalidRequest):
    """A request body that is not ``application/json`` (``invalid_request``, HTTP 415)."""

    status_override = 415


class Unauthenticated(WerkError):
    """Missing or wrong API key."""

    code = ErrorCode.UNAUTHENTICATED


class ExperimentalOptInRequired(WerkError):
    """The capability is ``experimental`` and the effective request did not opt in."""

    code = ErrorCode.EXPERIMENTAL_OPT_IN_REQUIRED


class NotFound(WerkError):
    """Unknown model, or a state unknown, expired or owned by another principal."""

    code = ErrorCode.NOT_FOUND


class InvalidHandoff(WerkError):
    """Handoff unknown, expired, consumed, or bound to another principal or generation."""

    code = ErrorCode.INVALID_HANDOFF


class IncompatibleState(WerkError):
    """A state exists but its producer envelope differs from the runtime's."""

    code = ErrorCode.INCOMPATIBLE_STATE


class ReuseUnavailable(WerkError):
    """``reuse: required`` and no compatible reusable state could be proven."""

    code = ErrorCode.REUSE_UNAVAILABLE


class Conflict(WerkError):
    """The target is busy or pinned against the requested action."""

    code = ErrorCode.CONFLICT


class PayloadTooLarge(WerkError):
    """A request body or a backend output exceeds its bound."""

    code = ErrorCode.PAYLOAD_TOO_LARGE


class ResourceExhausted(WerkError):
    """A bounded capacity (handoffs, reservations, ...) is full. Retryable."""

    code = ErrorCode.RESOURCE_EXHAUSTED
    default_retryable = True


class InternalError(WerkError):
    """A bug. The client sees a generic message; details go to the server log."""

    code = ErrorCode.INTERNAL


class Unsupported(WerkError):
    """The active adapter does not implement the operation."""

    code = ErrorCode.UNSUPPORTED


class BackendError(WerkError):
    """The backend failed. The message is Werk's summary, never the backend's JSON."""

    code = ErrorCode.BACKEND_ERROR


class Unavailable(WerkError):
    """The contract exists but a prerequisite (process, probe, telemetry) is missing now."""

    code = ErrorCode.UNAVAILABLE
    default_retryable = True


class RuntimeEnded(Unavailable):
    """The runtime ended before this request reached it (nothing was sent to the backend):
    raised by a backend's operation, it makes the host start a fresh runtime and make the call
    once more (once). A request that was sent, even partly, must not raise it: the backend
    may have acted on it."""


class InsufficientStorage(Unavailable):
    """The disk that holds ``WERK_HOME`` is full (``ENOSPC``, ``EDQUOT``): a write was refused,
    nothing half-written was published, reads keep working. HTTP 507; retryable once space is
    freed."""

    status_override = 507


class ReadOnlyStorage(Unavailable):
    """The file system that holds ``WERK_HOME`` is read-only (``EROFS``): a write was refused,
    reads keep working. Not retryable until an operator makes it writable again."""

    default_retryable = False


def storage_refusal(exc: OSError, action: str) -> Unavailable | None:
    """The typed error for a write the disk refused (full or read-only), else ``None``."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientStorage(
            f"could not {action}: no space left on the disk that holds WERK_HOME; "
            "free space and retry",
            retry_after=30,
        )
    if exc.errno == errno.EROFS:
        return ReadOnlyStorage(
            f"could not {action}: the file system that holds WERK_HOME is read-only"
        )
    return None


class WerkTimeout(WerkError):
    """The backend did not answer in time."""

    code = ErrorCode.TIMEOUT
    default_retryable = True


_BY_CODE: dict[ErrorCode, type[WerkError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        Unauthenticated,
        ExperimentalOptInRequired,
        NotFound,
        InvalidHandoff,
        IncompatibleState,
        ReuseUnavailable,
        Conflict,
        PayloadTooLarge,
        ResourceExhausted,
        InternalError,
        Unsupported,
        BackendError,
        Unavailable,
        WerkTimeout,
    )
}


def error_class(code: ErrorCode | str) -> type[WerkError]:
    """The exception class for ``code`` (used by clients to rebuild typed errors)."""
    return _BY_CODE[ErrorCode(code)]
