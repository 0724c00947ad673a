"""The OpenAI-compatible ``/v1`` requests through the service: model lookup, the runtime held
busy for the exchange, the per-principal cache salt, and image outputs kept as URLs.

The backend answers through its ``werk_openai`` hook; a streamed reply keeps the runtime busy
until the stream is closed (:class:`ContainedStream`), and its failures are contained like
``call_operation``'s.
"""

from __future__ import annotations

import base64
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio

from ..backends import OpenAICall, OpenAIReply, OpenAIRoute, Operation
from ..protocol import BackendError, InvalidRequest, RuntimeEnded, Unsupported, WerkError
from ..protocol.residency import parse_keep_alive
from ..state.principals import cache_salt
from .context import ServiceContext
from .runtimes import KeepAlive

__all__ = ["ContainedStream", "OpenAIRequests"]

log = logging.getLogger("werk.control")


class OpenAIRequests:
    """The ``/v1`` side of :class:`~werk.control.service.LocalControlService`."""

    def __init__(self, service: ServiceContext) -> None:
        self._service = service
        self._cache_salts: dict[str, str] = {}  # principal → its salt (one HMAC, not per request)

    async def models(self) -> dict[str, Any]:
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": s.id, "object": "model", "created": created, "owned_by": s.backend}
                for s in self._service.served()
            ],
        }

    async def request(
        self,
        principal: str,
        route: OpenAIRoute,
        body: dict[str, Any],
        *,
        started: Callable[[], Awaitable[None]] | None = None,
    ) -> OpenAIReply:
        """One ``/v1`` request; ``started`` is awaited once the model's runtime is up, before
        the backend is called (a job's ``loading`` → ``running``)."""
        service = self._service
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' is required and must be a string")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise InvalidRequest("'stream' must be a boolean")
        keep_alive = None
        if "keep_alive" in body:  # Werk's (Ollama's) field: never forwarded to the backend
            body = dict(body)
            keep_alive = KeepAlive(parse_keep_alive(body.pop("keep_alive")))
        spec = service.spec(model)
        descriptor = service.pm.backends[spec.backend]
        if route not in descriptor.routes:
            raise Unsupported(
                f"model {model!r} (backend {spec.backend!r}) does not serve "
                f"/v1/{route.replace('.', '/')}"
            )
        call = OpenAICall(
            route=route, body=body, stream=stream, cache_salt=self._cache_salt(principal)
        )
        use = await service.runtimes.use(spec)
        try:
            if started is not None:
                await started()
            try:
                reply: OpenAIReply = await service.pm.call_operation(
                    Operation.OPENAI, use.runtime, call=call
                )
            except RuntimeEnded as ended:  # nothing was sent: once more, on a fresh runtime
                log.info("model %s: %s; sending the request to a new runtime", model, ended)
                use.release(keep_alive)
                use = await service.runtimes.use(spec)
                reply = await service.pm.call_operation(Operation.OPENAI, use.runtime, call=call)
        except BaseException:
            use.release(keep_alive)
            raise
        if reply.stream is not None:  # busy until the stream is closed
            return OpenAIReply(
                stream=ContainedStream(
                    reply.stream, spec.backend, on_close=lambda: use.release(keep_alive)
                )
            )
        use.release(keep_alive)
        if route in ("images.generations", "images.edits") and body.get("response_format") == "url":
            return await self._images_by_url(principal, route, body, reply)
        return reply

    def _cache_salt(self, principal: str) -> str:
        salt = self._cache_salts.get(principal)
        if salt is None:  # principals are bounded by the configured API keys
            key = self._service.config.namespace_key
            salt = self._cache_salts[principal] = cache_salt(key, principal)
        return salt

    async def _images_by_url(
        self, principal: str, route: OpenAIRoute, body: dict[str, Any], reply: OpenAIReply
    ) -> OpenAIReply:
        """``response_format: url``: each image is kept as a finished job's output (private to
        the caller, listed in ``/v1/jobs``, bounded by the job retention, purged by
        ``werk cache``) and answered as ``{"url": "/v1/outputs/…"}``."""
        items = (reply.body or {}).get("data") or []
        urls = []
        for item in items:
            encoded = item.get("b64_json") if isinstance(item, dict) else None
            if not isinstance(encoded, str):
                raise BackendError("the backend answered the image request without an image")
            record = await anyio.to_thread.run_sync(
                functools.partial(
                    self._service.job_store.create_finished,
                    principal,
                    route,
                    {k: v for k, v in body.items() if k != "image_b64"},
                    base64.b64decode(encoded),
                    "image/png",
                )
            )
            assert record.output is not None
            urls.append({"url": record.output.url})
        return OpenAIReply(body={**(reply.body or {}), "data": urls})


class ContainedStream:
    """A backend's streamed ``/v1`` reply, its failures contained like ``call_operation``'s.

    The stream is consumed after ``call_operation`` returned, so a plain exception raised by the
    plugin mid-stream would otherwise surface as ``internal`` (a Werk bug). It becomes
    ``backend_error`` with Werk's own summary; the plugin's text goes only to the server log.
    :meth:`aclose` closes the plugin's iterator exactly once; the HTTP layer calls it when the
    reply ends, fails or the client goes away, so plugins can rely on their ``aclose()``.
    """

    def __init__(
        self,
        stream: AsyncIterator[bytes],
        backend: str,
        *,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._stream = stream
        self._take: Callable[[], list[bytes]] | None = getattr(stream, "take_ready", None)
        self._backend = backend
        self._on_close = on_close
        self._closed = False

    def __aiter__(self) -> ContainedStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._stream.__anext__()
        except (StopAsyncIteration, WerkError):
            raise
        except Exception:
            raise self._failed() from None

    def take_ready(self) -> list[bytes]:
        """The payloads the backend's stream has at hand without waiting (``[]`` when it
        cannot say: its ``take_ready`` is optional)."""
        if self._take is None:
            return []
        try:
            ready = self._take()
        except WerkError:
            raise
        except Exception:
            raise self._failed() from None
        return ready

    def _failed(self) -> BackendError:
        log.exception("the streamed reply of backend %r failed", self._backend)
        return BackendError(f"backend {self._backend!r} failed while streaming its reply")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            aclose = getattr(self._stream, "aclose", None)
            if aclose is not None:
                await aclose()
        except Exception:
            log.exception("closing the streamed reply of backend %r failed", self._backend)
        finally:
            if self._on_close is not None:
                self._on_close()
