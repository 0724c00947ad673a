"""``werk models pull hf:OWNER/REPO[:FILE_OR_QUANT]``: download from the Hugging Face Hub with
its own client (``huggingface_hub``: the standard cache, resumable downloads, ``HF_TOKEN`` and
``HF_ENDPOINT`` honoured, its byte/speed progress bars), then import the files from the cache.

A GGUF repository holds one file per quantisation: the selector picks one, by exact file name
or by a case-insensitive part of it (``Q4_K_M``); a split GGUF (``-00001-of-00003.gguf``)
downloads and imports every part (llama.cpp starts on the first). A repository without GGUF
files is a model directory (``config.json`` or ``model_index.json``) and is downloaded whole.
Nothing is imported until every file is complete. huggingface_hub retries a dropped connection
itself within the run; a pull stopped with Ctrl+C leaves no model, and the next pull resumes
the file it was downloading from the last byte written (:mod:`werk.hub_resume`). With
``HF_HUB_OFFLINE=1`` the file listing comes from the cache, so a cached repository is pulled
(imported) without the hub.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from .hub_resume import fetch_resumable
from .model_stores import cached_model_revisions, hub_client
from .protocol import InvalidRequest, NotFound, Unavailable, WerkError

__all__ = ["Pulled", "parse_source", "pull"]

_SOURCE = re.compile(r"^hf:([A-Za-z0-9][\w.-]*/[\w.-]+)(?::(.+))?$")
_TRANSPORT_MODULES = frozenset({"httpx", "httpx2", "requests", "urllib3", "httpcore"})
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


class Pulled(msgspec.Struct, frozen=True, kw_only=True):
    """What a pull downloaded: the paths to import (a file or the snapshot folder) and their
    format, and the id it suggests."""

    paths: tuple[str, ...]
    format: str
    suggested_id: str


def parse_source(source: str) -> tuple[str, str | None]:
    """``hf:OWNER/REPO[:SELECTOR]`` as (repo, selector).

    :raises werk.InvalidRequest: another form."""
    match = _SOURCE.match(source)
    if match is None:
        raise InvalidRequest(
            f"{source!r} is not a model source; give hf:OWNER/REPO or hf:OWNER/REPO:QUANT "
            "(e.g. hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M)"
        )
    return match.group(1), match.group(2)


def _part(name: str) -> str | None:
    """The part number of a split GGUF's file name (``00001``), ``None`` for a whole file."""
    split = _SPLIT.search(name)
    return split.group(1) if split else None


def _pick_gguf(repo: str, ggufs: list[str], selector: str | None) -> list[str]:
    """The GGUF file(s) ``selector`` names: one file, or every part of one split file."""
    firsts = [f for f in ggufs if _part(f) in (None, "00001")]
    if selector is None:
        chosen = firsts if len(firsts) == 1 else []
    else:
        exact = [f for f in firsts if f == selector or Path(f).name == selector]
        chosen = exact or [f for f in firsts if selector.lower() in Path(f).name.lower()]
    if len(chosen) != 1:
        names = ", ".join(Path(f).name for f in firsts)
        what = "names no single file" if selector else "has several GGUF files"
        hint = f"hf:{repo}:{selector}" if selector else f"hf:{repo}"
        raise InvalidRequest(f"{hint} {what}; pick one with hf:{repo}:FILE_OR_QUANT ({names})")
    first = chosen[0]
    split = _SPLIT.search(first)
    if split is None:
        return [first]
    stem = first[: split.start()]
    return sorted(f for f in ggufs if f.startswith(stem) and _part(f) is not None)


def _cached_files(repo: str) -> list[str]:
    """The files of ``repo``'s latest cached revision (``HF_HUB_OFFLINE=1``: the hub is not
    asked)."""
    latest = cached_model_revisions().get(repo)
    if latest is None:
        raise NotFound(f"hf:{repo} is not in the Hugging Face cache, and HF_HUB_OFFLINE=1 is set")
    root = Path(latest.snapshot_path)
    return sorted(str(Path(f.file_path).relative_to(root)) for f in latest.files)


def pull(source: str, *, revision: str | None = None) -> Pulled:
    """Download ``source`` into the Hugging Face cache (progress on stderr).

    :raises werk.InvalidRequest: a bad source, or a selector that names no single file.
    :raises werk.NotFound: no such repository or revision.
    :raises werk.Unavailable: the hub could not be reached or a download failed (retry).
    """
    hub = hub_client()
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.hf_api import RepoFile

    repo, selector = parse_source(source)
    try:
        files = (
            _cached_files(repo)
            if constants.HF_HUB_OFFLINE
            else [
                entry.path
                for entry in hub.HfApi().list_repo_tree(repo, recursive=True, revision=revision)
                if isinstance(entry, RepoFile)
            ]
        )
        ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
        online = not constants.HF_HUB_OFFLINE
        if ggufs:
            paths = []
            for name in _pick_gguf(repo, ggufs, selector):
                if online:
                    fetch_resumable(hub, repo, name, revision)
                paths.append(hub.hf_hub_download(repo, name, revision=revision))
            first = Path(paths[0]).name
            suggested = re.sub(r"(-\d{5}-of-\d{5})?\.gguf$", "", first, flags=re.IGNORECASE)
            return Pulled(paths=tuple(paths), format="gguf", suggested_id=suggested)
        marker = "model_index.json" if "model_index.json" in files else "config.json"
        if marker not in files:
            raise InvalidRequest(f"{repo} holds no GGUF file, config.json or model_index.json")
        if selector is not None:
            raise InvalidRequest(f"{repo} is a model directory: pull it without :{selector}")
        if online:
            for name in files:
                fetch_resumable(hub, repo, name, revision)
        folder = hub.snapshot_download(repo, revision=revision)
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError) as exc:
        raise NotFound(f"hf:{repo}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    except WerkError:
        raise
    except (LocalEntryNotFoundError, OSError, HfHubHTTPError) as exc:
        raise Unavailable(
            f"hf:{repo} could not be downloaded ({type(exc).__name__}); run the pull again"
        ) from None
    except Exception as exc:
        # The client's transport errors (httpx, httpx2 or requests, by its version) share no
        # base with OSError; anything else is a defect and is raised as it is.
        if type(exc).__module__.split(".")[0] not in _TRANSPORT_MODULES:
            raise
        raise Unavailable(
            f"hf:{repo} could not be downloaded ({type(exc).__name__}); run the pull again"
        ) from None
    return Pulled(
        paths=(folder,),
        format="diffusers" if marker == "model_index.json" else "hf",
        suggested_id=repo.split("/")[-1],
    )
