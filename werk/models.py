"""The model registry: manifests under ``WERK_HOME/models/<id>.json``.

A manifest records the model's files with their sizes and SHA-256 digests; the model's
*identity* is a hash over those. Re-importing changed files under the same id yields a new
identity, so every runtime key (and every state's compatibility envelope) changes with it.
Files are referenced in place, never copied: weights can be gigabytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from ._fs import replace_private_file
from .backends import ModelSpec
from .protocol import InvalidRequest, NotFound

__all__ = [
    "ModelFile",
    "ModelManifest",
    "ModelRegistry",
    "identity_of",
    "model_files",
    "validate_model_id",
]

MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MANIFEST_SCHEMA = 1
_CHUNK = 1024 * 1024
_MAX_MANIFEST_BYTES = 1024 * 1024
DEMO_FILE_RECORD_SUFFIX = ".demo.json"
"""What a demo generator records beside a generated file (``demo.gguf.demo.json``)."""
DEMO_FOLDER_RECORD = "werk-demo.json"
"""What a demo generator records in a generated model folder."""


def validate_model_id(model_id: str) -> str:
    if not MODEL_ID.match(model_id) or ".." in model_id:
        raise InvalidRequest(
            f"model id {model_id!r} must be 1-128 characters of letters, digits, '.', '_', '-'"
        )
    return model_id


class ModelFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: str
    size: int
    sha256: str


class ModelManifest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    schema: int
    id: str
    backend: str
    files: tuple[ModelFile, ...]
    identity: str
    created_at: str
    options: dict[str, Any] = {}

    def spec(self) -> ModelSpec:
        return ModelSpec(
            id=self.id,
            backend=self.backend,
            identity=self.identity,
            files=tuple(Path(f.path) for f in self.files),
            options=dict(self.options),
        )


def _hash_file(path: Path, progress: Callable[[int], None] | None) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if progress is not None:
                progress(len(chunk))
    return size, digest.hexdigest()


def model_files(
    paths: list[Path], progress: Callable[[int], None] | None = None
) -> tuple[ModelFile, ...]:
    """Each path (absolute, ``~`` expanded) with its size and SHA-256 digest.

    :raises InvalidRequest: a path that is not a regular file.
    """
    files = []
    for raw in paths:
        path = raw.expanduser().absolute()
        if not path.is_file():
            raise InvalidRequest(f"{raw} is not a regular file")
        size, digest = _hash_file(path, progress)
        files.append(ModelFile(path=str(path), size=size, sha256=digest))
    return tuple(files)


def identity_of(files: tuple[ModelFile, ...]) -> str:
    """``sha256:`` over the ordered (name, size, digest) triples; paths do not matter."""
    digest = hashlib.sha256(b"werk/model-identity/v1\0")
    for f in files:
        for field in (Path(f.path).name, str(f.size), f.sha256):
            encoded = field.encode()
            digest.update(len(encoded).to_bytes(8, "big") + encoded)
    return "sha256:" + digest.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    """Publish ``data`` at ``path`` crash-safely (the store's own temp + fsync + rename)."""
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        replace_private_file(dir_fd, path.name, data)
    finally:
        os.close(dir_fd)


class ModelRegistry:
    """Reads and writes model manifests. Reads never create directories."""

    def __init__(self, home: Path) -> None:
        self.root = home / "models"

    def _path(self, model_id: str) -> Path:
        return self.root / f"{validate_model_id(model_id)}.json"

    def get(self, model_id: str) -> ModelManifest:
        path = self._path(model_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise NotFound(f"model {model_id!r} is not imported") from None
        except OSError as exc:
            raise NotFound(f"model {model_id!r} manifest is unreadable ({exc.strerror})") from None
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(_MAX_MANIFEST_BYTES + 1)
        try:
            if len(data) > _MAX_MANIFEST_BYTES:
                raise ValueError("manifest too large")
            manifest = msgspec.json.decode(data, type=ModelManifest)
        except (msgspec.DecodeError, ValueError) as exc:
            raise NotFound(f"model {model_id!r} has a corrupt manifest: {exc}") from None
        if manifest.id != model_id or manifest.schema != MANIFEST_SCHEMA:
            raise NotFound(f"model {model_id!r} manifest does not match its file name or schema")
        return manifest

    def manifests(self) -> list[ModelManifest]:
        if not self.root.is_dir():
            return []
        out = []
        for path in sorted(self.root.glob("*.json")):
            with contextlib.suppress(NotFound, InvalidRequest):
                out.append(self.get(path.stem))
        return out

    def import_files(
        self,
        paths: list[Path],
        *,
        model_id: str,
        backend: str,
        options: dict[str, Any] | None = None,
        progress: Callable[[int], None] | None = None,
        endpoint: bool = False,
        inspect: Callable[[ModelSpec], object] | None = None,
    ) -> ModelManifest:
        """Hash ``paths`` and record (or replace) the manifest for ``model_id``.

        :param inspect: called with the would-be model before the manifest is written; what it
            raises (the backend's :class:`InvalidRequest` for files it cannot load) leaves the
            registry as it was.

        :param endpoint: the backend serves a separately operated endpoint; the model has no
            files (``paths`` must be empty) and its identity is that of the empty file list.
        """
        validate_model_id(model_id)
        if not paths and not endpoint:
            raise InvalidRequest("a model needs at least one file")
        if paths and endpoint:
            raise InvalidRequest("an endpoint model has no files")
        files = model_files(paths, progress)
        manifest = ModelManifest(
            schema=MANIFEST_SCHEMA,
            id=model_id,
            backend=backend,
            files=files,
            identity=identity_of(files),
            created_at=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            options=options or {},
        )
        if inspect is not None:
            inspect(manifest.spec())
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        _atomic_write(self._path(model_id), msgspec.json.encode(manifest))
        return manifest

    def remove(self, model_id: str) -> ModelManifest:
        manifest = self.get(model_id)
        self._path(model_id).unlink()
        return manifest

    @property
    def files_root(self) -> Path:
        """Where Werk writes model files itself (generated demos): ``WERK_HOME/models/files``."""
        return self.root / "files"

    def owned_files(self, manifest: ModelManifest) -> tuple[list[Path], list[Path]]:
        """``manifest``'s files split into those removing the model may delete (Werk wrote them
        under :attr:`files_root` and no other manifest references them) and those it keeps
        (referenced in place, or shared with another model)."""
        owned_root = self.files_root.resolve()
        others = {
            Path(f.path).resolve()
            for other in self.manifests()
            if other.id != manifest.id
            for f in other.files
        }
        delete: list[Path] = []
        keep: list[Path] = []
        for f in manifest.files:
            path = Path(f.path)
            real = path.resolve()
            mine = real.is_relative_to(owned_root) and not path.is_symlink()
            (delete if mine and real not in others else keep).append(path)
        return delete, keep

    def delete_files(self, paths: list[Path]) -> None:
        """Delete ``paths`` (from :meth:`owned_files`) with the records the demo generators
        keep beside them (``<file>.demo.json``; ``werk-demo.json`` in a model folder), and the
        folders under :attr:`files_root` they leave empty. A file already gone is not an
        error."""
        root = self.files_root.resolve()
        for path in paths:
            for gone in (path, path.with_name(path.name + DEMO_FILE_RECORD_SUFFIX)):
                with contextlib.suppress(FileNotFoundError):
                    gone.unlink()
            parent = path.resolve().parent
            while parent != root and parent.is_relative_to(root):
                if [p.name for p in parent.iterdir()] == [DEMO_FOLDER_RECORD]:
                    (parent / DEMO_FOLDER_RECORD).unlink()
                try:
                    parent.rmdir()
                except OSError:  # not empty (or gone): stop climbing
                    break
                parent = parent.parent

    def verify_unchanged(self, manifest: ModelManifest) -> None:
        """Cheap check (size) that the referenced files still exist as imported.

        :raises NotFound: a file disappeared or changed size; re-import to get a new identity.
        """
        for f in manifest.files:
            try:
                size = Path(f.path).stat().st_size
            except OSError:
                raise NotFound(
                    f"model {manifest.id!r}: file {Path(f.path).name} is missing"
                ) from None
            if size != f.size:
                raise NotFound(
                    f"model {manifest.id!r}: {Path(f.path).name} changed since import; "
                    "run `werk models import` again"
                )
