"""The connection to a running ``werk serve``: where it is, the API key, and JSON requests.

Only the standard library: the pack installs into ComfyUI's own environment without pulling
anything in. The API key comes from an environment variable (``WERK_API_KEY``, or one the
"Werk Server" node names) or from a linked input, never from a widget: ComfyUI saves widget
values into the workflow and into every PNG's metadata. :class:`WerkServer` hides the key from
``str``/``repr`` (ComfyUI writes ``str()`` of a failed node's inputs into its error report).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_URL",
    "KEY_VARIABLE",
    "URL_VARIABLE",
    "WerkNodeError",
    "WerkServer",
    "redact",
]

URL_VARIABLE = "WERK_URL"
KEY_VARIABLE = "WERK_API_KEY"
DEFAULT_URL = "http://127.0.0.1:11434"

_TOKEN = re.compile(r"wh_[A-Za-z0-9_\-]+")
_RETRIES = 5


def redact(text: str) -> str:
    """``text`` with every handoff token replaced by ``wh_…`` (nothing a node raises or shows
    may carry one)."""
    return _TOKEN.sub("wh_…", text)


class WerkNodeError(RuntimeError):
    """A request to Werk failed: the server's error code and message (never a token or key).

    :ivar code: Werk's error code (``invalid_handoff``, ``not_found``, …), ``unreachable`` when
        no server answered, ``bad_response`` when the answer was not Werk's.
    :ivar status: the HTTP status, or ``None``.
    """

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        self.code = code
        self.status = status
        super().__init__(redact(f"Werk: {message} ({code})"))


@dataclass(frozen=True)
class WerkServer:
    """A Werk server and the key to use with it.

    :ivar base_url: ``http://host:port`` without a trailing slash.
    :ivar timeout: seconds to wait for one answer (a chat or an image may take long).
    """

    base_url: str
    _key: str | None = field(default=None, repr=False)
    timeout: float = 600.0

    @classmethod
    def from_environment(cls, base_url: str = "", key: str | None = None) -> WerkServer:
        """``base_url`` or ``$WERK_URL`` or ``http://127.0.0.1:11434``; ``key`` or
        ``$WERK_API_KEY`` (none: a server without keys)."""
        url = (base_url or os.environ.get(URL_VARIABLE) or DEFAULT_URL).strip().rstrip("/")
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise WerkNodeError("invalid_request", f"not an http(s) URL: {url!r}")
        if key is None:
            key = os.environ.get(KEY_VARIABLE) or None
        return cls(url, key or None)

    def __str__(self) -> str:
        return f"WerkServer({self.base_url}, key {'set' if self._key else 'not set'})"

    __repr__ = __str__

    def __reduce__(self) -> Any:
        raise TypeError("a Werk server connection (it holds an API key) is not serialised")

    @property
    def has_key(self) -> bool:
        return self._key is not None

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "werk-comfy-nodes"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        headers.update(extra or {})
        return headers

    def url(self, path: str, query: dict[str, str] | None = None) -> str:
        tail = f"?{urllib.parse.urlencode(query)}" if query else ""
        return f"{self.base_url}{path}{tail}"

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        query: dict[str, str] | None = None,
        timeout: float | None = None,
        retry: bool = True,
    ) -> Any:
        """The JSON answer of ``METHOD path``. A ``retryable`` error (``429
        resource_exhausted``: Werk's bounded queues are full) is tried again with a growing
        pause, up to five times; any other error raises :class:`WerkNodeError` at once."""
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers({"Content-Type": "application/json"} if data else None)
        for attempt in range(_RETRIES):
            try:
                raw, _ = self._send(method, self.url(path, query), data, headers, timeout)
            except WerkNodeError as exc:
                if retry and exc.status == 429 and attempt + 1 < _RETRIES:
                    time.sleep(0.5 * 2**attempt)
                    continue
                raise
            try:
                return json.loads(raw)
            except ValueError:
                raise WerkNodeError("bad_response", f"{path} did not answer JSON") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def download(self, url: str, timeout: float | None = None) -> tuple[bytes, str]:
        """The bytes and content type at ``url`` (a path on this server or a signed link it
        gave)."""
        if url.startswith("/"):
            url = self.base_url + url
        return self._send("GET", url, None, self._headers({"Accept": "*/*"}), timeout)

    def _send(
        self,
        method: str,
        url: str,
        data: bytes | None,
        headers: dict[str, str],
        timeout: float | None,
    ) -> tuple[bytes, str]:
        req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as answer:  # noqa: S310
                return answer.read(), answer.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            raise _error_of(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise WerkNodeError(
                "unreachable",
                f"no Werk server answered at {self.base_url} ({reason}); start `werk serve` or "
                f"set {URL_VARIABLE}",
            ) from None


def _error_of(exc: urllib.error.HTTPError) -> WerkNodeError:
    """Werk's error body (``{"error": {"code", "message"}}``, the OpenAI shape on ``/v1``
    carries ``code`` too) as a :class:`WerkNodeError`."""
    try:
        error = json.loads(exc.read()).get("error") or {}
    except (ValueError, AttributeError, OSError):
        error = {}
    code = str(error.get("code") or f"http_{exc.code}")
    message = str(error.get("message") or exc.reason or "request failed")
    if exc.code == 401:
        message += (
            f" (set {KEY_VARIABLE} in ComfyUI's environment, or name a variable in Werk Server)"
        )
    return WerkNodeError(code, message, exc.code)
