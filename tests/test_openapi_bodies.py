"""The published OpenAPI document is no looser than the server's validation of the bodies Werk
checks itself: every body schemathesis generates from the document for the media routes and
``/v1/jobs`` passes the same decoding and ``validate()`` the routes run (no server needed:
the document and the validation are both in-process)."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from werk.http.openapi import openapi_document
from werk.http.requests import decode_body
from werk.protocol import InvalidRequest, JobRequest
from werk.protocol.media import (
    IMAGE_SIZE_PATTERN,
    ClassificationRequest,
    ImageGenerationRequest,
    SpeechRequest,
    image_dimensions,
)

SCHEMA = schemathesis.openapi.from_dict(
    msgspec.json.decode(msgspec.json.encode(openapi_document()))
)
BODIES: dict[str, Any] = {
    "/v1/images/generations": ImageGenerationRequest,
    "/v1/audio/speech": SpeechRequest,
    "/v1/classifications": ClassificationRequest,
    "/v1/jobs": JobRequest,
}
JOB_KINDS: dict[str, Any] = {
    "images.generations": ImageGenerationRequest,
    "audio.speech": SpeechRequest,
}


def _validate(path: str, body: Any) -> None:
    """What the route does with a JSON body before any model is involved."""
    parsed = decode_body(msgspec.json.encode(body), BODIES[path])
    if isinstance(parsed, JobRequest):
        inner = decode_body(msgspec.json.encode(parsed.request), JOB_KINDS[parsed.kind])
        inner.validate()
    else:
        parsed.validate()


@pytest.mark.parametrize("path", sorted(BODIES))
def test_every_body_the_document_allows_is_accepted(path: str) -> None:
    operation = SCHEMA[path]["post"]
    seen = 0

    @given(case=operation.as_strategy())
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    def check(case: Any) -> None:
        nonlocal seen
        seen += 1
        _validate(path, case.body)

    check()
    assert seen


@given(width=st.integers(0, 1100), height=st.integers(0, 1100))
def test_the_size_pattern_is_exactly_what_image_dimensions_accepts(width: int, height: int) -> None:
    size = f"{width}x{height}"
    matches = re.fullmatch(IMAGE_SIZE_PATTERN, size) is not None
    try:
        image_dimensions(size)
        accepted = True
    except InvalidRequest:
        accepted = False
    assert matches == accepted, size


def test_a_speech_format_that_is_not_offered_is_outside_the_document() -> None:
    speech = SCHEMA.raw_schema["components"]["schemas"]["SpeechRequest"]
    assert speech["properties"]["response_format"]["enum"] == ["wav"]
