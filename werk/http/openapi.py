"""The OpenAPI 3.1 document of ``/werk/v1`` (generated from the msgspec Structs) and of the
OpenAI-compatible ``/v1`` routes Werk serves (what Werk itself checks; the rest of a body is
the backend's to validate).

msgspec describes each field; the few rules that span fields (a Struct's ``__post_init__``:
"exactly one of …") are added from :data:`_CROSS_FIELD`, so a request that validates against
the document is one the server accepts (schemathesis checks exactly that).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from .._version import PROTOCOL_VERSION, __version__
from ..protocol import (
    ErrorBody,
    JobRecord,
    JobRequest,
    PrefillRequest,
    PruneFilter,
    PruneRequest,
)
from ..protocol.media import (
    IMAGE_SIZE_PATTERN,
    ClassificationRequest,
    ImageGenerationRequest,
    SpeechRequest,
)
from ..protocol.prefill import ModelId
from .routes import ROUTE_SPECS

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{name}"
_PARAM = re.compile(r"{([a-z_]+)}")

_MODEL_ID = msgspec.json.schema(ModelId)

_CURSOR = r"^c1\.([A-Za-z0-9_-]{4})*([A-Za-z0-9_-]{2,3})?$"
"""A cursor from a previous page (opaque; :mod:`werk.protocol.paging`)."""

_QUERY: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "/werk/v1/capabilities": [("model", _MODEL_ID)],
    "/werk/v1/states": [
        ("model", _MODEL_ID),
        ("tier", {"enum": ["backend", "ram", "vram", "disk"]}),
        ("pinned", {"enum": ["true", "false"]}),
        ("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
        ("cursor", {"type": "string", "maxLength": 512, "pattern": _CURSOR}),
    ],
    "/werk/v1/experts": [("model", _MODEL_ID)],
}

_NULL = {"type": "null"}


def _present(name: str, schema: dict[str, Any], *absent: str) -> dict[str, Any]:
    """``name`` present and matching ``schema``; each of ``absent`` missing or null."""
    return {
        "required": [name],
        "properties": {name: schema, **{other: _NULL for other in absent}},
    }


_CROSS_FIELD: dict[type, dict[str, Any]] = {
    PrefillRequest: {
        "oneOf": [
            _present("prompt", {"type": "string"}, "messages"),
            _present("messages", {"type": "array"}, "prompt"),
        ]
    },
    PruneFilter: {
        "anyOf": [
            _present(name, {"not": _NULL})
            for name in ("model", "tier", "older_than_seconds", "expired")
        ]
    },
    PruneRequest: {
        "oneOf": [
            _present("ids", {"type": "array"}, "filter", "all", "confirm"),
            _present("filter", {"type": "object"}, "ids", "all", "confirm"),
            {
                "required": ["all", "confirm"],
                "properties": {
                    "all": {"const": True},
                    "confirm": {"const": "all"},
                    "ids": _NULL,
                    "filter": _NULL,
                },
            },
        ]
    },
    ImageGenerationRequest: {"properties": {"size": {"pattern": IMAGE_SIZE_PATTERN}}},
    SpeechRequest: {"properties": {"response_format": {"enum": ["wav"]}}},
    JobRequest: {
        "oneOf": [
            {
                "properties": {
                    "kind": {"const": kind},
                    "request": {"$ref": _REF.format(name=struct.__name__)},
                }
            }
            for kind, struct in (
                ("images.generations", ImageGenerationRequest),
                ("audio.speech", SpeechRequest),
            )
        ]
    },
}
"""The rules request Structs check beyond their types (``__post_init__``, ``validate()``), in
JSON Schema: merged into the Structs' generated schemas."""


def _merge(schema: dict[str, Any], rule: dict[str, Any]) -> None:
    """Merge ``rule`` into ``schema``: ``properties`` member by member, the rest replaced."""
    for key, value in rule.items():
        if key == "properties":
            for name, extra in value.items():
                schema.setdefault("properties", {}).setdefault(name, {}).update(extra)
        else:
            schema[key] = value


_OPENAI_ERROR = {
    "description": "OpenAI-shaped error (Werk's own message; backend error bodies are never "
    "forwarded)",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["error"],
                "properties": {
                    "error": {
                        "type": "object",
                        "required": ["message", "type", "code"],
                        "properties": {
                            "message": {"type": "string"},
                            "type": {"type": "string"},
                            "code": {"type": "string"},
                            "param": {"type": ["string", "null"]},
                        },
                    }
                },
            }
        }
    },
}


def _openai_body(required: str, schema: dict[str, Any]) -> dict[str, Any]:
    """What Werk itself checks in a ``/v1`` completion body; every other member goes to the
    model's backend unchanged, which validates it (its refusal is a Werk error)."""
    return {
        "type": "object",
        "required": ["model", required],
        "properties": {
            "model": {**_MODEL_ID, "description": "a model this server serves"},
            required: schema,
            "stream": {"type": "boolean", "default": False},
        },
        "additionalProperties": True,
    }


def _media_paths(
    image: dict[str, Any], speech: dict[str, Any], classify: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The media routes: bodies validated by Werk (``image``/``speech``/``classify`` are the
    request schemas' references); a transcription is a multipart upload."""

    def post(summary: str, op_id: str, body: dict[str, Any], ok: dict[str, Any]) -> Any:
        return {
            "post": {
                "summary": summary,
                "operationId": op_id,
                "tags": ["openai"],
                "security": [{"bearer": []}],
                "requestBody": {"required": True, "content": body},
                "responses": {"200": ok, "default": _OPENAI_ERROR},
            }
        }

    images = {
        "description": "The images: base64-encoded PNG, or the URL of a stored output with "
        "`response_format: url` (OpenAI shape)",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["created", "data"],
                    "properties": {
                        "created": {"type": "integer"},
                        "data": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "b64_json": {"type": "string"},
                                    "url": {"type": "string"},
                                },
                            },
                        },
                    },
                }
            }
        },
    }
    audio = {
        "description": "The audio file (WAV, 16-bit PCM)",
        "content": {"audio/wav": {"schema": {"type": "string", "format": "binary"}}},
    }
    form = {
        "type": "object",
        "required": ["file", "model"],
        "properties": {
            "file": {"type": "string", "format": "binary", "description": "a PCM WAV, <= 600 s"},
            "model": _MODEL_ID,
            "language": {"type": "string", "maxLength": 16},
            "prompt": {"type": "string", "maxLength": 4000},
            "response_format": {"enum": ["json", "text"], "default": "json"},
            "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        },
    }
    text = {
        "description": 'The transcript: `{"text"}`, or plain text with `response_format: text`',
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["text"],
                    "properties": {"text": {"type": "string"}},
                }
            },
            "text/plain": {"schema": {"type": "string"}},
        },
    }
    label = {
        "type": "object",
        "required": ["label", "score"],
        "properties": {"label": {"type": "string"}, "score": {"type": "number"}},
    }
    labelled = {
        "type": "object",
        "required": ["index", "labels"],
        "properties": {
            "index": {"type": "integer"},
            "labels": {"type": "array", "items": label},
        },
    }
    classes = {
        "description": "The labels of each text, best first (Werk's own shape)",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["object", "model", "data"],
                    "properties": {
                        "object": {"const": "list"},
                        "model": {"type": "string"},
                        "data": {"type": "array", "items": labelled},
                    },
                }
            }
        },
    }
    edit_form = {
        "type": "object",
        "required": ["image", "model", "prompt"],
        "properties": {
            "image": {"type": "string", "format": "binary", "description": "a PNG or JPEG"},
            "model": _MODEL_ID,
            "prompt": {"type": "string", "minLength": 1, "maxLength": 4000},
            "n": {"type": "integer", "minimum": 1, "maximum": 4, "default": 1},
            "size": {"type": "string", "default": "512x512", "pattern": IMAGE_SIZE_PATTERN},
            "response_format": {"enum": ["b64_json", "url"], "default": "b64_json"},
            "seed": {"type": "integer", "minimum": 0, "maximum": 4294967295},
            "steps": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
            "strength": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 0.8},
            "guidance_scale": {"type": "number", "minimum": 0, "maximum": 30, "default": 7.5},
            "negative_prompt": {"type": "string", "maxLength": 4000},
            "user": {"type": "string", "maxLength": 256},
        },
    }
    return {
        "/v1/images/edits": post(
            "Image to image from an uploaded PNG or JPEG with the model's media backend",
            "openai_images_edits",
            {"multipart/form-data": {"schema": edit_form}},
            images,
        ),
        "/v1/classifications": post(
            "Label texts with the model's text-classification backend (Werk's own route)",
            "werk_classifications",
            {"application/json": {"schema": classify}},
            classes,
        ),
        "/v1/images/generations": post(
            "Generate images with the model's media backend",
            "openai_images_generations",
            {"application/json": {"schema": image}},
            images,
        ),
        "/v1/audio/speech": post(
            "Speak text with the model's media backend",
            "openai_audio_speech",
            {"application/json": {"schema": speech}},
            audio,
        ),
        "/v1/audio/transcriptions": post(
            "Transcribe an uploaded WAV with the model's media backend",
            "openai_audio_transcriptions",
            {"multipart/form-data": {"schema": form}},
            text,
        ),
    }


def _job_paths(record: dict[str, Any], submit: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Durable media jobs (``record``/``submit`` are the schemas' references)."""

    def op(summary: str, op_id: str, ok: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "summary": summary,
            "operationId": op_id,
            "tags": ["openai"],
            "security": [{"bearer": []}],
            "responses": {"default": _OPENAI_ERROR, **ok},
            **extra,
        }

    one = {"200": {"description": "The job", "content": {"application/json": {"schema": record}}}}
    listing = {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": record}},
    }
    deleted = {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "job.deleted"},
            "deleted": {"const": True},
        },
    }
    path_id = [{"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    out_id = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
    accepted = {
        "202": {"description": "Queued", "content": {"application/json": {"schema": record}}}
    }
    return {
        "/v1/jobs": {
            "get": op(
                "Your jobs",
                "openai_jobs",
                {
                    "200": {
                        "description": "OK",
                        "content": {"application/json": {"schema": listing}},
                    }
                },
            ),
            "post": op(
                "Run a media request as a durable job",
                "openai_jobs_submit",
                accepted,
                requestBody={"required": True, "content": {"application/json": {"schema": submit}}},
            ),
        },
        "/v1/jobs/{job_id}": {
            "get": op("One of your jobs", "openai_job", one, parameters=path_id),
            "delete": op(
                "Cancel a job that has not finished (a queued one at once, a running one when "
                "its step ends): the record; delete a finished one with its output",
                "openai_job_cancel",
                {
                    "200": {
                        "description": "The cancelled job's record, or the deletion",
                        "content": {"application/json": {"schema": {"oneOf": [record, deleted]}}},
                    }
                },
                parameters=path_id,
            ),
        },
        "/v1/outputs/{id}": {
            "get": op(
                "Download a file one of your jobs produced",
                "openai_output",
                {
                    "200": {
                        "description": "The file, with its content type",
                        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
                    }
                },
                parameters=out_id,
            )
        },
    }


def _openai_paths() -> dict[str, dict[str, Any]]:
    """The OpenAI-compatible text routes Werk serves (request bodies up to 32 MiB)."""
    reply = {
        "description": "The backend's reply: a JSON object, or with `stream: true` Server-Sent "
        "Events of JSON chunks ending with `data: [DONE]`",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
    }
    messages = {"type": "array", "items": {"type": "object"}, "minItems": 1}
    prompt = {"type": "string"}
    embed_input = {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1}]}

    def completion(summary: str, op_id: str, required: str, schema: Any) -> dict[str, Any]:
        return {
            "post": {
                "summary": summary,
                "operationId": op_id,
                "tags": ["openai"],
                "security": [{"bearer": []}],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _openai_body(required, schema)}},
                },
                "responses": {"200": reply, "default": _OPENAI_ERROR},
            }
        }

    model: dict[str, Any] = {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string", "description": "the backend"},
        },
    }
    models = {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": model}},
    }
    return {
        "/v1/models": {
            "get": {
                "summary": "The models this server serves (OpenAI shape)",
                "operationId": "openai_models",
                "tags": ["openai"],
                "security": [{"bearer": []}],
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"application/json": {"schema": models}},
                    },
                    "default": _OPENAI_ERROR,
                },
            }
        },
        "/v1/models/{model_id}": {
            "get": {
                "summary": "One model this server serves (OpenAI shape)",
                "operationId": "openai_model",
                "tags": ["openai"],
                "security": [{"bearer": []}],
                "parameters": [
                    {"name": "model_id", "in": "path", "required": True, "schema": _MODEL_ID}
                ],
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"application/json": {"schema": model}},
                    },
                    "default": _OPENAI_ERROR,
                },
            }
        },
        "/v1/chat/completions": completion(
            "Chat completion through the model's backend",
            "openai_chat_completions",
            "messages",
            messages,
        ),
        "/v1/completions": completion(
            "Text completion through the model's backend", "openai_completions", "prompt", prompt
        ),
        "/v1/embeddings": completion(
            "Embeddings through the model's backend (never streamed)",
            "openai_embeddings",
            "input",
            embed_input,
        ),
    }


def openapi_document() -> dict[str, Any]:
    structs = sorted(
        {t for s in ROUTE_SPECS for t in (s.request, s.response) if t is not None}
        | {
            ErrorBody,
            ClassificationRequest,
            ImageGenerationRequest,
            SpeechRequest,
            JobRecord,
            JobRequest,
        },
        key=lambda t: t.__name__,
    )
    refs, components = msgspec.json.schema_components(structs, ref_template=_REF)
    ref_of = dict(zip(structs, refs, strict=True))
    for struct, rule in _CROSS_FIELD.items():
        _merge(components[struct.__name__], rule)
    error = {
        "description": "Werk error",
        "content": {"application/json": {"schema": ref_of[ErrorBody]}},
    }
    paths: dict[str, dict[str, Any]] = {}
    for spec in ROUTE_SPECS:
        params = [
            {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
            for n in _PARAM.findall(spec.path)
        ]
        params += [
            {"name": n, "in": "query", "required": spec.path == "/werk/v1/experts", "schema": s}
            for n, s in _QUERY.get(spec.path, [])
        ]
        ok_schema = (
            ref_of[spec.response]
            if spec.response
            else {
                "type": "object",
                "properties": {"status": {"type": "string"}},
                "required": ["status"],
            }
        )
        op: dict[str, Any] = {
            "summary": spec.summary,
            "operationId": spec.handler.__name__.strip("_"),
            "parameters": params,
            "responses": {
                "200": {
                    "description": "OK",
                    "content": {"application/json": {"schema": ok_schema}},
                },
                "default": error,
            },
        }
        if spec.request is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": ref_of[spec.request]}},
            }
        if spec.authenticated:
            op["security"] = [{"bearer": []}]
        else:
            op["security"] = []
        paths.setdefault(spec.path, {})[spec.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Werk Protocol",
            "version": PROTOCOL_VERSION,
            "x-werk-version": __version__,
        },
        "paths": {
            **paths,
            **_openai_paths(),
            **_media_paths(
                ref_of[ImageGenerationRequest],
                ref_of[SpeechRequest],
                ref_of[ClassificationRequest],
            ),
            **_job_paths(ref_of[JobRecord], ref_of[JobRequest]),
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
