"""A Hugging Face Hub file downloaded into the standard cache so that an interrupted download
resumes where it stopped the next time.

huggingface_hub (2.x) downloads a file into a per-process temporary file and deletes it when the
download fails, so after Ctrl+C the next ``hf_hub_download`` starts that file from its first
byte. For a model of several gigabytes that is the difference between resuming and starting
over. Werk therefore fetches each file's bytes itself, with the client's own pieces: the file's
metadata (``get_hf_file_metadata``: its ETag, size, commit and final URL, ``HF_ENDPOINT`` and
``HF_TOKEN`` honoured), its download function (``file_download.http_get``: ``Range``
requests, its retries and its progress bar) and the lock ``hf_hub_download`` takes for the same
file. The bytes go into ``<cache>/models--OWNER--REPO/blobs/<etag>.werk-partial``, which stays
when the download is interrupted; the next pull asks for the rest with ``Range``. A complete
file is checked against the hub's checksum (the ETag is the SHA-256 of a large file, the git
blob id of a small one), made durable and renamed to ``blobs/<etag>``, exactly where
``hf_hub_download`` keeps it; that call then only links it into the snapshot. Deleting the
repository from the cache (``hf cache delete``) removes a partial file with it.

A file whose checksum does not match is deleted (the next pull starts it afresh) and the pull
fails; so is a partial file longer than the file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

from ._fs import fsync_directory, fsync_file
from .protocol import InsufficientStorage, Unavailable

__all__ = ["PARTIAL_SUFFIX", "fetch_resumable"]

PARTIAL_SUFFIX = ".werk-partial"


def fetch_resumable(hub: ModuleType, repo: str, filename: str, revision: str | None) -> None:
    """Make sure ``filename`` of ``repo`` is in the cache's blob store, resuming a partial
    download (progress bar on stderr). Returns at once when the blob is there already.

    :param hub: the imported ``huggingface_hub`` module.
    :raises werk.Unavailable: the downloaded bytes do not match the hub's checksum.
    :raises werk.InsufficientStorage: the cache's file system has no room for the rest.
    """
    from huggingface_hub import constants
    from huggingface_hub.file_download import http_get, repo_folder_name
    from huggingface_hub.utils import (  # type: ignore[attr-defined]  # lazily exported
        WeakFileLock,
        build_hf_headers,
    )

    meta = hub.get_hf_file_metadata(hub.hf_hub_url(repo, filename, revision=revision))
    if meta.etag is None or meta.size is None or meta.location is None:
        return  # hf_hub_download reports what is missing
    folder = repo_folder_name(repo_id=repo, repo_type="model")
    blob = Path(constants.HF_HUB_CACHE) / folder / "blobs" / meta.etag
    if blob.exists():
        return
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = Path(constants.HF_HUB_CACHE) / ".locks" / folder / f"{meta.etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    partial = blob.with_name(blob.name + PARTIAL_SUFFIX)
    with WeakFileLock(str(lock)):  # the lock hf_hub_download takes for this blob
        if blob.exists():
            return
        have = partial.stat().st_size if partial.exists() else 0
        if have > meta.size:
            partial.unlink()
            have = 0
        free = shutil.disk_usage(blob.parent).free
        if meta.size - have > free:
            raise InsufficientStorage(
                f"{filename} needs {meta.size - have} more bytes in {blob.parent}, "
                f"which has {free} free"
            )
        name = Path(filename).name
        if have:
            print(f"resuming {name} at {have} of {meta.size} bytes", file=sys.stderr)
        with partial.open("ab") as out:
            http_get(
                meta.location,
                out,
                resume_size=have,
                headers=build_hf_headers(),
                expected_size=meta.size,
                displayed_filename=name,
            )
            out.flush()
            fsync_file(out.fileno())
        if not _matches(partial, meta.etag, meta.size):
            partial.unlink(missing_ok=True)
            raise Unavailable(
                f"{filename} did not match the hub's checksum; the download was discarded, "
                "run the pull again",
                retryable=True,
            )
        os.replace(partial, blob)
        fsync_directory(blob.parent)


def _matches(path: Path, etag: str, size: int) -> bool:
    """Whether ``path`` has ``size`` bytes and, when the ETag is a content hash (SHA-256 for a
    large file, the git blob id for a small one), that hash."""
    if path.stat().st_size != size:
        return False
    if len(etag) == 64:
        digest = hashlib.sha256()
    elif len(etag) == 40:
        digest = hashlib.sha1(usedforsecurity=False)
        digest.update(b"blob %d\0" % size)
    else:
        return True  # an ETag that is not a content hash: the size is what can be checked
    with path.open("rb") as data:
        return hashlib.file_digest(data, lambda: digest).hexdigest() == etag.lower()
