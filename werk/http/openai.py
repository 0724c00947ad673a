"""OpenAI-compatible ``/v1`` routes, delegated to the model's backend.

Errors use the OpenAI error shape (see :mod:`werk.http.errors`). Streaming replies are relayed
as Server-Sent Events as the backend produces them, ending with ``data: [DONE]``; an error after
the stream started is sent as a final ``data: {"error": …}`` event (the status line is gone).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import logging
import wave
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..backends import OpenAIReply
from ..control.chat_states import chat_state_options
from ..control.interface import WerkControl
from ..protocol import (
    BackendError,
    InvalidRequest,
    JobDeleted,
    JobRecord,
    JobRequest,
    NotFound,
    Unsupported,
    encode,
)
from ..protocol.media import (
    MAX_AUDIO_BYTES,
    MAX_AUDIO_SECONDS,
    MAX_IMAGE_UPLOAD_BYTES,
    ClassificationRequest,
    ImageEditRequest,
    ImageGenerationRequest,
    SpeechRequest,
    TranscriptionRequest,
)
from ..protocol.paging import decode_cursor, page_after, parse_limit
from .auth import Authenticator
from .errors import error_response, to_werk_error
from .guard import admit
from .persisted_chat import PersistedTurnStream
from .requests import decode_body, read_form, read_object, read_struct

__all__ = ["openai_routes"]

OPENAI_BODY = 32 * 1024 * 1024
MEDIA_REQUEST_BODY = 64 * 1024


async def _aclose(stream: AsyncIterator[bytes]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()


class ClosingStreamingResponse(StreamingResponse):
    """A streamed reply that always closes the backend's iterator when the exchange ends:
    completed, failed, or abandoned by the client (even before the first chunk was read).

    The relay runs in the request's own task and the wait for the client's disconnect in a
    second one (Starlette starts the relay in a new task: one more event-loop pass before
    the first byte: 0.16 instead of 0.08 ms from the route's response to the first send, timed
    in an instrumented server). A client that leaves cancels the relay; a relay that fails
    cancels the watcher. Plain asyncio tasks, not an anyio task group: the group's cancel
    scopes were about a tenth of ``werk serve``'s CPU time for a short streamed chat
    (``py-spy record --gil``, against an upstream that answers at once)."""

    def __init__(self, source: AsyncIterator[bytes], request_id: str) -> None:
        self._source = source
        super().__init__(
            _sse(source, request_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._relay(receive, send)
        finally:
            await _aclose(self._source)

    async def _relay(self, receive: Receive, send: Send) -> None:
        relay = asyncio.current_task()
        assert relay is not None
        complete = left = False

        async def until_disconnect() -> None:
            nonlocal left
            await self.listen_for_disconnect(receive)
            if not complete:
                left = True
                relay.cancel()

        watcher = asyncio.get_running_loop().create_task(until_disconnect())
        try:
            await self.stream_response(send)
            # The watcher ends by itself: once the last body part is sent, the server answers
            # its pending receive with http.disconnect (uvicorn does).
            complete = True
        except asyncio.CancelledError:
            if left and relay.uncancel() == 0:  # the client left: nobody to answer
                return
            raise
        finally:
            if not complete:
                watcher.cancel()


def _sse(stream: AsyncIterator[bytes], request_id: str) -> AsyncIterator[bytes]:
    take_ready: Callable[[], list[bytes]] | None = getattr(stream, "take_ready", None)

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for payload in stream:
                more = take_ready() if take_ready is not None else None
                if more:  # payloads already at hand go out in one write
                    yield b"".join(b"data: " + p + b"\n\n" for p in (payload, *more))
                else:
                    yield b"data: " + payload + b"\n\n"
        except Exception as exc:
            err = to_werk_error(exc, request_id)
            body = {
                "error": {
                    "message": err.message,
                    "type": "server_error",
                    "code": err.openai_code or err.code.value,
                    "param": err.param,
                }
            }
            yield b"data: " + encode(body) + b"\n\n"
        finally:
            await _aclose(stream)
        yield b"data: [DONE]\n\n"

    return relay()


def _completion_route(
    route: Literal["chat.completions", "completions", "embeddings"],
    control: WerkControl,
    auth: Authenticator,
) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        try:
            principal = admit(request, auth)
            body = await read_object(request, OPENAI_BODY)
            if route == "chat.completions":
                _require_messages(body)
                options = chat_state_options(body)
                if options is not None and options.persist:
                    if body.get("stream") is True:
                        return PersistedTurnStream(
                            request,
                            str(body.get("model")),
                            lambda on_text: control.persisted_chat(
                                principal, body, options, on_text=on_text
                            ),
                        )
                    answer = await control.persisted_chat(principal, body, options)
                    return Response(encode(answer), 200, media_type="application/json")
                body.pop("werk", None)  # Werk's own member: never relayed
            elif route == "embeddings":
                _require_input(body)
            reply = await control.openai_request(principal, route, body)
            if reply.stream is not None:
                request_id = request.scope.get("werk_request_id", "req_unknown")
                return ClosingStreamingResponse(reply.stream, request_id)
            return Response(encode(reply.body), 200, media_type="application/json")
        except Exception as exc:
            return error_response(request, exc)

    return run


def _require_messages(body: dict[str, Any]) -> None:
    """A chat needs at least one message (an empty list made backends generate from nothing,
    thousands of tokens of it)."""
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("'messages' is required", param="messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list of messages", param="messages")


def _require_input(body: dict[str, Any]) -> None:
    """An embeddings request needs ``input`` (a string, or a list of strings or token ids) and
    is never streamed."""
    value = body.get("input")
    if value is None or value == "" or value == []:
        raise InvalidRequest("'input' is required and must not be empty", param="input")
    if not isinstance(value, str | list):
        raise InvalidRequest("'input' must be a string or a list", param="input")
    if body.get("stream"):
        raise InvalidRequest("embeddings are not streamed", param="stream")


MediaRequest = ImageGenerationRequest | SpeechRequest | ClassificationRequest


def _backend_body(parsed: MediaRequest) -> dict[str, Any]:
    """The validated request as the backend gets it (every member; ``async`` is Werk's)."""
    body: dict[str, Any] = msgspec.to_builtins(parsed)
    body.pop("async", None)
    return body


_T = TypeVar("_T")
log = logging.getLogger("werk.http")


Linker = Callable[[str], str]
"""Turns an output's relative URL into the absolute, signed link for this request's caller."""


def _linker(request: Request, principal: str, auth: Authenticator) -> Linker:
    return functools.partial(auth.links.absolute, request, principal)


def _linked(record: JobRecord, link: Linker) -> JobRecord:
    """``record`` with its output's URL as a signed, absolute link."""
    if record.output is None:
        return record
    output = msgspec.structs.replace(record.output, url=link(record.output.url))
    return msgspec.structs.replace(record, output=output)


def _accepted(record: JobRecord, link: Linker) -> Response:
    return Response(encode(_linked(record, link)), 202, media_type="application/json")


_JOB_REQUESTS: dict[str, type[ImageGenerationRequest] | type[SpeechRequest]] = {
    "images.generations": ImageGenerationRequest,
    "audio.speech": SpeechRequest,
}


def _job_page(request: Request, records: list[JobRecord], link: Linker) -> Response:
    """``GET /v1/jobs``: the caller's jobs, oldest first; ``limit`` (1..1000) and ``cursor``
    cut a page (``has_more``, ``next_cursor``)."""
    unknown = sorted(set(request.query_params) - {"limit", "cursor"})
    if unknown:
        raise InvalidRequest(f"unknown query parameter(s): {', '.join(unknown)}")
    limit = parse_limit(request.query_params.get("limit"))
    after = decode_cursor(request.query_params.get("cursor"))
    page, cursor = page_after(records, _job_key, limit, after)
    page = [_linked(record, link) for record in page]
    body = {"object": "list", "data": page, "has_more": cursor is not None, "next_cursor": cursor}
    return Response(encode(body), 200, media_type="application/json")


def _job_key(record: JobRecord) -> str:
    return f"{record.created_at} {record.id}"  # RFC 3339 with milliseconds: sorts as it reads


def _job_routes(control: WerkControl, auth: Authenticator) -> list[Route]:
    """``/v1/jobs`` (submit, list), ``/v1/jobs/{id}`` (read, cancel), ``/v1/outputs/{id}``."""

    async def submit_or_list(request: Request) -> Response:
        try:
            principal = admit(request, auth)
            link = _linker(request, principal, auth)
            if request.method == "GET":
                return _job_page(request, await control.jobs(principal), link)
            job = await read_struct(request, JobRequest, MEDIA_REQUEST_BODY)
            parsed = decode_body(msgspec.json.encode(job.request), _JOB_REQUESTS[job.kind])
            parsed.validate()
            record = await control.submit_job(principal, job.kind, _backend_body(parsed))
            return _accepted(record, link)
        except Exception as exc:
            return error_response(request, exc)

    async def one(request: Request) -> Response:
        try:
            principal = admit(request, auth)
            job_id = request.path_params["job_id"]
            answer: JobRecord | JobDeleted
            if request.method == "DELETE":
                answer = await control.cancel_job(principal, job_id)
            else:
                answer = await control.job(principal, job_id)
            if isinstance(answer, JobRecord):
                answer = _linked(answer, _linker(request, principal, auth))
            return Response(encode(answer), 200, media_type="application/json")
        except Exception as exc:
            return error_response(request, exc)

    async def output(request: Request) -> Response:
        """An output, for its owner's API key or a signed link (:mod:`werk.http.links`)."""
        try:
            output_id = request.path_params["id"]
            principal = auth.links.principal(request, output_id) or admit(request, auth)
            data, content_type = await control.job_output(principal, output_id)
            return Response(data, 200, media_type=content_type)
        except Exception as exc:
            return error_response(request, exc)

    return [
        Route("/v1/jobs", submit_or_list, methods=["GET", "POST"]),
        Route("/v1/jobs/{job_id}", one, methods=["GET", "DELETE"]),
        Route("/v1/outputs/{id}", output, methods=["GET"]),
    ]


def _json_answer(reply: OpenAIReply, link: Linker) -> Response:
    """A JSON reply; an image stored as an output (``response_format: url``) is answered with
    its signed, absolute link."""
    body = reply.body
    data = body.get("data") if isinstance(body, dict) else None
    if isinstance(data, list) and any(isinstance(i, dict) and "url" in i for i in data):
        linked = [
            {**item, "url": link(item["url"])}
            if isinstance(item, dict) and isinstance(item.get("url"), str)
            else item
            for item in data
        ]
        body = {**body, "data": linked}  # type: ignore[dict-item]
    return Response(encode(body), 200, media_type="application/json")


def _file_answer(reply: OpenAIReply, link: Linker) -> Response:
    if reply.content is None or reply.media_type is None:
        raise BackendError("the backend answered without the file it was asked for")
    return Response(reply.content, 200, media_type=reply.media_type)


def _media_route(
    control: WerkControl,
    auth: Authenticator,
    kind: Literal["images.generations", "audio.speech", "classifications"],
    request_type: type[MediaRequest],
    answer: Callable[[OpenAIReply, Linker], Response],
) -> Callable[[Request], Awaitable[Response]]:
    """``POST /v1/images/generations``, ``/v1/audio/speech`` and ``/v1/classifications``:
    validated here (every bound), then to the backend — or, with ``"async": true`` (images and
    speech), queued as a durable job (``202``)."""

    async def run(request: Request) -> Response:
        try:
            principal = admit(request, auth)
            parsed = await read_struct(request, request_type, MEDIA_REQUEST_BODY)
            parsed.validate()
            body = _backend_body(parsed)
            link = _linker(request, principal, auth)
            if getattr(parsed, "as_job", False):
                return _accepted(await control.submit_job(principal, kind, body), link)
            reply = await while_connected(request, control.openai_request(principal, kind, body))
            return answer(reply, link)
        except Exception as exc:
            return error_response(request, exc)

    return run


class ClientGone(InvalidRequest):
    """The client disconnected while its direct request ran; the work was cancelled (nobody
    reads the answer; it is counted as a client error)."""


async def while_connected(request: Request, work: Awaitable[_T]) -> _T:
    """``work``, cancelled as soon as the client disconnects (the request body must have been
    read already). A direct media request whose client gave up must not keep the model's
    worker busy for minutes: the backend's cancellation ends it (the media worker is stopped
    and the next request starts a fresh one). Async jobs do not go through here."""
    outcome: list[_T] = []
    gone = False

    async def run() -> None:
        outcome.append(await work)
        group.cancel_scope.cancel()

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        group.cancel_scope.cancel()

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            await run()
    except BaseExceptionGroup as failed:  # the work failed: raise its own exception
        if len(failed.exceptions) != 1:
            raise
        raise failed.exceptions[0] from None
    if gone and not outcome:
        log.info("%s %s: the client left; its work was cancelled", request.method, request.url.path)
        raise ClientGone("the client disconnected")
    return outcome[0]


def _wav_seconds(data: bytes) -> float:
    """The duration a WAV header declares; ``InvalidRequest`` for anything but PCM WAV."""
    try:
        with wave.open(io.BytesIO(data), "rb") as source:
            rate, frames = source.getframerate(), source.getnframes()
    except (wave.Error, EOFError) as exc:
        raise InvalidRequest(f"'file' must be a WAV file of PCM samples ({exc})") from None
    if rate <= 0:
        raise InvalidRequest("'file' declares no sample rate")
    return frames / rate


def _transcription_route(
    control: WerkControl, auth: Authenticator
) -> Callable[[Request], Awaitable[Response]]:
    """``POST /v1/audio/transcriptions``: a multipart upload (OpenAI's shape), bounded in bytes
    and seconds, answered ``{"text"}`` (or plain text)."""

    async def run(request: Request) -> Response:
        try:
            principal = admit(request, auth)
            form = await read_form(request, MAX_AUDIO_BYTES + 64 * 1024)
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise InvalidRequest("'file' (the audio, a WAV upload) is required")
            audio = await upload.read()
            await form.close()
            fields = {k: v for k, v in form.multi_items() if k != "file"}
            if any(not isinstance(v, str) for v in fields.values()):
                raise InvalidRequest("only 'file' may be a file")
            parsed = decode_body(msgspec.json.encode(_typed(fields)), TranscriptionRequest)
            if len(audio) > MAX_AUDIO_BYTES:
                raise InvalidRequest(f"'file' is over {MAX_AUDIO_BYTES} bytes")
            if _wav_seconds(audio) > MAX_AUDIO_SECONDS:
                raise InvalidRequest(f"'file' is longer than {MAX_AUDIO_SECONDS} seconds")
            body: dict[str, Any] = msgspec.to_builtins(parsed)
            body["audio_b64"] = base64.b64encode(audio).decode("ascii")
            work = control.openai_request(principal, "audio.transcriptions", body)
            reply = await while_connected(request, work)
            text = str((reply.body or {}).get("text", ""))
            if parsed.response_format == "text":
                return Response(text, 200, media_type="text/plain; charset=utf-8")
            return Response(encode({"text": text}), 200, media_type="application/json")
        except Exception as exc:
            return error_response(request, exc)

    return run


_FORM_NUMBERS: dict[str, type[int] | type[float]] = {
    "temperature": float,
    "n": int,
    "seed": int,
    "steps": int,
    "strength": float,
    "guidance_scale": float,
}


def _typed(fields: dict[str, Any]) -> dict[str, Any]:
    """Form values are strings: the numeric ones become numbers for validation."""
    typed = dict(fields)
    for name, kind in _FORM_NUMBERS.items():
        if name in typed:
            try:
                typed[name] = kind(typed[name])
            except ValueError:
                raise InvalidRequest(f"'{name}' must be a number") from None
    return typed


_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")


def _image_edit_route(
    control: WerkControl, auth: Authenticator
) -> Callable[[Request], Awaitable[Response]]:
    """``POST /v1/images/edits``: a multipart upload of one PNG or JPEG (OpenAI's shape),
    image to image; answered like a generation."""

    async def run(request: Request) -> Response:
        try:
            principal = admit(request, auth)
            form = await read_form(request, MAX_IMAGE_UPLOAD_BYTES + 64 * 1024, max_files=2)
            files = {k: v for k, v in form.multi_items() if not isinstance(v, str)}
            if "mask" in files or "mask" in form:
                raise Unsupported("'mask' (inpainting) is not offered; send 'image' alone")
            upload = form.get("image")
            if upload is None or isinstance(upload, str) or set(files) != {"image"}:
                raise InvalidRequest("'image' (one PNG or JPEG upload) is required, alone")
            image = await upload.read()
            await form.close()
            fields = {k: v for k, v in form.multi_items() if k != "image"}
            parsed = decode_body(msgspec.json.encode(_typed(fields)), ImageEditRequest)
            parsed.validate()
            if len(image) > MAX_IMAGE_UPLOAD_BYTES:
                raise InvalidRequest(f"'image' is over {MAX_IMAGE_UPLOAD_BYTES} bytes")
            if not image.startswith(_IMAGE_MAGIC):
                raise InvalidRequest("'image' must be a PNG or JPEG file")
            body: dict[str, Any] = msgspec.to_builtins(parsed)
            body["image_b64"] = base64.b64encode(image).decode("ascii")
            work = control.openai_request(principal, "images.edits", body)
            reply = await while_connected(request, work)
            return _json_answer(reply, _linker(request, principal, auth))
        except Exception as exc:
            return error_response(request, exc)

    return run


def _models_route(
    control: WerkControl, auth: Authenticator
) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        try:
            admit(request, auth)
            listing: dict[str, Any] = await control.openai_models()
            wanted = request.path_params.get("model_id")
            if wanted is None:
                return Response(encode(listing), 200, media_type="application/json")
            for entry in listing["data"]:
                if entry["id"] == wanted:
                    return Response(encode(entry), 200, media_type="application/json")
            raise NotFound(f"model {wanted!r} is not served here", param="model")
        except Exception as exc:
            return error_response(request, exc)

    return run


def openai_routes(control: WerkControl, auth: Authenticator) -> list[Route]:
    return [
        Route("/v1/models", _models_route(control, auth), methods=["GET"]),
        Route("/v1/models/{model_id}", _models_route(control, auth), methods=["GET"]),
        Route(
            "/v1/chat/completions",
            _completion_route("chat.completions", control, auth),
            methods=["POST"],
        ),
        Route("/v1/completions", _completion_route("completions", control, auth), methods=["POST"]),
        Route("/v1/embeddings", _completion_route("embeddings", control, auth), methods=["POST"]),
        Route(
            "/v1/images/generations",
            _media_route(control, auth, "images.generations", ImageGenerationRequest, _json_answer),
            methods=["POST"],
        ),
        Route(
            "/v1/audio/speech",
            _media_route(control, auth, "audio.speech", SpeechRequest, _file_answer),
            methods=["POST"],
        ),
        Route("/v1/images/edits", _image_edit_route(control, auth), methods=["POST"]),
        Route("/v1/audio/transcriptions", _transcription_route(control, auth), methods=["POST"]),
        Route(
            "/v1/classifications",
            _media_route(control, auth, "classifications", ClassificationRequest, _json_answer),
            methods=["POST"],
        ),
        *_job_routes(control, auth),
    ]
