"""How ``werk models pull`` reads its source and picks a GGUF file of a repository (the
download itself is tested against a hub stand-in in werk-llamacpp's tests)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from werk import InvalidRequest
from werk.hub_resume import _matches
from werk.model_pull import _pick_gguf, parse_source

REPO = "acme/Tiny-GGUF"
FILES = [
    "tiny-Q4_K_M.gguf",
    "tiny-Q4_K_S.gguf",
    "tiny-Q8_0.gguf",
    "big/tiny-F16-00001-of-00002.gguf",
    "big/tiny-F16-00002-of-00002.gguf",
]


@pytest.mark.parametrize(
    ("source", "parsed"),
    [
        ("hf:acme/Tiny-GGUF", ("acme/Tiny-GGUF", None)),
        ("hf:acme/Tiny-GGUF:Q4_K_M", ("acme/Tiny-GGUF", "Q4_K_M")),
        ("hf:acme/tiny.v2:sub/file.gguf", ("acme/tiny.v2", "sub/file.gguf")),
    ],
)
def test_sources(source: str, parsed: tuple[str, str | None]) -> None:
    assert parse_source(source) == parsed


@pytest.mark.parametrize(
    "source", ["acme/Tiny-GGUF", "hf:Tiny-GGUF", "hf:", "hf:a/b/c", "ollama:llama3"]
)
def test_other_sources_are_refused_with_the_form(source: str) -> None:
    with pytest.raises(InvalidRequest, match="give hf:OWNER/REPO"):
        parse_source(source)


def test_a_quantisation_picks_one_file_case_insensitively() -> None:
    assert _pick_gguf(REPO, FILES, "q8_0") == ["tiny-Q8_0.gguf"]
    assert _pick_gguf(REPO, FILES, "tiny-Q4_K_S.gguf") == ["tiny-Q4_K_S.gguf"]
    assert _pick_gguf(REPO, ["only.gguf"], None) == ["only.gguf"]


def test_a_split_file_brings_every_part() -> None:
    assert _pick_gguf(REPO, FILES, "F16") == [
        "big/tiny-F16-00001-of-00002.gguf",
        "big/tiny-F16-00002-of-00002.gguf",
    ]


@pytest.mark.parametrize(
    ("selector", "reason"),
    [(None, "has several GGUF files"), ("Q4_K", "names no single file"), ("Q2", "names no")],
)
def test_an_ambiguous_or_unknown_choice_lists_the_files(selector: str | None, reason: str) -> None:
    with pytest.raises(InvalidRequest, match=reason) as refused:
        _pick_gguf(REPO, FILES, selector)
    assert "tiny-Q4_K_M.gguf, tiny-Q4_K_S.gguf, tiny-Q8_0.gguf" in refused.value.message


@pytest.mark.parametrize("kind", ["sha256", "git-blob", "opaque"])
def test_a_finished_download_is_checked_against_the_etag_it_was_fetched_for(
    tmp_path: Path, kind: str
) -> None:
    """The hub's ETag is the SHA-256 of a large (LFS) file and the git blob id of a small one;
    any other ETag leaves the size as the only check."""
    data = b"weights" * 100
    etag = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "git-blob": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
        "opaque": "w/abc",
    }[kind]
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert _matches(path, etag, len(data))
    assert not _matches(path, etag, len(data) + 1)
    path.write_bytes(data[:-1] + b"X")
    assert _matches(path, etag, len(data)) is (kind == "opaque")
