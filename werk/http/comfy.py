"""A ComfyUI-compatible API on Werk's image and speech models: scripts and tools written for
ComfyUI's API queue the standard text-to-image graph (or its image-to-image variant), or the
speech graph (``WerkTextToSpeech`` → ``SaveAudio``, run as a durable Werk job), against
``werk serve``.

Checked against Comfy-Org/ComfyUI 0.3.64 (``server.py``, ``execution.py``) and the
``comfy-api-simplified`` 1.6.0 client. Every route is served at ``/X`` and ``/api/X``:

* ``POST prompt`` ``{prompt, client_id?}`` → ``{prompt_id, number, node_errors: {}}``; a graph
  Werk does not run is ``400 {error, node_errors}`` (``comfy_graph.py`` lists the classes).
  Prompts of one API key run one after another; each image is a Werk image request whose PNG is
  kept as a finished job's output (private to the key, listed in ``/v1/jobs``).
* ``GET history[/{id}]``, ``GET queue`` / ``POST queue`` (``clear``, ``delete``), ``POST
  interrupt``, ``GET view?filename=&type=output|input``, ``POST upload/image`` (multipart
  ``image``), ``GET object_info[/{class}]``, ``GET system_stats`` (Werk's host telemetry), ``POST
  free`` (``unload_models``: unloads the image models, through Werk's residency).
* ``/ws?clientId=``: ``status`` on connect, then for the key's prompts queued with that
  ``client_id``: ``execution_start``, ``execution_cached``, ``executing`` per node, ``progress``
  per image, ``executed`` with the saved images, ``execution_success`` (or
  ``execution_error``/``execution_interrupted``) and ``executing {node: null}`` last.

History, queue and uploads are kept in memory per API key (bounded); the images themselves are
durable job outputs. Another key sees none of it: not the history, not the outputs, not the
websocket events, even with the same ``client_id``.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import platform
import secrets
import struct
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import msgspec
from anyio.streams.memory import MemoryObjectSendStream
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from .._version import __version__
from ..control.interface import WerkControl
from ..protocol import (
    TERMINAL_JOB_STATUSES,
    BackendError,
    InvalidRequest,
    JobStatus,
    NotFound,
    ResidencyRequest,
    WerkError,
    encode,
)
from ..protocol.media import (
    IMAGE_SIDE_MAX,
    IMAGE_SIDE_MIN,
    MAX_IMAGE_UPLOAD_BYTES,
    MAX_SEED,
    SpeechRequest,
)
from .auth import Authenticator
from .comfy_graph import GraphRefused, SavePlan, SpeechPlan, object_info, plan_graph
from .errors import error_response, to_werk_error
from .guard import admit_tool_client
from .requests import decode_body, read_body, read_form

__all__ = ["comfy_routes"]

MAX_HISTORY = 200
MAX_UPLOADS = 32
MAX_PROMPT_BYTES = 1024 * 1024
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")


@dataclass
class _Prompt:
    id: str
    number: int
    graph: dict[str, Any]
    client_id: str | None
    plans: list[SavePlan | SpeechPlan]
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    messages: list[list[Any]] = field(default_factory=list)
    status: str | None = None  # None while queued or running; "success" | "error"
    scope: anyio.CancelScope | None = None

    def item(self) -> list[Any]:
        """ComfyUI's queue/history tuple: number, id, graph, extra data, output node ids."""
        extra = {"client_id": self.client_id} if self.client_id else {}
        return [self.number, self.id, self.graph, extra, [p.node for p in self.plans]]


@dataclass
class _Key:
    """One API key's prompts, uploads and websocket listeners."""

    lane: anyio.Lock = field(default_factory=anyio.Lock)
    prompts: OrderedDict[str, _Prompt] = field(default_factory=OrderedDict)
    uploads: OrderedDict[str, bytes] = field(default_factory=OrderedDict)
    listeners: dict[str, list[MemoryObjectSendStream[dict[str, Any]]]] = field(default_factory=dict)
    running: _Prompt | None = None

    def queued(self) -> list[_Prompt]:
        return [p for p in self.prompts.values() if p.status is None and p is not self.running]


class ComfyApi:
    def __init__(self, control: WerkControl) -> None:
        self.control = control
        self.keys: dict[str, _Key] = {}
        self.numbers = itertools.count()

    def key(self, principal: str) -> _Key:
        return self.keys.setdefault(principal, _Key())

    def send(self, key: _Key, prompt: _Prompt, kind: str, data: dict[str, Any]) -> None:
        data = {**data, "prompt_id": prompt.id}
        if kind.startswith("execution_"):
            prompt.messages.append([kind, {**data, "timestamp": int(time.time() * 1000)}])
        if prompt.client_id is None:
            return
        for stream in key.listeners.get(prompt.client_id, []):
            # a slow or gone listener misses events; the history has the outcome
            with contextlib.suppress(
                anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError
            ):
                stream.send_nowait({"type": kind, "data": data})

    # -- submission and execution ---------------------------------------------------------

    async def submit(self, principal: str, body: dict[str, Any]) -> tuple[_Prompt, _Key]:
        graph = body.get("prompt")
        client_id = body.get("client_id")
        if not isinstance(graph, dict):
            raise GraphRefused(
                {"type": "invalid_prompt", "message": "'prompt' must be a graph object",
                 "details": "", "extra_info": {}}
            )  # fmt: skip
        key = self.key(principal)
        models = [m.id for m in await self.control.image_models()]
        speakers = await self.control.speech_models()
        plans = plan_graph(graph, models, list(key.uploads), speakers)
        prompt = _Prompt(
            id=str(uuid.uuid4()),
            number=next(self.numbers),
            graph=graph,
            client_id=str(client_id) if client_id is not None else None,
            plans=plans,
        )
        key.prompts[prompt.id] = prompt
        while len(key.prompts) > MAX_HISTORY:
            oldest = next(iter(key.prompts.values()))
            if oldest.status is None:
                break  # never drop one that still has to run
            key.prompts.popitem(last=False)
        return prompt, key

    async def run(self, principal: str, key: _Key, prompt: _Prompt) -> None:
        async with key.lane:
            if prompt.status is not None or prompt.id not in key.prompts:
                return  # deleted or cleared from the queue meanwhile
            key.running = prompt
            self.send(key, prompt, "execution_start", {})
            self.send(key, prompt, "execution_cached", {"nodes": []})
            try:
                with anyio.CancelScope() as scope:
                    prompt.scope = scope
                    for plan in prompt.plans:
                        if isinstance(plan, SpeechPlan):
                            await self._speak(principal, key, prompt, plan)
                        else:
                            await self._save(principal, key, prompt, plan)
                    prompt.status = "success"
                    self.send(key, prompt, "execution_success", {})
                if prompt.status is None:
                    prompt.status = "error"
                    self.send(key, prompt, "execution_interrupted", {"node_id": None})
            except Exception as exc:  # the prompt failed; the server goes on
                error = to_werk_error(exc, prompt.id)  # unexpected ones logged, told generically
                prompt.status = "error"
                self.send(
                    key, prompt, "execution_error",
                    {"node_id": None, "node_type": None, "exception_type": error.code.value,
                     "exception_message": error.message, "traceback": []},
                )  # fmt: skip
            finally:
                key.running = None
                self.send(key, prompt, "executing", {"node": None})

    async def _save(self, principal: str, key: _Key, prompt: _Prompt, plan: SavePlan) -> None:
        for node in plan.order[:-1]:
            if node != plan.sampler:
                self.send(key, prompt, "executing", {"node": node, "display_node": node})
        self.send(key, prompt, "executing", {"node": plan.sampler, "display_node": plan.sampler})
        image = key.uploads.get(plan.upload) if plan.upload else None
        width, height = _size(image) if image is not None else (plan.width, plan.height)
        saved = []
        for index in range(plan.count):
            route, body = _request(plan, (plan.seed + index) % (MAX_SEED + 1), width, height)
            if image is not None:
                body["image_b64"] = base64.b64encode(image).decode("ascii")
                body["strength"] = plan.strength
            reply = await self.control.openai_request(principal, route, body)
            url = str((reply.body or {})["data"][0]["url"])
            saved.append({"filename": url.rsplit("/", 1)[1] + ".png", "subfolder": "",
                          "type": "output"})  # fmt: skip
            progress = {"value": index + 1, "max": plan.count, "node": plan.sampler}
            self.send(key, prompt, "progress", progress)
        self._saved(key, prompt, plan.node, {"images": saved})

    def _saved(self, key: _Key, prompt: _Prompt, node: str, output: dict[str, Any]) -> None:
        """An output node ran: its ``executing`` and ``executed`` events, its history entry."""
        self.send(key, prompt, "executing", {"node": node, "display_node": node})
        prompt.outputs[node] = output
        self.send(key, prompt, "executed", {"node": node, "display_node": node, "output": output})

    async def _speak(self, principal: str, key: _Key, prompt: _Prompt, plan: SpeechPlan) -> None:
        """A speech request as a durable Werk job, awaited (ComfyUI's speech nodes run
        asynchronously as well)."""
        self.send(key, prompt, "executing", {"node": plan.speaker, "display_node": plan.speaker})
        asked = {"model": plan.model, "input": plan.text, "voice": plan.voice, "seed": plan.seed}
        request = decode_body(encode(asked), SpeechRequest)
        request.validate()
        body = msgspec.to_builtins(request)
        body.pop("async", None)
        job = await self.control.submit_job(principal, "audio.speech", body)
        try:
            while job.status not in TERMINAL_JOB_STATUSES:
                await anyio.sleep(0.1)
                job = await self.control.job(principal, job.id)
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(WerkError):
                await self.control.cancel_job(principal, job.id)  # interrupted: not left running
            raise
        if job.status is not JobStatus.COMPLETED or job.output is None:
            message = job.error.message if job.error is not None else f"the job {job.status}"
            raise BackendError(f"speech job {job.id}: {message}")
        saved = [{"filename": job.output.id + ".wav", "subfolder": "", "type": "output"}]
        self._saved(key, prompt, plan.node, {"audio": saved})

    # -- reading ------------------------------------------------------------------------------

    def history(self, principal: str, prompt_id: str | None, limit: int | None) -> dict[str, Any]:
        key = self.key(principal)
        done = [p for p in key.prompts.values() if p.status is not None]
        if prompt_id is not None:
            done = [p for p in done if p.id == prompt_id]
        if limit is not None:
            done = done[-limit:]
        return {
            p.id: {
                "prompt": p.item(),
                "outputs": p.outputs,
                "status": {
                    "status_str": p.status,
                    "completed": p.status == "success",
                    "messages": p.messages,
                },
                "meta": {
                    node: {
                        "node_id": node,
                        "display_node": node,
                        "parent_node": None,
                        "real_node_id": node,
                    }
                    for node in p.outputs
                },
            }
            for p in done
        }

    def queue(self, principal: str) -> dict[str, Any]:
        key = self.key(principal)
        running = [key.running.item()] if key.running is not None else []
        return {"queue_running": running, "queue_pending": [p.item() for p in key.queued()]}

    def remaining(self, key: _Key) -> int:
        return len(key.queued()) + (1 if key.running is not None else 0)


def _request(plan: SavePlan, seed: int, width: int, height: int) -> tuple[Any, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": plan.model,
        "prompt": plan.prompt or " ",
        "negative_prompt": plan.negative or None,
        "n": 1,
        "size": f"{width}x{height}",
        "seed": seed,
        "steps": plan.steps,
        "guidance_scale": plan.cfg,
        "response_format": "url",
    }
    return ("images.edits" if plan.upload else "images.generations"), body


def _size(image: bytes) -> tuple[int, int]:
    """An uploaded PNG's size (sides rounded down to Werk's multiples of 8); 512×512 else."""
    if not image.startswith(_IMAGE_MAGIC[0]) or len(image) < 24:
        return 512, 512
    width, height = struct.unpack(">II", image[16:24])

    def side(value: int) -> int:
        return int(max(IMAGE_SIDE_MIN, min(IMAGE_SIDE_MAX, value - value % 8)))

    return side(width), side(height)


def _json(value: Any, status: int = 200, background: BackgroundTask | None = None) -> Response:
    return Response(encode(value), status, media_type="application/json", background=background)


def comfy_routes(control: WerkControl, auth: Authenticator) -> list[BaseRoute]:
    """The ComfyUI-compatible routes, each at ``/X`` and ``/api/X``."""
    api = ComfyApi(control)
    Handler = Callable[[Request, str], Awaitable[Response]]

    def route(path: str, handler: Handler, method: str) -> list[BaseRoute]:
        async def run(request: Request) -> Response:
            try:
                principal = admit_tool_client(request, auth)
                return await handler(request, principal)
            except GraphRefused as refused:
                return _json({"error": refused.error, "node_errors": refused.node_errors}, 400)
            except Exception as exc:
                return error_response(request, exc)

        return [Route(prefix + path, run, methods=[method]) for prefix in ("", "/api")]

    async def prompt(request: Request, principal: str) -> Response:
        body = decode_body(
            await read_body(request, MAX_PROMPT_BYTES, json_only=False), dict[str, Any]
        )
        queued, key = await api.submit(principal, body)
        answer = {"prompt_id": queued.id, "number": queued.number, "node_errors": {}}
        return _json(answer, background=BackgroundTask(api.run, principal, key, queued))

    async def history(request: Request, principal: str) -> Response:
        wanted = request.path_params.get("prompt_id")
        limit = request.query_params.get("max_items")
        count = int(limit) if limit and limit.isdigit() else None
        return _json(api.history(principal, wanted, count))

    async def queue(request: Request, principal: str) -> Response:
        return _json(api.queue(principal))

    async def change_queue(request: Request, principal: str) -> Response:
        body = decode_body(await read_body(request, 64 * 1024, json_only=False), dict[str, Any])
        key = api.key(principal)
        doomed = [p.id for p in key.queued()] if body.get("clear") else []
        doomed += [str(i) for i in body.get("delete") or [] if str(i) in key.prompts]
        for prompt_id in doomed:
            if key.prompts[prompt_id].status is None and key.prompts[prompt_id] is not key.running:
                del key.prompts[prompt_id]
        return Response(status_code=200)

    async def interrupt(request: Request, principal: str) -> Response:
        running = api.key(principal).running
        if running is not None and running.scope is not None:
            running.scope.cancel()
        return Response(status_code=200)

    async def view(request: Request, principal: str) -> Response:
        name = request.query_params.get("filename", "")
        kind = request.query_params.get("type", "output")
        if kind == "input":
            data = api.key(principal).uploads.get(name)
            if data is None:
                raise NotFound("no such file")
            media = "image/png" if data.startswith(_IMAGE_MAGIC[0]) else "image/jpeg"
            return Response(data, 200, media_type=media)
        stem, dot, suffix = name.rpartition(".")
        if kind != "output" or not dot or suffix not in ("png", "wav"):
            raise NotFound("no such file")
        data, media = await control.job_output(principal, stem)
        return Response(data, 200, media_type=media)

    async def upload(request: Request, principal: str) -> Response:
        form = await read_form(request, MAX_IMAGE_UPLOAD_BYTES + 64 * 1024)
        upload = form.get("image")
        if upload is None or isinstance(upload, str):
            raise InvalidRequest("'image' (a PNG or JPEG upload) is required")
        data = await upload.read()
        subfolder = str(form.get("subfolder") or "")
        await form.close()
        if not data.startswith(_IMAGE_MAGIC) or len(data) > MAX_IMAGE_UPLOAD_BYTES:
            raise InvalidRequest("'image' must be a PNG or JPEG of at most 16 MiB")
        base = (upload.filename or "upload.png").replace("/", "_")
        name = f"{subfolder}/{base}" if subfolder else base
        key = api.key(principal)
        key.uploads[name] = data
        key.uploads.move_to_end(name)
        while len(key.uploads) > MAX_UPLOADS:
            key.uploads.popitem(last=False)
        return _json({"name": base, "subfolder": subfolder, "type": "input"})

    async def info(request: Request, principal: str) -> Response:
        models = [m.id for m in await control.image_models()]
        speakers = await control.speech_models()
        classes = object_info(models, list(api.key(principal).uploads), speakers)
        wanted = request.path_params.get("node_class")
        if wanted is None:
            return _json(classes)
        return _json({wanted: classes[wanted]} if wanted in classes else {})

    async def stats(request: Request, principal: str) -> Response:
        host = (await control.memory()).host
        return _json(
            {
                "system": {
                    "os": sys.platform,
                    "ram_total": host.total_bytes if host else 0,
                    "ram_free": host.available_bytes if host else 0,
                    "comfyui_version": f"werk {__version__}",
                    "python_version": platform.python_version(),
                    "pytorch_version": "",
                    "embedded_python": False,
                    "argv": [],
                },
                "devices": [],
            }
        )

    async def free(request: Request, principal: str) -> Response:
        body = decode_body(await read_body(request, 64 * 1024, json_only=False), dict[str, Any])
        if body.get("unload_models"):
            for model in await control.image_models():
                with contextlib.suppress(WerkError):  # busy or not loaded: Werk's rules keep it
                    await control.set_residency(model.id, ResidencyRequest(), resident=False)
        return Response(status_code=200)

    async def websocket(socket: WebSocket) -> None:
        try:
            principal = admit_tool_client(socket, auth)  # headers and Host, as for requests
        except WerkError:
            await socket.close(code=1008)
            return
        client_id = socket.query_params.get("clientId") or secrets.token_hex(16)
        key = api.key(principal)
        send, receive = anyio.create_memory_object_stream[dict[str, Any]](256)
        key.listeners.setdefault(client_id, []).append(send)
        await socket.accept()
        try:
            status = {"status": {"exec_info": {"queue_remaining": api.remaining(key)}},
                      "sid": client_id}  # fmt: skip
            await socket.send_text(json.dumps({"type": "status", "data": status}))
            async with anyio.create_task_group() as group:

                async def forward() -> None:
                    async with receive:
                        async for message in receive:
                            await socket.send_text(json.dumps(message))

                group.start_soon(forward)
                try:
                    while True:
                        await socket.receive_text()
                except WebSocketDisconnect:
                    pass
                group.cancel_scope.cancel()
        finally:
            key.listeners[client_id].remove(send)
            if not key.listeners[client_id]:
                del key.listeners[client_id]
            await send.aclose()

    return [
        *route("/prompt", prompt, "POST"),
        *route("/history", history, "GET"),
        *route("/history/{prompt_id}", history, "GET"),
        *route("/queue", queue, "GET"),
        *route("/queue", change_queue, "POST"),
        *route("/interrupt", interrupt, "POST"),
        *route("/view", view, "GET"),
        *route("/upload/image", upload, "POST"),
        *route("/object_info", info, "GET"),
        *route("/object_info/{node_class}", info, "GET"),
        *route("/system_stats", stats, "GET"),
        *route("/free", free, "POST"),
        WebSocketRoute("/ws", websocket),
        WebSocketRoute("/api/ws", websocket),
    ]
