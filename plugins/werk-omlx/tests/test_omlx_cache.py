"""The oMLX worker directories in ``werk cache`` (``werk_omlx.cache``), on directories laid out
as a worker leaves them: listed with their size (the model link not followed), active while
``worker.lock`` is held, purged without following links, refused while held."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from werk_omlx import cache

import werk


def _worker_dir(home: Path, key: str, model_dir: Path) -> Path:
    base = home / "backends" / "omlx" / "workers" / key
    (base / "models").mkdir(parents=True)
    (base / "models" / "tiny").symlink_to(model_dir, target_is_directory=True)
    (base / "cache" / "prefix-cache").mkdir(parents=True)
    (base / "cache" / "prefix-cache" / "a.safetensors").write_bytes(b"x" * 1000)
    (base / "worker.json").write_text(
        json.dumps({"model": "tiny", "prefix_cache": True, "started_at": 1_800_000_000.0})
    )
    return base


def test_listing_counts_the_workers_files_not_the_model(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"w" * 50_000)
    base = _worker_dir(tmp_path / "home", "w_0123456789abcdef", weights)
    (base.parent / "not-a-worker").mkdir()
    (entry,) = cache.inventory(tmp_path / "home")
    assert entry.id == "w_0123456789abcdef" and entry.model == "tiny"
    record = (base / "worker.json").stat().st_size
    assert entry.bytes == 1000 + record
    assert entry.created_at == 1_800_000_000.0 and entry.active is False
    assert "prefix cache (4 GB bound)" in entry.description


def test_a_held_directory_is_active_and_purge_refuses_it(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"w")
    home = tmp_path / "home"
    base = _worker_dir(home, "w_aaaaaaaaaaaaaaaa", weights)
    fd = os.open(base / "worker.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        (entry,) = cache.inventory(home)
        assert entry.active is True
        with pytest.raises(werk.Conflict, match="is running"):
            cache.purge(home, "w_aaaaaaaaaaaaaaaa")
        assert base.is_dir()
    finally:
        os.close(fd)
    assert cache.purge(home, "w_aaaaaaaaaaaaaaaa") is True
    assert not base.exists()
    assert (weights / "model.safetensors").read_bytes() == b"w"  # the link was not followed
    assert cache.purge(home, "w_aaaaaaaaaaaaaaaa") is False
    assert cache.purge(home, "../outside") is False
